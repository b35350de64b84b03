// Tokenizers: GPT-2 BPE against Hugging Face's GPT2TokenizerFast on a locally trained vocabulary,
// the pre-tokenization pattern, bad vocabularies, the byte tokenizer, UTF-8.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "common/check.h"
#include "common/text/byte_tokenizer.h"
#include "common/text/gpt2_bpe.h"
#include "common/text/utf8.h"
#include "tests/test_helpers.h"

using namespace syncopate;

namespace {

// Text with Unicode, numbers, contractions, runs of spaces, tabs, blank lines.
const char* kCorpus =
    "The quick brown fox jumps over the lazy dog. It's 2026, and we've seen 3.14159 apples.\n"
    "Don't you think they'll say \"naïve café\" is fine? I'm sure she'd agree; you're right.\n"
    "Ünïcödé text: 日本語のテキスト, 中文文本, русский текст, ελληνικά, עברית, العربية.\n"
    "Numbers: 1234567890 ١٢٣ ½ ⅔ Ⅻ 00042.   Multiple   spaces,\ttabs\t\tand\n\n\n"
    "  indented lines with trailing spaces   \n"
    "emoji 🙂🚀 and symbols ©®™ — “quotes” ‘single’ «guillemets» x\u00a0y\u3000z.\n"
    "def f(x):\n    return x ** 2  # code!\n    if x != 0: print('ok')\n";

// Trains the vocabulary once for the whole suite (tokenizers' ByteLevelBPETokenizer, ~600 ids).
class Gpt2BpeVsHf : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir;
    {
      std::ofstream f(dir_->str("corpus.txt"), std::ios::binary);
      for (int i = 0; i < 40; ++i) f << kCorpus;
    }
    const auto r = test::run_command(fmt::format("{} {}/tests/bpe_reference.py train {} {} 600 2>&1", SYNCOPATE_PYTHON,
                                                 SYNCOPATE_SOURCE_DIR, dir_->str("corpus.txt"), dir_->str("vocab")));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string vocab() { return dir_->str("vocab/vocab.json"); }
  static std::string merges() { return dir_->str("vocab/merges.txt"); }

  static nlohmann::json reference(const std::vector<std::string>& texts) {
    std::ofstream(dir_->str("texts.json")) << nlohmann::json(texts).dump();
    const auto r = test::run_command(fmt::format("{} {}/tests/bpe_reference.py encode {} {} 2>/dev/null", SYNCOPATE_PYTHON,
                                                 SYNCOPATE_SOURCE_DIR, dir_->str("vocab"), dir_->str("texts.json")));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return nlohmann::json::parse(r.output);
  }
  static test::TempDir* dir_;
};
test::TempDir* Gpt2BpeVsHf::dir_ = nullptr;

std::vector<std::string> test_texts() {
  std::vector<std::string> t;
  std::string line;
  std::istringstream in(kCorpus);
  while (std::getline(in, line)) t.push_back(line);
  t.push_back(kCorpus);
  for (const char* s : {"I'm here, you're there, he'll go, she'd say, it's OK'S 'S' ''s", "a  b   c    d\n\n\n  e \t\t f",
                        "   ", " ", "\n", "end   ", "'''s'''", "123abc456 7.8.9 ٣٤", "x\u00a0\u00a0y\u3000z\u2028w",
                        "unseen words: xylophone quizzical ǅ ǈ", "🙂🙂🙂🙂🙂🙂🙂🙂", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"})
    t.push_back(s);
  // Random strings over an alphabet chosen to stress the pattern's edges.
  const std::vector<std::string> alphabet = {"a", "b", "Z", " ", " ", "'", "s", "ll", "\n", "\t", ".", ",", "1", "٣",
                                             "é", "日", "🙂", "\u00a0", "\u3000", "-", "_", "Ⅻ"};
  std::mt19937 rng(7);
  for (int i = 0; i < 400; ++i) {
    std::string s;
    const int len = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < len; ++k) s += alphabet[rng() % alphabet.size()];
    t.push_back(s);
  }
  return t;
}

}  // namespace

TEST_F(Gpt2BpeVsHf, IdsEqualGpt2TokenizerFast) {
  Gpt2Bpe bpe(vocab(), merges());
  const auto texts = test_texts();
  const auto ref = reference(texts);
  ASSERT_EQ(ref["ids"].size(), texts.size());
  EXPECT_EQ(bpe.vocab_size(), ref["vocab_size"].get<int64_t>());
  EXPECT_EQ(bpe.eod(), ref["eod"].get<int64_t>());
  int mismatches = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<int32_t> ours = bpe.encode(texts[i]);
    std::vector<int32_t> theirs = ref["ids"][i].get<std::vector<int32_t>>();
    if (ours != theirs && ++mismatches <= 5) ADD_FAILURE() << "text " << i << ": " << nlohmann::json(texts[i]).dump();
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(bpe.merges(), 100u);
}

