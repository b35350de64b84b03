// Turns a text corpus into byte-level train/validation token files (documents = files, split by
// a hash of the path so the split is stable however many files there are).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <regex>
#include <sstream>

#include <fmt/format.h>

#include "common/byte_tokenizer.h"
#include "common/check.h"
#include "worker/data_config.h"
#include "worker/token_file.h"

namespace fs = std::filesystem;

namespace syncopate {
namespace {

std::string system_corpus_dir() {
  // Highest /usr/lib/python3.N present: shipped with python3 on every Debian machine.
  std::string best;
  int best_minor = -1;
  std::regex re(R"(python3\.(\d+))");
  if (fs::exists("/usr/lib"))
    for (const auto& e : fs::directory_iterator("/usr/lib")) {
      std::smatch m;
      std::string name = e.path().filename().string();
      if (e.is_directory() && std::regex_match(name, m, re) && fs::exists(e.path() / "os.py")) {
        int minor = std::stoi(m[1]);
        if (minor > best_minor) best_minor = minor, best = e.path().string();
      }
    }
  SYN_CHECK(!best.empty(), "data.corpus=system but no /usr/lib/python3.N standard library was found",
            "install python3 (apt-get install python3) or set data.corpus to a directory of text");
  return best;
}

bool is_text_name(const fs::path& p) {
  static const char* exts[] = {".py", ".txt", ".md", ".rst"};
  for (auto e : exts)
    if (p.extension() == e) return true;
  return false;
}

}  // namespace

TokenFiles prepare_token_files(const DataConfig& c, bool verbose) {
  if (!c.train_file.empty()) {
    SYN_CHECK(!c.val_file.empty(), "data.train_file is set but data.val_file is not",
              "give a validation token file too (it may be the same file)");
    return {c.train_file, c.val_file};
  }
  const std::string root = c.corpus == "system" ? system_corpus_dir() : c.corpus;
  SYN_CHECK(fs::exists(root), fmt::format("data.corpus '{}' does not exist", root),
            "point data.corpus at a directory or file of text, or use 'system'");
  const std::string key = fmt::format("{:016x}", std::hash<std::string>{}(
      fmt::format("{}|{}|{}|v1", fs::absolute(root).string(), c.max_corpus_mb, c.val_fraction)));
  const fs::path dir = fs::path(c.cache_dir) / ("bytes-" + key);
  TokenFiles out{(dir / "train.bin").string(), (dir / "val.bin").string()};
  if (fs::exists(out.train) && fs::exists(out.val)) return out;

  std::vector<fs::path> files;
  if (fs::is_regular_file(root)) {
    files.push_back(root);
  } else {
    for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied);
         it != fs::recursive_directory_iterator(); ++it)
      if (it->is_regular_file() && is_text_name(it->path())) files.push_back(it->path());
    std::sort(files.begin(), files.end());
  }
  SYN_CHECK(!files.empty(), fmt::format("no text files (*.py, *.txt, *.md, *.rst) under '{}'", root),
            "point data.corpus at a directory that holds text");
  if (verbose) std::cout << fmt::format("[data] tokenizing {} files from {} (byte-level) ...\n", files.size(), root);

  std::vector<int64_t> train, val;
  const uint64_t budget = static_cast<uint64_t>(c.max_corpus_mb) << 20;
  const uint64_t val_every = static_cast<uint64_t>(1.0 / c.val_fraction + 0.5);
  uint64_t read = 0, docs = 0;
  for (const auto& f : files) {
    if (read >= budget) break;
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    if (text.empty()) continue;
    read += text.size();
    ++docs;
    auto& dst = (std::hash<std::string>{}(fs::relative(f, fs::is_regular_file(root) ? fs::path(root).parent_path() : fs::path(root)).string()) % val_every == 0) ? val : train;
    for (unsigned char ch : text) dst.push_back(ch);
    dst.push_back(ByteTokenizer::kEod);
  }
  if (val.empty() && !train.empty()) {  // tiny corpora: hold out the tail
    size_t cut = train.size() - std::max<size_t>(1, static_cast<size_t>(train.size() * c.val_fraction));
    val.assign(train.begin() + static_cast<std::ptrdiff_t>(cut), train.end());
    train.resize(cut);
  }
  fs::create_directories(dir);
  write_token_file(out.val, val.data(), static_cast<int64_t>(val.size()));
  write_token_file(out.train, train.data(), static_cast<int64_t>(train.size()));
  if (verbose)
    std::cout << fmt::format("[data] {} documents, {:.1f} MB: {} train / {} val tokens -> {}\n", docs,
                             read / 1e6, train.size(), val.size(), dir.string());
  return out;
}

}  // namespace syncopate
