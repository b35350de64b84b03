// Turns a DataConfig into the train and validation token streams.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <regex>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "common/check.h"
#include "common/log.h"
#include "common/data/preprocess.h"
#include "common/fnv1a.h"
#include "worker/data/data_config.h"

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
  static const char* exts[] = {".py", ".txt", ".md", ".rst", ".json", ".jsonl"};
  for (auto e : exts)
    if (p.extension() == e) return true;
  return false;
}

// Tokens already: a dataset prefix, PREFIX.bin beside PREFIX.idx, or a flat .bin token file.
bool is_tokenized(const std::string& path) {
  if (is_indexed_dataset(path)) return true;
  return fs::path(path).extension() == ".bin" && fs::is_regular_file(path);
}

// Tokenizes raw text (a file or a directory) into a cached indexed dataset; returns its prefix.
std::string tokenize_cached(const DataConfig& c, const std::string& source, const Tokenizer& tok, bool verbose) {
  const std::string root = source == "system" ? system_corpus_dir() : source;
  SYN_CHECK(fs::exists(root), fmt::format("data source '{}' does not exist", root),
            "point data.corpus / data.train_file at text, a token file or a dataset prefix, or use 'system'");
  std::vector<fs::path> files;
  if (fs::is_regular_file(root)) {
    files.push_back(root);
  } else {
    for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied);
         it != fs::recursive_directory_iterator(); ++it)
      if (it->is_regular_file() && is_text_name(it->path())) files.push_back(it->path());
    std::sort(files.begin(), files.end());
  }
  SYN_CHECK(!files.empty(), fmt::format("no text files (*.py, *.txt, *.md, *.rst, *.json, *.jsonl) under '{}'", root),
            "point data.corpus at a directory that holds text");
  // The cache key: every input's path, size and modification time, the tokenizer, the options.
  std::ostringstream key;
  key << "v2|" << tok.name() << "|" << tok.fingerprint() << "|" << c.json_key << "|" << c.max_corpus_mb;
  for (const auto& f : files)
    key << "|" << fs::absolute(f).string() << ":" << fs::file_size(f) << ":"
        << fs::last_write_time(f).time_since_epoch().count();
  const fs::path dir = fs::path(c.cache_dir) / fmt::format("{}-{:016x}", tok.name(), fnv1a64(key.str()));
  const std::string prefix = (dir / "corpus").string(), out = dataset_name(prefix, c.json_key, false);
  if (is_indexed_dataset(out)) return out;

  if (verbose) log::info("[data] tokenizing {} files from {} ({}) ...", files.size(), root, tok.name());
  PreprocessConfig pc;
  for (const auto& f : files) pc.inputs.push_back(f.string());
  pc.output_prefix = prefix;
  pc.json_keys = {c.json_key};
  pc.tokenizer = c.tokenizer_config();
  pc.append_eod = tok.eod() >= 0;
  pc.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  pc.max_bytes = c.max_corpus_mb << 20;
  pc.warn_empty = false;  // empty files (__init__.py) are common in source trees: counted, not listed
  std::ostringstream report;
  const PreprocessStats st = preprocess(pc, report);
  if (verbose) {
    std::string r = report.str();
    if (!r.empty() && r.back() == '\n') r.pop_back();
    if (!r.empty()) log::info("{}", r);
    log::info("[data] {} documents, {:.1f} MB -> {} tokens in {:.1f} s ({} skipped) -> {}", st.documents, st.bytes / 1e6,
              st.tokens, st.seconds, st.skipped(), out);
  }
  return out;
}

TokenStream open_source(const DataConfig& c, const std::string& source, const Tokenizer& tok, bool verbose) {
  return TokenStream::open(is_tokenized(source) ? source : tokenize_cached(c, source, tok, verbose));
}

}  // namespace

TrainingData open_training_data(const DataConfig& c, const Tokenizer& tok, int64_t window, bool verbose) {
  const std::string source = c.train_file.empty() ? c.corpus : c.train_file;
  TokenStream all = open_source(c, source, tok, verbose);
  const int64_t need = window + 1;
  if (!c.val_file.empty()) {
    TrainingData d{all, open_source(c, c.val_file, tok, verbose)};
    SYN_CHECK(d.train.size() >= need && d.val.size() >= need,
              fmt::format("the training ({} tokens) or validation ({} tokens) data holds less than one window of {}",
                          d.train.size(), d.val.size(), need),
              "use more data or a shorter model.block_size");
    return d;
  }
  // Hold out the last val_fraction of the documents (of the tokens when there are too few
  // documents), keeping at least one window on each side.
  const int64_t n = all.size(), docs = all.documents();
  SYN_CHECK(n >= 2 * need,
            fmt::format("'{}' holds {} tokens: too few for a training and a validation window of {}", all.path(), n, need),
            "use a larger corpus, a shorter model.block_size, or give data.val_file");
  const int64_t val_docs = std::max<int64_t>(1, static_cast<int64_t>(docs * c.val_fraction + 0.5));
  int64_t cut = docs >= 2 && val_docs < docs ? all.document_start(docs - val_docs)
                                             : n - std::max<int64_t>(1, static_cast<int64_t>(n * c.val_fraction));
  cut = std::clamp(cut, need, n - need);
  TrainingData d{all.slice(0, cut), all.slice(cut, n)};
  if (verbose)
    log::info("[data] train: {}\n[data] val:   last {} tokens of it", d.train.describe(), d.val.size());
  return d;
}

}  // namespace syncopate
