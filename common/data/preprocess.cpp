#include "common/data/preprocess.h"

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <ostream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/splitmix64.h"
#include "common/data/indexed_dataset.h"
#include "common/text/utf8.h"

namespace fs = std::filesystem;

namespace syncopate {
namespace {

constexpr size_t kBlockBytes = 1 << 20;  // a unit of work: about 1 MB of input
constexpr int kReportedSkips = 5;        // skips described one by one; the rest only counted

bool is_json_lines(const fs::path& p) { return p.extension() == ".jsonl" || p.extension() == ".json"; }

std::vector<fs::path> expand_inputs(const std::vector<std::string>& inputs) {
  std::vector<fs::path> files;
  for (const auto& in : inputs) {
    SYN_CHECK(fs::exists(in), fmt::format("input '{}' does not exist", in), "check --input (files or directories)");
    if (fs::is_directory(in)) {
      std::vector<fs::path> found;
      for (auto it = fs::recursive_directory_iterator(in, fs::directory_options::skip_permission_denied);
           it != fs::recursive_directory_iterator(); ++it)
        if (it->is_regular_file() && it->path().filename().string().rfind('.', 0) != 0) found.push_back(it->path());
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.emplace_back(in);
    }
  }
  SYN_CHECK(!files.empty(), "no input files", "give --input a file or a directory that holds files");
  return files;
}

// One raw document (a JSON line or a whole text file) and where it came from.
struct RawDoc {
  std::string text;
  uint32_t file = 0;
  int64_t line = 0;  // 1-based line of a JSON Lines file; 0 for a text file
  int64_t ordinal = 0;
  bool json = false;
};

// What a block of documents became: per key and split, the ids and lengths of its documents.
struct Block {
  std::vector<RawDoc> docs;
  std::vector<std::vector<int32_t>> ids, lengths;  // index: key * 2 + valid
  int64_t invalid_utf8 = 0, empty = 0, bad_json = 0, missing_key = 0;
  std::vector<std::string> skip_notes;
  std::string error;  // strict mode: the first failure
};

// Reads documents in order, a block at a time.
class DocReader {
 public:
  DocReader(std::vector<fs::path> files, int64_t max_bytes) : files_(std::move(files)), max_bytes_(max_bytes) {}
  const fs::path& file(uint32_t i) const { return files_[i]; }
  int64_t bytes() const { return bytes_; }

  // Fills `b` with up to about kBlockBytes of documents; false when the input is exhausted.
  bool next(Block& b) {
    b.docs.clear();
    size_t got = 0;
    while (got < kBlockBytes && (max_bytes_ <= 0 || bytes_ < max_bytes_)) {
      if (!open_next()) break;
      RawDoc d;
      d.file = cur_;
      d.ordinal = ordinal_++;
      if (is_json_lines(files_[cur_])) {
        if (!std::getline(in_, d.text)) { in_.close(); continue; }
        d.json = true;
        d.line = ++line_;
        bytes_ += static_cast<int64_t>(d.text.size()) + 1;
        if (d.text.empty() || d.text == "\r") { --ordinal_; continue; }  // blank lines are not documents
      } else {
        std::stringstream ss;
        ss << in_.rdbuf();
        d.text = ss.str();
        in_.close();
        bytes_ += static_cast<int64_t>(d.text.size());
      }
      got += d.text.size();
      b.docs.push_back(std::move(d));
    }
    return !b.docs.empty();
  }

 private:
  bool open_next() {
    while (!in_.is_open()) {
      if (next_ >= files_.size()) return false;
      cur_ = static_cast<uint32_t>(next_++);
      line_ = 0;
      in_.open(files_[cur_], std::ios::binary);
      SYN_CHECK(in_.is_open(), fmt::format("cannot read input '{}'", files_[cur_].string()), "check its permissions");
    }
    return true;
  }
  std::vector<fs::path> files_;
  int64_t max_bytes_;
  std::ifstream in_;
  size_t next_ = 0;
  uint32_t cur_ = 0;
  int64_t line_ = 0, ordinal_ = 0, bytes_ = 0;
};

class BlockTokenizer {
 public:
  BlockTokenizer(const PreprocessConfig& c, const Tokenizer& tok, const DocReader& reader)
      : c_(c), tok_(tok), reader_(reader), valid_cut_(c.valid_fraction >= 1.0 ? UINT64_MAX
                                                                                 : static_cast<uint64_t>(c.valid_fraction * 18446744073709551616.0)) {}

