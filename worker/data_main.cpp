// syncopate-data: tokenizes loose JSON Lines or text into Megatron-LM's indexed dataset
// (PREFIX_<key>_document.bin/.idx) or a flat uint16 token file (nanoGPT, llm.c). Flags mirror
// Megatron-LM's tools/preprocess_data.py where they mean the same thing:
//
//   syncopate-data --input corpus.jsonl --output-prefix data/my --json-keys text
//                  --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt
//                  --append-eod --workers 8 [--valid-fraction 0.01] [--output-format flat]
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>

#include "common/check.h"
#include "common/data/preprocess.h"

using namespace syncopate;

int main(int argc, char** argv) {
  CLI::App app{"syncopate-data: text or loose JSON -> Megatron .bin/.idx (or flat uint16) token datasets"};
  PreprocessConfig c;
  c.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));  // every core
  std::string impl = "mmap";
  double max_mb = 0;
  int log_interval_s = 2;
  app.add_option("--input", c.inputs, "JSON Lines files (*.json, *.jsonl), text files (one document each) or directories")
      ->required();
  app.add_option("--output-prefix", c.output_prefix, "output path prefix: PREFIX_<key>_document.{bin,idx}")->required();
  app.add_option("--json-keys", c.json_keys, "JSON fields to tokenize, one dataset each")->capture_default_str();
  app.add_option("--tokenizer-type", c.tokenizer.type, "byte or GPT2BPETokenizer (gpt2-bpe)")
      ->check(CLI::IsMember({"byte", "ByteTokenizer", "gpt2-bpe", "GPT2BPETokenizer"}))
      ->capture_default_str();
  app.add_option("--vocab-file", c.tokenizer.vocab_file, "GPT-2 vocab.json");
  app.add_option("--merge-file", c.tokenizer.merge_file, "GPT-2 merges.txt");
  app.add_flag("--append-eod", c.append_eod, "append the end-of-document token to every document");
  app.add_option("--workers", c.workers, "tokenizing threads")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--valid-fraction", c.valid_fraction,
                 "share of documents written to PREFIX_valid_<key>_document instead (0: no validation set)")
      ->check(CLI::Range(0.0, 0.999))
      ->capture_default_str();
  app.add_option("--seed", c.split_seed, "seed of the train/validation split")->capture_default_str();
  app.add_option("--output-format", c.format, "mmidx (Megatron .bin/.idx) or flat (uint16 .bin)")
      ->check(CLI::IsMember({"mmidx", "flat"}))
      ->capture_default_str();
  app.add_option("--dataset-impl", impl, "accepted for Megatron compatibility; only mmap")->check(CLI::IsMember({"mmap"}));
  app.add_flag("--strict", c.strict, "stop at the first unreadable document instead of skipping and counting it");
  app.add_option("--max-mb", max_mb, "read at most this many MB of input (0: all)")->check(CLI::NonNegativeNumber);
  app.add_option("--log-interval", log_interval_s, "seconds between progress lines (0: none)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  c.max_bytes = static_cast<int64_t>(max_mb * 1e6);
  c.progress_every_s = log_interval_s;
  try {
    const PreprocessStats st = preprocess(c, std::cerr);
    for (const auto& o : st.outputs) std::cout << "wrote " << o << "\n";
    std::cout << fmt::format("documents {} tokens {} input {:.2f} MB in {:.2f} s: {:.2f} MB/s with {} workers; "
                             "skipped {} (invalid UTF-8 {}, empty {}, not JSON {}, missing key {})\n",
                             st.documents, st.tokens, st.bytes / 1e6, st.seconds, st.bytes / 1e6 / std::max(st.seconds, 1e-9),
                             c.workers, st.skipped(), st.skipped_invalid_utf8, st.skipped_empty, st.skipped_bad_json,
                             st.skipped_missing_key);
  } catch (const Error& e) {
    std::cerr << "syncopate-data: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