TEST_F(Gpt2BpeVsHf, DecodeIsTheInverseAndMatchesHf) {
  Gpt2Bpe bpe(vocab(), merges());
  const auto texts = test_texts();
  const auto ref = reference(texts);
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<int64_t> ids;
    for (int32_t id : bpe.encode(texts[i])) ids.push_back(id);
    EXPECT_EQ(bpe.decode(ids), texts[i]);
    EXPECT_EQ(bpe.decode(ids), ref["decoded"][i].get<std::string>());
  }
  EXPECT_EQ(bpe.decode({bpe.eod()}), "<|endoftext|>");
}

TEST_F(Gpt2BpeVsHf, InvalidUtf8IsAnErrorNamingTheByte) {
  Gpt2Bpe bpe(vocab(), merges());
  const std::string msg = test::error_of([&] { bpe.encode(std::string("ok \xff\xfe", 5)); });
  EXPECT_NE(msg.find("invalid UTF-8 at byte 3"), std::string::npos) << msg;
  EXPECT_NE(test::error_of([&] { bpe.encode("\xed\xa0\x80"); }), "");  // a surrogate
  EXPECT_NE(test::error_of([&] { bpe.encode("\xc0\xaf"); }), "");      // overlong '/'
}

TEST_F(Gpt2BpeVsHf, BadVocabulariesAreClearErrors) {
  test::TempDir d;
  EXPECT_NE(test::error_of([&] { Gpt2Bpe(vocab(), ""); }).find("without its merges"), std::string::npos);
  EXPECT_NE(test::error_of([&] { Gpt2Bpe(d.str("none.json"), merges()); }).find("cannot open the vocabulary"), std::string::npos);
  std::ofstream(d.str("bad.json")) << "{\"a\": 1,";
  EXPECT_NE(test::error_of([&] { Gpt2Bpe(d.str("bad.json"), merges()); }).find("not valid JSON"), std::string::npos);
  std::ofstream(d.str("small.json")) << "{\"a\": 0, \"b\": 1}";
  EXPECT_NE(test::error_of([&] { Gpt2Bpe(d.str("small.json"), merges()); }).find("has no symbol for byte 0x00"),
            std::string::npos);
  {
    std::ifstream in(merges());
    std::ofstream out(d.str("merges.txt"));
    out << in.rdbuf() << "zz qq\n";
  }
  const std::string msg = test::error_of([&] { Gpt2Bpe(vocab(), d.str("merges.txt")); });
  EXPECT_NE(msg.find("names a token that"), std::string::npos) << msg;
  EXPECT_NE(msg.find("merges.txt:"), std::string::npos) << msg;
  std::ofstream(d.str("m2.txt")) << "#version: 0.2\nonlyone\n";
  EXPECT_NE(test::error_of([&] { Gpt2Bpe(vocab(), d.str("m2.txt")); }).find("m2.txt:2"), std::string::npos);
}

// The pattern's documented behaviour, independent of any vocabulary.
TEST(Gpt2Pretokenize, SplitsLikeGpt2Pattern) {
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    Gpt2Bpe::pretokenize(s, [&](size_t b, size_t e) { out.push_back(s.substr(b, e - b)); });
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(split("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split("I'm he'll"), (V{"I", "'m", " he", "'ll"}));
  EXPECT_EQ(split("a  b"), (V{"a", " ", " b"}));     // \s+(?!\S) leaves one space to the word
  EXPECT_EQ(split("a\n\nb"), (V{"a", "\n", "\n", "b"}));
  EXPECT_EQ(split("x   "), (V{"x", "   "}));        // trailing spaces stay together
  EXPECT_EQ(split("abc123 456"), (V{"abc", "123", " 456"}));
  EXPECT_EQ(split("hi!! ?"), (V{"hi", "!!", " ?"}));
  EXPECT_EQ(split("日本 語"), (V{"日本", " 語"}));
  EXPECT_EQ(split(""), V{});
}

TEST(ByteTokenizer, IsLosslessOnAnyBytes) {
  ByteTokenizer t;
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  auto ids = t.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  std::vector<int64_t> wide(ids.begin(), ids.end());
  wide.push_back(ByteTokenizer::kEod);
  EXPECT_EQ(t.decode(wide), all);
  EXPECT_EQ(make_tokenizer({"byte", "", ""})->vocab_size(), 257);
  EXPECT_NE(test::error_of([] { make_tokenizer({"sentencepiece", "", ""}); }).find("unknown tokenizer type"), std::string::npos);
}

TEST(Utf8, ValidatesLikeRfc3629) {
  EXPECT_EQ(utf8_invalid_at("plain ascii"), std::string_view::npos);
  EXPECT_EQ(utf8_invalid_at("日本🙂"), std::string_view::npos);
  EXPECT_EQ(utf8_invalid_at("ab\x80"), 2u);                 // stray continuation byte
  EXPECT_EQ(utf8_invalid_at("ab\xe6\x97"), 2u);             // truncated sequence
  EXPECT_EQ(utf8_invalid_at("\xf4\x90\x80\x80"), 0u);       // above U+10FFFF
  std::string s;
  for (char32_t c : {U'a', U'é', U'日', U'🙂'}) utf8_append(s, c);
  EXPECT_EQ(s, "aé日🙂");
}
