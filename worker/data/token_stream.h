// The trainer's view of a tokenized corpus: one long stream of token ids, memory-mapped in place
// (never read into RAM), from either
//   - a Megatron-LM indexed dataset (PREFIX.bin + PREFIX.idx, uint16 or int32 ids), or
//   - a flat file of little-endian uint16 ids (nanoGPT's / llm.c's train.bin).
// Documents follow each other in the stream, as GPT pretraining concatenates them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "common/data/indexed_dataset.h"

namespace syncopate {

class TokenStream {
 public:
  // Opens `path`: an indexed dataset when PATH.idx exists (or PATH is PREFIX.bin beside
  // PREFIX.idx), else a flat uint16 file. Throws syncopate::Error naming the file and the fault.
  static TokenStream open(const std::string& path);

  int64_t size() const { return end_ - begin_; }  // tokens
  // Copies tokens [offset, offset + n) of the stream into out.
  void copy(int64_t offset, int64_t n, int64_t* out) const;
  // Documents, when the format records them (indexed datasets); else 1.
  int64_t documents() const;
  // Token offset (in this stream) where document d starts; d == documents() gives size().
  int64_t document_start(int64_t d) const;
  // The tokens [begin, end) of this stream as a stream of its own (the documents inside it).
  TokenStream slice(int64_t begin, int64_t end) const;
  std::string describe() const;  // "PATH (indexed dataset, uint16, N tokens, D documents)"
  const std::string& path() const { return path_; }

 private:
  TokenStream() = default;
  std::string path_;
  std::shared_ptr<const IndexedDataset> index_;  // set for indexed datasets
  std::shared_ptr<const MappedFile> flat_;       // set for flat files
  const unsigned char* data_ = nullptr;
  TokenDtype dtype_ = TokenDtype::kUint16;
  int64_t begin_ = 0, end_ = 0;                  // token range of the underlying file
  int64_t first_doc_ = 0, docs_ = 1;             // documents whose start lies in the range
};

}  // namespace syncopate
