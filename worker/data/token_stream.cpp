#include "worker/data/token_stream.h"

#include <algorithm>
#include <cstring>

#include "common/check.h"

namespace syncopate {

TokenStream TokenStream::open(const std::string& path) {
  TokenStream s;
  s.path_ = path;
  std::string prefix = path;
  if (prefix.size() > 4 && prefix.compare(prefix.size() - 4, 4, ".bin") == 0 &&
      is_indexed_dataset(prefix.substr(0, prefix.size() - 4)))
    prefix.resize(prefix.size() - 4);
  if (is_indexed_dataset(prefix)) {
    auto ds = std::make_shared<const IndexedDataset>(prefix);
    s.path_ = prefix;
    s.data_ = ds->token_data();
    s.dtype_ = ds->dtype();
    s.end_ = ds->tokens();
    s.docs_ = ds->documents();
    s.index_ = std::move(ds);
    return s;
  }
  auto f = std::make_shared<const MappedFile>(
      path, "data.train_file / data.val_file take a dataset prefix (PREFIX.idx + PREFIX.bin), a uint16 token file or text");
  SYN_CHECK(f->size() % 2 == 0,
            fmt::format("token file '{}' has {} bytes: not a whole number of uint16 tokens", path, f->size()),
            "a flat token file holds little-endian uint16 ids; an indexed dataset needs its .idx beside the .bin");
  s.data_ = f->data();
  s.end_ = static_cast<int64_t>(f->size() / 2);
  s.flat_ = std::move(f);
  return s;
}

void TokenStream::copy(int64_t offset, int64_t n, int64_t* out) const {
  SYN_CHECK(offset >= 0 && n >= 0 && offset + n <= size(),
            fmt::format("tokens [{}, {}) are outside the stream of {} tokens", offset, offset + n, size()), "");
  const int64_t at = begin_ + offset;
  if (dtype_ == TokenDtype::kUint16) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, data_ + 2 * (at + i), 2);
      out[i] = v;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      int32_t v;
      std::memcpy(&v, data_ + 4 * (at + i), 4);
      out[i] = v;
    }
  }
}

int64_t TokenStream::documents() const { return docs_; }

int64_t TokenStream::document_start(int64_t d) const {
  SYN_CHECK(d >= 0 && d <= docs_, fmt::format("document {} is outside 0..{}", d, docs_), "");
  if (!index_) return d == 0 ? 0 : size();
  if (d == docs_) return size();
  return std::clamp(index_->document_start(first_doc_ + d) - begin_, int64_t{0}, size());
}

TokenStream TokenStream::slice(int64_t begin, int64_t end) const {
  SYN_CHECK(begin >= 0 && begin <= end && end <= size(), fmt::format("slice [{}, {}) of {} tokens", begin, end, size()), "");
  TokenStream s = *this;
  s.begin_ = begin_ + begin;
  s.end_ = begin_ + end;
  if (index_) {  // documents starting inside the slice (the first may have begun before it)
    int64_t first = first_doc_, last = first_doc_ + docs_;
    while (first < last && index_->document_start(first) < s.begin_) ++first;
    int64_t stop = first;
    while (stop < last && index_->document_start(stop) < s.end_) ++stop;
    s.first_doc_ = first;
    s.docs_ = std::max<int64_t>(stop - first, 1);
  }
  return s;
}

std::string TokenStream::describe() const {
  return fmt::format("{} ({}, {}, {} tokens, {} documents)", path_, index_ ? "indexed dataset" : "flat token file",
                     dtype_ == TokenDtype::kUint16 ? "uint16" : "int32", size(), docs_);
}

}  // namespace syncopate
