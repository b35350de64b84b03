// GPT-2's pre-tokenization pattern as a hand-written matcher (included by gpt2_bpe.h).
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// At each position the first alternative that matches wins, as in the backtracking regex.
#include "common/check.h"
#include "common/text/unicode_class.h"
#include "common/text/utf8.h"

namespace syncopate {

template <class F>
void Gpt2Bpe::pretokenize(std::string_view text, F&& emit) {
  // Decode once: byte offset and class of every code point (thread-local, reused).
  thread_local std::vector<uint32_t> off;
  thread_local std::vector<CharClass> cls;
  thread_local std::vector<char32_t> cps;
  off.clear(), cls.clear(), cps.clear();
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t i = 0; i < text.size();) {
    char32_t cp;
    const int len = utf8_decode(p + i, text.size() - i, &cp);
    SYN_CHECK(len > 0, fmt::format("invalid UTF-8 at byte {} of the text", i),
              "GPT-2 BPE encodes Unicode text; fix or drop the document (syncopate-data skips and counts it)");
    off.push_back(static_cast<uint32_t>(i));
    cls.push_back(char_class(cp));
    cps.push_back(cp);
    i += static_cast<size_t>(len);
  }
  const size_t n = cps.size();
  off.push_back(static_cast<uint32_t>(text.size()));
  auto run = [&](size_t k, CharClass c) {
    while (k < n && cls[k] == c) ++k;
    return k;
  };
  size_t i = 0;
  while (i < n) {
    size_t end = 0;
    if (cps[i] == U'\'' && i + 1 < n) {  // contractions
      const char32_t a = cps[i + 1], b = i + 2 < n ? cps[i + 2] : 0;
      if (a == U's' || a == U't' || a == U'm' || a == U'd') end = i + 2;
      else if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) end = i + 3;
    }
    if (end == 0) {
      const size_t j = (cps[i] == U' ' && i + 1 < n) ? i + 1 : i;  // optional leading space
      const CharClass c = cls[j];
      if (c != CharClass::kSpace) {  // ' ?\p{L}+', ' ?\p{N}+' or ' ?[^\s\p{L}\p{N}]+'
        end = run(j, c);
      } else {  // white space: \s+(?!\S) leaves the last space to the next token, else \s+
        const size_t k = run(i, CharClass::kSpace);
        end = (k < n && k - i >= 2) ? k - 1 : k;
      }
    }
    emit(off[i], off[end]);
    i = end;
  }
}

}  // namespace syncopate
