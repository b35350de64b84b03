// Megatron-LM's memory-mapped indexed dataset: PREFIX.bin holds the token ids of every sequence
// back to back; PREFIX.idx describes them:
//
//   "MMIDIDX\0\0"           9 bytes  magic
//   version                 u64 LE   1
//   dtype code              u8       4 = int32, 8 = uint16 (Megatron's DType codes)
//   sequence count S        u64 LE
//   document count D        u64 LE   (entries of document_indices = documents + 1)
//   sequence_lengths        S x i32  tokens per sequence
//   sequence_pointers       S x i64  byte offset of each sequence in .bin
//   document_indices        D x i64  0, then the sequence count after each document
//
// Syncopate writes one sequence per document (Megatron's preprocess_data.py without sentence
// splitting), so the .bin is the documents' tokens in order and readable by Megatron's reader.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/atomic_file.h"
#include "common/data/mapped_file.h"

namespace syncopate {

enum class TokenDtype : uint8_t { kInt32 = 4, kUint16 = 8 };

// Megatron's rule: uint16 when every id fits below 65500, else int32.
inline TokenDtype dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDtype::kUint16 : TokenDtype::kInt32;
}
inline size_t dtype_bytes(TokenDtype d) { return d == TokenDtype::kUint16 ? 2 : 4; }

// True if PREFIX.idx exists (PREFIX names an indexed dataset rather than a flat token file).
bool is_indexed_dataset(const std::string& prefix);

// Streams documents into PREFIX.bin / PREFIX.idx; both appear atomically at finish(). Dropping the
// writer unfinished leaves no file behind.
class IndexedDatasetWriter {
 public:
  IndexedDatasetWriter(const std::string& prefix, TokenDtype dtype);
  // Appends one document; throws if an id does not fit the dtype.
  void add_document(const int32_t* ids, size_t n);
  void finish();
  int64_t documents() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t tokens() const { return tokens_; }

 private:
  void flush();
  TokenDtype dtype_;
  AtomicFile bin_, idx_;
  std::vector<unsigned char> buf_;
  std::vector<int32_t> lengths_;
  int64_t tokens_ = 0;
};

// Reads an indexed dataset in place. The constructor validates the whole index (magic, version,
// dtype, counts against the file size, monotone pointers, document indices) and the .bin size
// against it, and throws syncopate::Error naming the file and the fault.
class IndexedDataset {
 public:
  explicit IndexedDataset(const std::string& prefix);

  TokenDtype dtype() const { return dtype_; }
  int64_t sequences() const { return sequences_; }
  int64_t documents() const { return documents_; }
  int64_t tokens() const { return tokens_; }
  // Token offset of the first token of document d (0 <= d <= documents()); documents are
  // contiguous, so document d spans [document_start(d), document_start(d + 1)).
  int64_t document_start(int64_t d) const;
  // Token ids of document d.
  std::vector<int32_t> document(int64_t d) const;
  // The .bin body: tokens() ids of dtype().
  const unsigned char* token_data() const { return bin_->data(); }
  const std::string& prefix() const { return prefix_; }

 private:
  int64_t doc_index(int64_t d) const;  // document_indices[d], read from the mapped index

  std::string prefix_;
  TokenDtype dtype_ = TokenDtype::kUint16;
  int64_t sequences_ = 0, documents_ = 0, tokens_ = 0;
  std::vector<int64_t> seq_start_;  // token offset of each sequence, plus the total at the end
  std::unique_ptr<MappedFile> idx_, bin_;
  const unsigned char* doc_index_ = nullptr;  // document_indices inside idx_ (unaligned)
};

}  // namespace syncopate
