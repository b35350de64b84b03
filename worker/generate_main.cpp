// syncopate-generate: samples text from a trained model.
//
//   syncopate-generate (--checkpoint DIR | --weights FILE.safetensors) [--prompt TEXT | --prompt-ids 1,2,3]
//                      [--max-new-tokens N] [--greedy | --temperature T --top-k K] [--print-ids]
//                      [--tokenizer-type gpt2-bpe --vocab-file vocab.json --merge-file merges.txt]
// The model shape is inferred from the weights (n_head from the file's metadata, the checkpoint's
// config, --n-head, or --preset), so most files need no shape flags.
#include <filesystem>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/text/tokenizer.h"
#include "common/check.h"
#include "common/config_schema.h"
#include "common/safetensors.h"
#include "model/generate.h"
#include "model/gpt.h"
#include "model/hf_weights.h"
#include "worker/checkpoint/checkpoint.h"

using namespace syncopate;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  CLI::App app{"syncopate-generate: sample from a Syncopate checkpoint or a GPT-2 safetensors file"};
  std::string checkpoint, weights, prompt = "\n", prompt_ids, preset;
  int64_t max_new = 200, top_k = 0, n_head = 0, seed = 0;
  double temperature = 1.0;
  bool greedy = false, print_ids = false;
  app.add_option("--checkpoint", checkpoint, "checkpoint directory (step_N, or a checkpoints/ root: uses latest)");
  app.add_option("--weights", weights, "model.safetensors in Hugging Face GPT-2 layout");
  TokenizerConfig tc;
  app.add_option("--prompt", prompt, "prompt text");
  app.add_option("--tokenizer-type", tc.type, "byte or gpt2-bpe (the run's data.tokenizer)")->capture_default_str();
  app.add_option("--vocab-file", tc.vocab_file, "gpt2-bpe vocab.json");
  app.add_option("--merge-file", tc.merge_file, "gpt2-bpe merges.txt");
  app.add_option("--prompt-ids", prompt_ids, "prompt as comma-separated token ids");
  app.add_option("--max-new-tokens", max_new, "tokens to generate")->check(CLI::Range(int64_t{0}, int64_t{1} << 20));
  app.add_flag("--greedy", greedy, "argmax decoding");
  app.add_option("--temperature", temperature, "sampling temperature")->check(CLI::PositiveNumber);
  app.add_option("--top-k", top_k, "sample among the k most likely tokens (0 = all)")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", seed, "sampling seed");
  app.add_option("--preset", preset, "model preset for fields the weights do not record");
  app.add_option("--n-head", n_head, "attention heads (not recorded in HF weights)");
  app.add_flag("--print-ids", print_ids, "print token ids instead of text");
  CLI11_PARSE(app, argc, argv);
  try {
    SYN_CHECK(checkpoint.empty() != weights.empty(), "give exactly one of --checkpoint and --weights",
              "e.g. --checkpoint runs/demo/checkpoints");
    GPTConfig base = preset.empty() ? GPTConfig{} : gpt_preset(preset);
    if (!checkpoint.empty()) {
      const std::string latest = latest_checkpoint(checkpoint);  // a checkpoints/ root: its newest step
      if (!latest.empty()) checkpoint = latest;
      weights = (fs::path(checkpoint) / "model.safetensors").string();
    }
    Safetensors st = load_safetensors(weights);
    GPTConfig cfg = infer_gpt_config(st, base);
    if (n_head > 0) cfg.n_head = n_head;
    cfg.dropout = 0.0;
    GPT model(cfg);
    load_hf_tensors(*model, st, weights);

    const auto tokenizer = make_tokenizer(tc);
    std::vector<int64_t> ids;
    if (!prompt_ids.empty()) {
      std::stringstream ss(prompt_ids);
      std::string tok;
      while (std::getline(ss, tok, ',')) {
        try {
          ids.push_back(std::stoll(tok));
        } catch (const std::exception&) {
          SYN_FAIL(fmt::format("--prompt-ids: '{}' is not an integer", tok), "write ids like 1,2,3");
        }
      }
    } else {
      SYN_CHECK(cfg.vocab_size >= tokenizer->vocab_size() || prompt.empty(),
                fmt::format("the {} tokenizer has {} ids but the model only {}", tokenizer->name(),
                            tokenizer->vocab_size(), cfg.vocab_size),
                "pass the run's tokenizer (--tokenizer-type, --vocab-file, --merge-file) or use --prompt-ids");
      for (int32_t id : tokenizer->encode(prompt)) ids.push_back(id);
    }
    SamplingOptions opt;
    opt.greedy = greedy;
    opt.temperature = temperature;
    opt.top_k = top_k;
    opt.seed = static_cast<uint64_t>(seed);
    auto out = generate(*model, ids, max_new, opt);
    if (print_ids) {
      for (size_t i = 0; i < out.size(); ++i) std::cout << (i ? "," : "") << out[i];
      std::cout << "\n";
    } else {
      std::cout << tokenizer->decode(out) << "\n";
    }
  } catch (const Error& e) {
    std::cerr << "syncopate-generate: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
