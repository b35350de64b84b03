#include "common/text/gpt2_bpe.h"

#include <atomic>
#include <fstream>
#include <queue>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/check.h"
#include "common/fnv1a.h"

namespace syncopate {
namespace {

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes
// for U+0100 onwards, so every byte is a visible character in vocab.json.
std::array<char32_t, 256> bytes_to_unicode() {
  std::array<char32_t, 256> m{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    m[static_cast<size_t>(b)] = printable ? static_cast<char32_t>(b) : next++;
  }
  return m;
}

std::string read_all(const std::string& path, const char* what, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  SYN_CHECK(in.good(), fmt::format("cannot open the {} '{}'", what, path),
            fmt::format("pass the file with {} (GPT-2's are vocab.json / merges.txt)", flag));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Most words repeat: each thread remembers the ids of the pieces it has encoded.
// Lookups by string_view, so that a hit (most pieces) allocates nothing.
struct PieceHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct PieceCache {
  uint64_t owner = 0;  // instance id of the tokenizer the entries belong to (an address could be reused)
  std::unordered_map<std::string, std::vector<int32_t>, PieceHash, std::equal_to<>> map;
};

}  // namespace

Gpt2Bpe::Gpt2Bpe(const std::string& vocab_file, const std::string& merge_file) {
  static std::atomic<uint64_t> instances{0};
  instance_ = ++instances;
  SYN_CHECK(!vocab_file.empty(), "the GPT-2 BPE tokenizer needs a vocabulary file",
            "pass --vocab-file vocab.json (data.vocab_file in a run config)");
  SYN_CHECK(!merge_file.empty(), fmt::format("vocabulary '{}' was given without its merges", vocab_file),
            "pass --merge-file merges.txt from the same tokenizer (data.merge_file in a run config)");
  const auto b2u = bytes_to_unicode();
  std::unordered_map<char32_t, int> u2b;
  for (int b = 0; b < 256; ++b) u2b[b2u[static_cast<size_t>(b)]] = b;

  // vocab.json: {"token": id, ...}; ids dense from 0.
  const std::string vtext = read_all(vocab_file, "vocabulary", "--vocab-file");
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(vtext);
  } catch (const nlohmann::json::exception& e) {
    SYN_FAIL(fmt::format("vocabulary '{}' is not valid JSON: {}", vocab_file, e.what()),
             "vocab.json must be one JSON object mapping token strings to ids");
  }
  SYN_CHECK(vocab.is_object() && !vocab.empty(), fmt::format("vocabulary '{}' is not a non-empty JSON object", vocab_file),
            "vocab.json must map token strings to ids");
  std::unordered_map<std::string, int32_t> id_of;
  int64_t max_id = -1;
  for (auto& [tok, v] : vocab.items()) {
    SYN_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (int64_t{1} << 31),
              fmt::format("vocabulary '{}': token '{}' has id {} (not a non-negative integer)", vocab_file, tok, v.dump()),
              "is this a GPT-2 vocab.json?");
    id_of[tok] = static_cast<int32_t>(v.get<int64_t>());
    max_id = std::max(max_id, v.get<int64_t>());
  }
  token_bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
  for (auto& [tok, id] : id_of) {  // a token's bytes: its characters mapped back through bytes_to_unicode
    std::string bytes;
    const auto* p = reinterpret_cast<const unsigned char*>(tok.data());
    bool byte_level = true;
    for (size_t i = 0; i < tok.size();) {
      char32_t cp;
      const int len = utf8_decode(p + i, tok.size() - i, &cp);
      auto it = len > 0 ? u2b.find(cp) : u2b.end();
      if (it == u2b.end()) { byte_level = false; break; }
      bytes.push_back(static_cast<char>(it->second));
      i += static_cast<size_t>(len);
    }
    token_bytes_[static_cast<size_t>(id)] = byte_level ? bytes : tok;  // added tokens decode as written
  }
  for (int b = 0; b < 256; ++b) {
    std::string sym;
    utf8_append(sym, b2u[static_cast<size_t>(b)]);
    auto it = id_of.find(sym);
    SYN_CHECK(it != id_of.end(), fmt::format("vocabulary '{}' has no symbol for byte 0x{:02X} ('{}')", vocab_file, b, sym),
              "a GPT-2 byte-level vocabulary holds all 256 byte symbols; was it trained as byte-level BPE?");
    byte_id_[b] = it->second;
  }
  if (auto it = id_of.find("<|endoftext|>"); it != id_of.end()) eod_ = it->second;

