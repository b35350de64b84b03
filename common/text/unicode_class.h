// The character classes GPT-2's pre-tokenization pattern distinguishes: letters (\p{L}), numbers
// (\p{N}), white space (\s, the Unicode White_Space property) and everything else.
#pragma once
#include <cstdint>

namespace syncopate {

enum class CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

// Class of one code point. Tables: common/text/unicode_tables.inc (scripts/gen_unicode_tables.py).
CharClass char_class(char32_t cp);

}  // namespace syncopate
