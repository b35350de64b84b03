// Shape and regularisation of a GPT-2-style model. Plain struct, no torch.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace syncopate {

struct GPTConfig;
GPTConfig gpt_preset(const std::string& name);

struct GPTConfig {
  // Named starting point; setting it resets every field below to the preset's values.
  //   micro:       2 layers, 64 wide, 2 heads, 64 context, byte vocabulary (~0.12M params; the simulator's
  //                scale sweeps: hundreds of virtual workers on 2 cores)
  //   tiny:        2 layers, 128 wide, 4 heads, 128 context, byte vocabulary (~0.4M params)
  //   small:       4 layers, 256 wide, 8 heads, 256 context, byte vocabulary (~3.3M params)
  //   gpt2:        GPT-2 small, 124M: 12 layers, 768 wide, 12 heads, 1024 context, 50257 vocab
  //   gpt2-medium: 350M: 24 layers, 1024 wide, 16 heads, 1024 context, 50257 vocab
  std::string preset = "tiny";
  int64_t vocab_size = 257;   // tokens the tokenizer produces (byte level: 256 + end-of-document)
  int64_t block_size = 128;   // context length, tokens
  int64_t n_layer = 2;        // transformer blocks
  int64_t n_head = 4;         // attention heads; must divide n_embd
  int64_t n_embd = 128;       // residual stream width
  double dropout = 0.0;       // dropout probability on embeddings, attention and residuals
  bool qkv_bias = true;       // bias on the fused QKV projection (GPT-2 has one)
  std::string attention = "auto";  // "auto" (SDPA when LibTorch has it), "sdpa", "explicit"
  bool activation_checkpointing = false;  // recompute each block in backward to save memory

  // Embedding rows: vocab_size rounded up to a multiple of 64 (efficient kernels); the extra
  // rows stay zero, their logits are -inf, and they are dropped when exporting to Hugging Face.
  int64_t padded_vocab() const { return (vocab_size + 63) / 64 * 64; }

  template <class V>
  void fields(V& v) {
    v("preset", preset, "named model shape; resets the other model fields",
      std::vector<std::string>{"micro", "tiny", "small", "gpt2", "gpt2-medium"},
      [this] { *this = gpt_preset(preset); });
    v("vocab_size", vocab_size, "vocabulary size, tokens (padded to a multiple of 64 inside)", int64_t{2}, int64_t{1} << 20);
    v("block_size", block_size, "context length, tokens", int64_t{1}, int64_t{1} << 16);
    v("n_layer", n_layer, "number of transformer blocks", int64_t{1}, int64_t{512});
    v("n_head", n_head, "attention heads (must divide n_embd)", int64_t{1}, int64_t{1024});
    v("n_embd", n_embd, "model width", int64_t{1}, int64_t{1} << 16);
    v("dropout", dropout, "dropout probability", 0.0, 0.99);
    v("qkv_bias", qkv_bias, "bias on the QKV projection");
    v("attention", attention, "attention kernel", std::vector<std::string>{"auto", "sdpa", "explicit"});
    v("activation_checkpointing", activation_checkpointing, "recompute blocks in backward to save memory");
  }
};

// Returns the named preset; throws syncopate::Error for an unknown name.
GPTConfig gpt_preset(const std::string& name);

// Checks cross-field constraints (n_head divides n_embd, ...); throws with a hint.
void validate(const GPTConfig& c);

// Parameters of the model (tied LM head counted once).
int64_t gpt_num_params(const GPTConfig& c);
// Model FLOPs of training on one token (forward + backward): 6 N + 12 x layers x context x width
// (N = gpt_num_params; the attention term as in PaLM's MFU). MFU = tokens/s x this / peak FLOP/s.
double gpt_train_flops_per_token(const GPTConfig& c);

}  // namespace syncopate