  // merges.txt: an optional "#version" line, then "left right" per line, highest priority first.
  const std::string mtext = read_all(merge_file, "merges", "--merge-file");
  std::istringstream lines(mtext);
  std::string line;
  int64_t lineno = 0, rank = 0;
  while (std::getline(lines, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if ((lineno == 1 && line.rfind("#version", 0) == 0) || line.empty()) continue;
    const size_t sp = line.find(' ');
    SYN_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < line.size() && line.find(' ', sp + 1) == std::string::npos,
              fmt::format("{}:{}: '{}' is not a merge (two tokens separated by one space)", merge_file, lineno, line),
              "use the merges.txt that belongs to this vocab.json");
    const std::string a = line.substr(0, sp), b = line.substr(sp + 1);
    auto ia = id_of.find(a), ib = id_of.find(b), im = id_of.find(a + b);
    SYN_CHECK(ia != id_of.end() && ib != id_of.end() && im != id_of.end(),
              fmt::format("{}:{}: merge '{}' names a token that '{}' does not have ('{}')", merge_file, lineno, line,
                          vocab_file, ia == id_of.end() ? a : ib == id_of.end() ? b : a + b),
              "vocab.json and merges.txt must come from the same tokenizer");
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) | static_cast<uint32_t>(ib->second);
    merge_.emplace(key, (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(im->second));  // first rank wins
    ++rank;
  }
  fingerprint_ = fnv1a64(vtext + "\n--merges--\n" + mtext);
}

void Gpt2Bpe::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  thread_local PieceCache cache;
  if (cache.owner != instance_) cache.owner = instance_, cache.map.clear();
  if (auto it = cache.map.find(piece); it != cache.map.end()) {
    out.insert(out.end(), it->second.begin(), it->second.end());
    return;
  }
  // Symbols in a doubly linked list; candidate merges in a min-heap by (rank, position). Stale
  // candidates (a side already merged away) are skipped when popped: O(n log n) for any length.
  struct Sym {
    int32_t id, prev, next;
  };
  const int32_t n = static_cast<int32_t>(piece.size());
  std::vector<Sym> s(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) s[i] = {byte_id_[static_cast<unsigned char>(piece[i])], i - 1, i + 1 < n ? i + 1 : -1};
  using Cand = std::pair<uint64_t, uint64_t>;  // (rank << 32 | left position, left id << 32 | right id)
  std::priority_queue<Cand, std::vector<Cand>, std::greater<>> heap;
  auto push = [&](int32_t l) {
    if (l < 0 || s[l].next < 0) return;
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(s[l].id)) << 32) | static_cast<uint32_t>(s[s[l].next].id);
    auto it = merge_.find(key);
    if (it != merge_.end()) heap.emplace(((it->second >> 32) << 32) | static_cast<uint32_t>(l), key);
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const auto [rank_pos, key] = heap.top();
    heap.pop();
    const int32_t l = static_cast<int32_t>(rank_pos & 0xFFFFFFFFu);
    if (s[l].id < 0 || s[l].next < 0) continue;  // merged away, or now the last symbol
    const int32_t r = s[l].next;
    if (((static_cast<uint64_t>(static_cast<uint32_t>(s[l].id)) << 32) | static_cast<uint32_t>(s[r].id)) != key) continue;
    s[l].id = static_cast<int32_t>(merge_.at(key) & 0xFFFFFFFFu);
    s[l].next = s[r].next;
    if (s[r].next >= 0) s[s[r].next].prev = l;
    s[r].id = -1;
    push(s[l].prev);
    push(l);
  }
  std::vector<int32_t> ids;
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = s[i].next) ids.push_back(s[i].id);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cache.map.size() > (1u << 18)) cache.map.clear();  // bounded memory on endless vocabularies
  cache.map.emplace(std::string(piece), std::move(ids));
}

void Gpt2Bpe::encode(std::string_view text, std::vector<int32_t>& out) const {
  pretokenize(text, [&](size_t b, size_t e) { bpe(text.substr(b, e - b), out); });
}

std::string Gpt2Bpe::decode(const std::vector<int64_t>& ids) const {
  std::string s;
  for (auto id : ids)
    if (id >= 0 && id < vocab_size()) s += token_bytes_[static_cast<size_t>(id)];
  return s;
}

}  // namespace syncopate