  void run(Block& b) const {
    const size_t K = c_.json_keys.size();
    b.ids.assign(2 * K, {});
    b.lengths.assign(2 * K, {});
    b.invalid_utf8 = b.empty = b.bad_json = b.missing_key = 0;  // blocks are reused round after round
    b.skip_notes.clear();
    b.error.clear();
    for (const auto& d : b.docs) {
      const bool valid = c_.valid_fraction > 0 && splitmix64(d.ordinal ^ splitmix64(c_.split_seed)) < valid_cut_;
      if (const size_t bad = utf8_invalid_at(d.text); bad != std::string::npos) {
        skip(b, b.invalid_utf8, d, fmt::format("invalid UTF-8 at byte {}", bad));
        continue;
      }
      if (!d.json) {
        add(b, 0, valid, d, d.text);
        continue;
      }
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(d.text);
      } catch (const nlohmann::json::exception& e) {
        skip(b, b.bad_json, d, fmt::format("not JSON ({})", e.what()));
        continue;
      }
      if (!j.is_object()) {
        skip(b, b.bad_json, d, "not a JSON object");
        continue;
      }
      for (size_t k = 0; k < K; ++k) {
        auto it = j.find(c_.json_keys[k]);
        if (it == j.end() || !it->is_string()) {
          skip(b, b.missing_key, d, fmt::format("no string field \"{}\"", c_.json_keys[k]));
          continue;
        }
        add(b, k, valid, d, it->get_ref<const std::string&>());
      }
    }
  }

 private:
  void add(Block& b, size_t key, bool valid, const RawDoc& d, const std::string& text) const {
    if (text.empty()) {
      if (c_.warn_empty || c_.strict) skip(b, b.empty, d, "empty document");
      else ++b.empty;
      return;
    }
    auto& ids = b.ids[key * 2 + valid];
    const size_t before = ids.size();
    tok_.encode(text, ids);
    if (c_.append_eod) ids.push_back(static_cast<int32_t>(tok_.eod()));
    b.lengths[key * 2 + valid].push_back(static_cast<int32_t>(ids.size() - before));
  }
  void skip(Block& b, int64_t& counter, const RawDoc& d, const std::string& why) const {
    ++counter;
    const std::string where = d.line > 0 ? fmt::format("{}:{}", reader_.file(d.file).string(), d.line)
                                         : reader_.file(d.file).string();
    if (c_.strict && b.error.empty()) b.error = fmt::format("{}: {}", where, why);
    if (b.skip_notes.size() < kReportedSkips) b.skip_notes.push_back(fmt::format("{}: {}, skipped", where, why));
  }

  const PreprocessConfig& c_;
  const Tokenizer& tok_;
  const DocReader& reader_;
  uint64_t valid_cut_;
};

// Where one dataset's documents go.
class Sink {
 public:
  Sink(const std::string& name, const std::string& format, TokenDtype dtype) {
    if (format == "mmidx") writer_ = std::make_unique<IndexedDatasetWriter>(name, dtype);
    else flat_ = std::make_unique<AtomicFile>(name + ".bin");
    out_ = format == "mmidx" ? name : name + ".bin";
  }
  void add(const std::vector<int32_t>& ids, const std::vector<int32_t>& lengths) {
    if (writer_) {
      size_t at = 0;
      for (int32_t len : lengths) writer_->add_document(ids.data() + at, static_cast<size_t>(len)), at += static_cast<size_t>(len);
    } else {
      std::vector<uint16_t> buf(ids.size());
      for (size_t i = 0; i < ids.size(); ++i) {
        SYN_CHECK(ids[i] >= 0 && ids[i] < 65536, fmt::format("token id {} does not fit a flat uint16 file", ids[i]),
                  "use --output-format mmidx for vocabularies of 65536 ids or more");
        buf[i] = static_cast<uint16_t>(ids[i]);
      }
      flat_->write(buf.data(), buf.size() * 2);
    }
    docs_ += static_cast<int64_t>(lengths.size());
    tokens_ += static_cast<int64_t>(ids.size());
  }
  void finish() {
    if (writer_) writer_->finish();
    else flat_->commit();
  }
  int64_t docs_ = 0, tokens_ = 0;
  std::string out_;

 private:
  std::unique_ptr<IndexedDatasetWriter> writer_;
  std::unique_ptr<AtomicFile> flat_;
};

}  // namespace

std::string dataset_name(const std::string& prefix, const std::string& key, bool valid) {
  return fmt::format("{}_{}{}_document", prefix, valid ? "valid_" : "", key);
}

