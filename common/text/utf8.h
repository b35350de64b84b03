// UTF-8 decoding and validation (RFC 3629: no overlong forms, no surrogates, at most U+10FFFF).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace syncopate {

// Decodes the code point starting at s[0] (n bytes available). Returns its length in bytes
// (1..4) and stores it in *cp, or returns 0 when the bytes there are not valid UTF-8.
inline int utf8_decode(const unsigned char* s, size_t n, char32_t* cp) {
  const unsigned c = s[0];
  if (c < 0x80) return *cp = c, 1;
  int len;
  char32_t v, min;
  if ((c & 0xE0) == 0xC0) len = 2, v = c & 0x1F, min = 0x80;
  else if ((c & 0xF0) == 0xE0) len = 3, v = c & 0x0F, min = 0x800;
  else if ((c & 0xF8) == 0xF0) len = 4, v = c & 0x07, min = 0x10000;
  else return 0;
  if (n < static_cast<size_t>(len)) return 0;
  for (int i = 1; i < len; ++i) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (s[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

// Byte offset of the first invalid UTF-8 sequence in s, or std::string_view::npos if s is valid.
inline size_t utf8_invalid_at(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) { ++i; continue; }
    char32_t cp;
    const int len = utf8_decode(p + i, s.size() - i, &cp);
    if (len == 0) return i;
    i += static_cast<size_t>(len);
  }
  return std::string_view::npos;
}

// Appends the UTF-8 encoding of cp to out.
inline void utf8_append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace syncopate
