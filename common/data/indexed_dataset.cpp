#include "common/data/indexed_dataset.h"

#include <sys/stat.h>

#include <cstring>
#include <filesystem>

#include "common/check.h"

namespace syncopate {
namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;
constexpr size_t kFlushBytes = 4 << 20;

template <class T>
T load(const unsigned char* p) {  // the index's arrays are not aligned (the header is 34 bytes)
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
void append(std::vector<unsigned char>& out, T v) {
  const auto* p = reinterpret_cast<const unsigned char*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

const char* kRebuildHint = "the dataset is damaged or was written by another tool; rebuild it with syncopate-data";

}  // namespace

bool is_indexed_dataset(const std::string& prefix) { return std::filesystem::exists(prefix + ".idx"); }

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, TokenDtype dtype)
    : dtype_(dtype), bin_(prefix + ".bin"), idx_(prefix + ".idx") {
  buf_.reserve(kFlushBytes + (1 << 16));
}

void IndexedDatasetWriter::add_document(const int32_t* ids, size_t n) {
  SYN_CHECK(n < (size_t{1} << 31), fmt::format("a document of {} tokens is too long for the index (int32 lengths)", n),
            "split the document");
  const int64_t limit = dtype_ == TokenDtype::kUint16 ? 65535 : INT32_MAX;
  for (size_t i = 0; i < n; ++i) {
    SYN_CHECK(ids[i] >= 0 && ids[i] <= limit, fmt::format("token id {} does not fit the dataset's dtype", ids[i]),
              "a vocabulary of 65500 or more ids needs int32 (dtype_for_vocab)");
    if (dtype_ == TokenDtype::kUint16) append(buf_, static_cast<uint16_t>(ids[i]));
    else append(buf_, ids[i]);
  }
  lengths_.push_back(static_cast<int32_t>(n));
  tokens_ += static_cast<int64_t>(n);
  if (buf_.size() >= kFlushBytes) flush();
}

void IndexedDatasetWriter::flush() {
  bin_.write(buf_.data(), buf_.size());
  buf_.clear();
}

void IndexedDatasetWriter::finish() {
  flush();
  const size_t S = lengths_.size();
  std::vector<unsigned char> idx;
  idx.reserve(kHeaderBytes + S * (4 + 8 + 8) + 8);
  idx.insert(idx.end(), kMagic, kMagic + 9);
  append<uint64_t>(idx, 1);
  append<uint8_t>(idx, static_cast<uint8_t>(dtype_));
  append<uint64_t>(idx, S);
  append<uint64_t>(idx, S + 1);
  for (int32_t len : lengths_) append(idx, len);
  int64_t ptr = 0;
  for (int32_t len : lengths_) append(idx, ptr), ptr += static_cast<int64_t>(len) * static_cast<int64_t>(dtype_bytes(dtype_));
  for (size_t d = 0; d <= S; ++d) append(idx, static_cast<int64_t>(d));
  bin_.commit();  // the data first: an .idx never describes a .bin that is not there
  idx_.write(idx.data(), idx.size());
  idx_.commit();
}

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  const std::string ipath = prefix + ".idx", bpath = prefix + ".bin";
  idx_ = std::make_unique<MappedFile>(ipath, "give the dataset prefix (PREFIX for PREFIX.idx + PREFIX.bin)");
  const unsigned char* p = idx_->data();
  const size_t n = idx_->size();
  SYN_CHECK(n >= kHeaderBytes && std::memcmp(p, kMagic, 9) == 0,
            fmt::format("'{}' is not a Megatron indexed-dataset index ({} bytes, no MMIDIDX header)", ipath, n), kRebuildHint);
  const uint64_t version = load<uint64_t>(p + 9);
  SYN_CHECK(version == 1, fmt::format("'{}' has index version {}; only version 1 is known", ipath, version), kRebuildHint);
  const uint8_t code = p[17];
  SYN_CHECK(code == 4 || code == 8,
            fmt::format("'{}' stores tokens as dtype code {}; token datasets use 8 (uint16) or 4 (int32)", ipath, code),
            kRebuildHint);
  dtype_ = static_cast<TokenDtype>(code);
  const uint64_t S = load<uint64_t>(p + 18), D = load<uint64_t>(p + 26);
  // Checked in this order so that no product below can overflow.
  SYN_CHECK(S <= n && D <= n && D >= 1 && kHeaderBytes + S * 12 + D * 8 <= n,
            fmt::format("'{}' is truncated or corrupt: {} bytes cannot hold {} sequences and {} document indices", ipath, n,
                        S, D),
            kRebuildHint);
  const size_t expected = kHeaderBytes + S * 12 + D * 8;
  SYN_CHECK(n == expected || n == expected + S,  // + S: Megatron's optional per-sequence modes
            fmt::format("'{}' has {} bytes, but {} sequences and {} document indices need {}", ipath, n, S, D, expected),
            kRebuildHint);
  const unsigned char* lengths = p + kHeaderBytes;
  const unsigned char* pointers = lengths + S * 4;
  doc_index_ = pointers + S * 8;
  sequences_ = static_cast<int64_t>(S);
  documents_ = static_cast<int64_t>(D) - 1;
  seq_start_.resize(S + 1);
  const int64_t item = static_cast<int64_t>(dtype_bytes(dtype_));
  int64_t tok = 0;
  for (size_t i = 0; i < S; ++i) {
    const int32_t len = load<int32_t>(lengths + 4 * i);
    const int64_t ptr = load<int64_t>(pointers + 8 * i);
    SYN_CHECK(len >= 0 && ptr == tok * item,
              fmt::format("'{}': sequence {} has length {} at byte {}, expected a length >= 0 at byte {}", ipath, i, len,
                          ptr, tok * item),
              "Syncopate reads datasets whose sequences are stored back to back (as preprocess_data.py writes them)");
    seq_start_[i] = tok;
    tok += len;
  }
  seq_start_[S] = tok;
  tokens_ = tok;
  int64_t prev = -1;
  for (int64_t d = 0; d <= documents_; ++d) {
    const int64_t v = doc_index(d);
    SYN_CHECK(v >= 0 && v <= sequences_ && v >= prev && (d > 0 || v == 0) && (d < documents_ || v == sequences_),
              fmt::format("'{}': document index {} is {} (must rise from 0 to the sequence count {})", ipath, d, v,
                          sequences_),
              kRebuildHint);
    prev = v;
  }
  bin_ = std::make_unique<MappedFile>(bpath, "an indexed dataset needs both PREFIX.idx and PREFIX.bin");
  SYN_CHECK(static_cast<int64_t>(bin_->size()) == tokens_ * item,
            fmt::format("'{}' has {} bytes but its index '{}' describes {} tokens ({} bytes)", bpath, bin_->size(), ipath,
                        tokens_, tokens_ * item),
            "the .bin and .idx belong to different runs or a copy was cut short; rebuild with syncopate-data");
}

int64_t IndexedDataset::doc_index(int64_t d) const { return load<int64_t>(doc_index_ + 8 * static_cast<size_t>(d)); }

int64_t IndexedDataset::document_start(int64_t d) const {
  SYN_CHECK(d >= 0 && d <= documents_, fmt::format("document {} is outside 0..{}", d, documents_), "");
  return seq_start_[static_cast<size_t>(doc_index(d))];
}

std::vector<int32_t> IndexedDataset::document(int64_t d) const {
  SYN_CHECK(d >= 0 && d < documents_, fmt::format("document {} is outside 0..{}", d, documents_ - 1), "");
  const int64_t b = document_start(d), e = document_start(d + 1);
  std::vector<int32_t> out(static_cast<size_t>(e - b));
  const unsigned char* base = bin_->data();
  for (int64_t i = b; i < e; ++i)
    out[static_cast<size_t>(i - b)] =
        dtype_ == TokenDtype::kUint16 ? load<uint16_t>(base + 2 * i) : load<int32_t>(base + 4 * i);
  return out;
}

}  // namespace syncopate
