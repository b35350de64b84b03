// Text -> token datasets: what syncopate-data does and what the trainer runs once (cached) when
// its config points at raw text. Inputs are JSON Lines files (*.json, *.jsonl: one object per
// line, documents under `json_keys`) or plain text files (one document per file); directories
// expand to the regular files under them, sorted.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "common/text/tokenizer.h"

namespace syncopate {

struct PreprocessConfig {
  std::vector<std::string> inputs;             // files or directories, read in this order
  std::string output_prefix;                   // outputs are <prefix>_<key>_document.{bin,idx}
  std::vector<std::string> json_keys = {"text"};  // JSON fields tokenized, one dataset per key
  TokenizerConfig tokenizer;
  bool append_eod = false;   // end each document with the tokenizer's end-of-document id
  int workers = 1;           // tokenizing threads
  double valid_fraction = 0; // share of documents (by a hash of their ordinal) written to
                             // <prefix>_valid_<key>_document instead; 0 writes no validation set
  uint64_t split_seed = 1234;  // seed of that hash
  std::string format = "mmidx";  // "mmidx" (Megatron .bin + .idx) or "flat" (uint16 .bin only, nanoGPT)
  bool strict = false;       // a document that cannot be read is an error rather than a counted skip
  int64_t max_bytes = 0;     // stop after this many bytes of input (0: read everything)
  double progress_every_s = 0;  // seconds between progress lines on the log (0: none)
  bool warn_empty = true;    // describe empty documents on the log (they are counted either way)
};

struct PreprocessStats {
  int64_t documents = 0;         // documents written (over all keys, both splits)
  int64_t tokens = 0;            // tokens written
  int64_t bytes = 0;             // input bytes read
  int64_t skipped_invalid_utf8 = 0, skipped_empty = 0, skipped_bad_json = 0, skipped_missing_key = 0;
  double seconds = 0;
  std::vector<std::string> outputs;  // prefixes (mmidx) or files (flat) written
  int64_t skipped() const { return skipped_invalid_utf8 + skipped_empty + skipped_bad_json + skipped_missing_key; }
};

// Output names for a key: Megatron's "<prefix>_<key>_document" and the validation split's.
std::string dataset_name(const std::string& prefix, const std::string& key, bool valid);

// Tokenizes every document and writes the datasets atomically. Skips are reported on `log`
// (the first few with file:line) and counted; an error if nothing at all could be written.
PreprocessStats preprocess(const PreprocessConfig& config, std::ostream& log);

}  // namespace syncopate