PreprocessStats preprocess(const PreprocessConfig& c, std::ostream& log) {
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  SYN_CHECK(!c.output_prefix.empty(), "no output prefix", "pass --output-prefix PATH");
  SYN_CHECK(!c.json_keys.empty(), "no JSON keys", "pass --json-keys text (or the fields holding the documents)");
  SYN_CHECK(c.format == "mmidx" || c.format == "flat", fmt::format("unknown output format '{}'", c.format),
            "use mmidx (Megatron .bin/.idx) or flat (uint16 .bin)");
  SYN_CHECK(c.valid_fraction >= 0 && c.valid_fraction < 1, fmt::format("validation fraction {} is outside [0, 1)", c.valid_fraction),
            "pass a fraction such as 0.01");
  SYN_CHECK(c.workers >= 1, fmt::format("--workers {} must be at least 1", c.workers), "pass --workers N");
  const auto tok = make_tokenizer(c.tokenizer);
  SYN_CHECK(!c.append_eod || tok->eod() >= 0, "--append-eod was given but the vocabulary has no <|endoftext|> token",
            "add <|endoftext|> to the vocabulary, or drop --append-eod");
  if (const fs::path parent = fs::path(c.output_prefix).parent_path(); !parent.empty()) fs::create_directories(parent);

  DocReader reader(expand_inputs(c.inputs), c.max_bytes);
  BlockTokenizer work(c, *tok, reader);
  std::vector<std::unique_ptr<Sink>> sinks;  // key * 2 + valid
  for (const auto& key : c.json_keys)
    for (bool valid : {false, true})
      sinks.push_back(valid && c.valid_fraction <= 0
                          ? nullptr
                          : std::make_unique<Sink>(dataset_name(c.output_prefix, key, valid), c.format,
                                                   dtype_for_vocab(tok->vocab_size())));

  PreprocessStats st;
  int notes = 0;
  auto last_report = t0;
  std::vector<Block> blocks(static_cast<size_t>(2 * c.workers));
  for (;;) {
    size_t n = 0;
    while (n < blocks.size() && reader.next(blocks[n])) ++n;
    if (n == 0) break;
    std::atomic<size_t> next{0};
    std::exception_ptr failure;
    std::mutex failure_mu;
    auto drain = [&] {
      for (size_t i; (i = next++) < n;) {
        try {
          work.run(blocks[i]);
        } catch (...) {
          std::lock_guard<std::mutex> lock(failure_mu);
          if (!failure) failure = std::current_exception();
        }
      }
    };
    std::vector<std::thread> threads;
    for (int w = 1; w < c.workers && static_cast<size_t>(w) < n; ++w) threads.emplace_back(drain);
    drain();
    for (auto& t : threads) t.join();
    if (failure) std::rethrow_exception(failure);
    for (size_t i = 0; i < n; ++i) {  // in input order: the output does not depend on --workers
      Block& b = blocks[i];
      SYN_CHECK(b.error.empty(), b.error, "fix the input, or drop --strict to skip and count such documents");
      for (const auto& note : b.skip_notes)
        if (notes++ < kReportedSkips) log << "[data] warning: " << note << "\n";
      st.skipped_invalid_utf8 += b.invalid_utf8, st.skipped_empty += b.empty;
      st.skipped_bad_json += b.bad_json, st.skipped_missing_key += b.missing_key;
      for (size_t s = 0; s < sinks.size(); ++s)
        if (sinks[s] && !b.lengths[s].empty()) sinks[s]->add(b.ids[s], b.lengths[s]);
    }
    const auto now = clock::now();
    if (c.progress_every_s > 0 && std::chrono::duration<double>(now - last_report).count() >= c.progress_every_s) {
      const double s = std::chrono::duration<double>(now - t0).count();
      log << fmt::format("[data] {:.1f} MB read, {:.1f} MB/s\n", reader.bytes() / 1e6, reader.bytes() / 1e6 / s) << std::flush;
      last_report = now;
    }
  }
  for (auto& s : sinks)
    if (s) st.documents += s->docs_, st.tokens += s->tokens_;
  SYN_CHECK(st.documents > 0, fmt::format("no document could be tokenized ({} skipped)", st.skipped()),
            "check the input format (--json-keys for JSON Lines) and the warnings above");
  for (auto& s : sinks)
    if (s) s->finish(), st.outputs.push_back(s->out_);
  st.bytes = reader.bytes();
  st.seconds = std::chrono::duration<double>(clock::now() - t0).count();
  const int64_t shown = std::min<int64_t>(notes, kReportedSkips);
  if (shown > 0 && st.skipped() > shown)
    log << fmt::format("[data] ... {} more skipped documents not shown\n", st.skipped() - shown);
  return st;
}

}  // namespace syncopate
