#include "common/text/unicode_class.h"

#include <algorithm>
#include <array>
#include <iterator>

namespace syncopate {
namespace {

struct Range {
  char32_t first, last;
  uint8_t cls;
};

constexpr Range kRanges[] = {
#include "common/text/unicode_tables.inc"
};

// Unicode White_Space (PropList.txt), which \s matches in Oniguruma and Rust's regex.
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

CharClass lookup(char32_t c) {
  if (is_white_space(c)) return CharClass::kSpace;
  auto it = std::upper_bound(std::begin(kRanges), std::end(kRanges), c,
                             [](char32_t v, const Range& r) { return v < r.first; });
  if (it == std::begin(kRanges)) return CharClass::kOther;
  --it;
  return c <= it->last ? static_cast<CharClass>(it->cls) : CharClass::kOther;
}

// Latin-1 answers from a table: most text never reaches the binary search.
const std::array<CharClass, 256> kLatin1 = [] {
  std::array<CharClass, 256> t{};
  for (char32_t c = 0; c < 256; ++c) t[c] = lookup(c);
  return t;
}();

}  // namespace

CharClass char_class(char32_t cp) { return cp < 256 ? kLatin1[cp] : lookup(cp); }

}  // namespace syncopate
