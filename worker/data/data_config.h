// Where training and validation tokens come from, and how text becomes tokens.
#pragma once
#include <cstdint>
#include <string>

#include "common/text/tokenizer.h"
#include "worker/data/token_stream.h"

namespace syncopate {

struct DataConfig {
  // Tokens to train on. Each of corpus, train_file and val_file may be
  //   - a Megatron-LM indexed dataset prefix (PREFIX.bin + PREFIX.idx; syncopate-data writes them),
  //   - a flat uint16 token file (nanoGPT / llm.c "train.bin": no .idx beside it),
  //   - raw text: a JSON Lines file (*.json, *.jsonl; documents under json_key), a text file
  //     (one document), or a directory of *.py/*.txt/*.md/*.rst/*.json/*.jsonl files; tokenized
  //     with the tokenizer below on first use, into cache_dir.
  // corpus "system" is the Python standard library's sources (present wherever python3 is).
  std::string corpus = "system";
  std::string train_file = "";  // overrides corpus when set
  std::string val_file = "";    // "" holds out the last val_fraction of train's documents
  std::string cache_dir = "data/cache";  // where raw text is tokenized to (keyed by content and tokenizer)
  int64_t max_corpus_mb = 24;   // MB of raw text read at most (the system corpus has ~100 MB)
  double val_fraction = 0.05;   // share of documents held out for validation when val_file is ""
  std::string json_key = "text";  // JSON field that holds a document in JSON Lines input
  // Tokenizer for raw text and for text samples: "byte" (257 ids) or "gpt2-bpe" (vocab.json +
  // merges.txt, e.g. GPT-2's own: set model.vocab_size to 50257).
  std::string tokenizer = "byte";
  std::string vocab_file = "";  // gpt2-bpe: vocab.json
  std::string merge_file = "";  // gpt2-bpe: merges.txt

  template <class V>
  void fields(V& v) {
    v("corpus", corpus, "raw text or tokens when train_file is unset: 'system', a directory, a file or a dataset");
    v("train_file", train_file, "training tokens: dataset prefix, uint16 token file, or raw text (overrides corpus)");
    v("val_file", val_file, "validation tokens (same kinds); empty: hold out the last val_fraction of documents");
    v("cache_dir", cache_dir, "directory for tokenized raw text");
    v("max_corpus_mb", max_corpus_mb, "MB of raw text to read at most", int64_t{1}, int64_t{1} << 20);
    v("val_fraction", val_fraction, "fraction of documents held out for validation", 0.001, 0.5);
    v("json_key", json_key, "JSON field holding each document of a JSON Lines file");
    v("tokenizer", tokenizer, "byte | gpt2-bpe");
    v("vocab_file", vocab_file, "gpt2-bpe vocab.json");
    v("merge_file", merge_file, "gpt2-bpe merges.txt");
  }

  TokenizerConfig tokenizer_config() const { return {tokenizer, vocab_file, merge_file}; }
};

// The two token streams a run reads.
struct TrainingData {
  TokenStream train, val;
};

// Resolves the config to token streams: opens datasets and token files, tokenizes raw text once
// (cached, written atomically; concurrent workers on one machine may race harmlessly), and holds
// out validation documents. Every stream has at least one window of `window` tokens. Prints what
// it does to stdout when verbose.
TrainingData open_training_data(const DataConfig& c, const Tokenizer& tok, int64_t window, bool verbose);

}  // namespace syncopate
