// Where training and validation tokens come from.
#pragma once
#include <cstdint>
#include <string>

namespace syncopate {

struct DataConfig {
  // Text to train on when no token files are given: "system" (the Python standard library's
  // sources, present on every machine with python3), a directory (every *.py, *.txt, *.md, *.rst
  // file in it, recursively) or one text file. Tokenized with the byte tokenizer on first use.
  std::string corpus = "system";
  std::string train_file = "";      // uint16 token file; overrides corpus when set
  std::string val_file = "";        // uint16 token file for validation; required with train_file
  std::string cache_dir = "data/cache";  // where tokenized corpora are kept
  int64_t max_corpus_mb = 24;       // read at most this many MB of corpus text
  double val_fraction = 0.05;       // share of documents held out for validation

  template <class V>
  void fields(V& v) {
    v("corpus", corpus, "text corpus: 'system', a directory or a file (byte-tokenized, cached)");
    v("train_file", train_file, "uint16 token file for training (overrides corpus)");
    v("val_file", val_file, "uint16 token file for validation");
    v("cache_dir", cache_dir, "directory for tokenized corpora");
    v("max_corpus_mb", max_corpus_mb, "MB of corpus text to read at most", int64_t{1}, int64_t{1} << 20);
    v("val_fraction", val_fraction, "fraction of documents held out for validation", 0.001, 0.5);
  }
};

struct TokenFiles {
  std::string train, val;
};

// Resolves the config to a pair of token files, tokenizing (once, cached, atomically written)
// when it points at text. Prints what it does to stdout when verbose.
TokenFiles prepare_token_files(const DataConfig& c, bool verbose);

}  // namespace syncopate
