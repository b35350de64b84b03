// Moves GPT weights to and from Hugging Face GPT-2 safetensors files:
// names as in HF (with or without the "transformer." prefix), Conv1D weights ([in, out]) transposed,
// the padded embedding rows cropped on export and zero-filled on import.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/safetensors.h"
#include "model/gpt_config.h"

namespace syncopate {
class GPTImpl;

// Tensors in HF GPT-2 layout (no prefix, fp32, vocab_size rows of wte). copy = false: a tensor may
// share the live parameter's storage (fp32 on the CPU); true: every tensor is a host copy of its own.
std::vector<std::pair<std::string, at::Tensor>> to_hf_tensors(GPTImpl& model, bool copy = false);
// Copies weights from an HF-layout file into the model; throws naming the first missing or
// mis-shaped tensor (for example a checkpoint of another model shape).
void load_hf_tensors(GPTImpl& model, const Safetensors& st, const std::string& source);
// Infers vocab_size, block_size, n_layer, n_embd, qkv_bias from tensor shapes; n_head, dropout
// and attention come from `base` (they are not recorded in the weights).
GPTConfig infer_gpt_config(const Safetensors& st, GPTConfig base);

// The metadata model.safetensors carries (format, and the n_head / vocab_size the weights do not record).
std::map<std::string, std::string> hf_file_metadata(const GPTConfig& c);
// Convenience: save / load model.safetensors with metadata.
void save_model_safetensors(GPTImpl& model, const std::string& path);
void load_model_safetensors(GPTImpl& model, const std::string& path);

}  // namespace syncopate
