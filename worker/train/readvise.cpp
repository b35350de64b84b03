#include "worker/train/readvise.h"

#include <filesystem>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/log.h"
#include "worker/sync/gradient_sync.h"

namespace syncopate {
namespace fs = std::filesystem;
namespace {

constexpr int kBytesPerInt = 7;  // share_ints carries any int64 >= 0: 7 bytes each, 56 bits

std::string join(const nlohmann::json& list) {
  std::string s;
  if (!list.is_array()) return s;
  for (const auto& f : list)
    if (f.is_string()) {
      if (!s.empty()) s += ' ';
      s += f.get<std::string>();
    }
  return s;
}

// Node 0's text to every replica of the job: its length, then its bytes 7 to an integer.
std::string share_text(const std::string& text, bool source, const at::TensorOptions& options,
                       const std::function<void(at::Tensor&)>& job_sum) {
  std::vector<int64_t> n = {source ? static_cast<int64_t>(text.size()) : 0};
  share_ints(n, source, options, job_sum);
  std::vector<int64_t> v((n[0] + kBytesPerInt - 1) / kBytesPerInt, 0);
  if (source)
    for (size_t i = 0; i < text.size(); ++i)
      v[i / kBytesPerInt] |= static_cast<int64_t>(static_cast<unsigned char>(text[i])) << (8 * (i % kBytesPerInt));
  share_ints(v, source, options, job_sum);
  std::string out(static_cast<size_t>(n[0]), '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>((v[i / kBytesPerInt] >> (8 * (i % kBytesPerInt))) & 0xff);
  return out;
}

}  // namespace

std::string Readvise::pick_of(const std::string& advice_text) {
  nlohmann::json a;
  try {
    a = nlohmann::json::parse(advice_text);
  } catch (const nlohmann::json::exception&) {
    return "";
  }
  if (!a.is_object() || !a.contains("recommended") || !a["recommended"].is_object()) return "";
  const auto& r = a["recommended"];
  if (!r.contains("name") || !r["name"].is_string()) return "";
  std::string pick = r["name"].get<std::string>();
  const std::string worker = join(r.value("worker_flags", nlohmann::json::array()));
  const std::string server = join(r.value("server_flags", nlohmann::json::array()));
  if (!worker.empty()) pick += " (" + worker + ")";
  if (!server.empty()) pick += " servers (" + server + ")";
  return pick;
}

Readvise::Readvise(std::string out, bool node0_writer, std::string applied)
    : out_(std::move(out)), node0_(node0_writer), applied_pick_(pick_of(applied)) {
  // A request or an answer left by an earlier run of this node (a crash, a restart) is not this run's:
  // an answer made on what that run measured must not switch this one.
  if (node0_)
    for (const char* f : {kReadviseRequestFile, kReadviseAdviceFile}) {
      std::error_code ec;
      fs::remove(fs::path(out_) / f, ec);
    }
}

std::optional<std::string> Readvise::decide(int64_t step, bool drifting, const std::function<void(at::Tensor&)>& job_sum,
                                            const at::TensorOptions& options) {
  // Node 0: has its launcher answered, and does the answer change the pick?
  std::string next;
  if (node0_ && requested_ && !settled_) {
    const fs::path answer = fs::path(out_) / kReadviseAdviceFile;
    if (fs::exists(answer)) {
      std::string text;
      try {
        text = read_file(answer.string());
      } catch (const Error& e) {
        log::warn("[advice] {}", e.what());
      }
      std::error_code ec;
      fs::rename(answer, fs::path(out_) / fmt::format("readvise.step{}.json", step), ec);  // answered: kept beside the run
      const std::string pick = pick_of(text);
      if (pick.empty()) {
        log::warn("[advice] step {}: the re-advice {} is not an advice (no recommended configuration): the job goes on "
                  "as it is; see node 0's launcher log and {}/readvise<n>.log", step, answer.string(), out_);
        settled_ = true;
      } else if (pick == applied_pick_) {
        log::info("[advice] step {}: the re-advice on what the run measured keeps {}: the job goes on unchanged", step,
                  pick);
        settled_ = true;
      } else {
        next = std::move(text);
        log::warn("[advice] step {}: the re-advice picks {} instead of {}: every node checkpoints here and restarts in "
                  "it", step, pick, applied_pick_);
      }
    }
  }
  at::Tensor flags = at::zeros({2}, options.dtype(at::kFloat));
  flags[0] = drifting ? 1.f : 0.f;
  flags[1] = next.empty() ? 0.f : 1.f;
  job_sum(flags);
  const at::Tensor f = flags.cpu();
  const float drift = f[0].item<float>(), switching = f[1].item<float>();
  if (switching > 0) return share_text(next, node0_, options, job_sum);
  if (drift == 0 && settled_ && node0_) {  // every node back within the advice: a later drift asks again
    settled_ = false;
    requested_ = false;
  }
  if (drift > 0 && node0_ && !requested_ && !settled_) {
    write_file_atomic((fs::path(out_) / kReadviseRequestFile).string(),
                      nlohmann::json({{"step", step}, {"drifting_replicas", drift}}).dump() + "\n");
    requested_ = true;
    log::warn("[advice] step {}: {} node(s) drifted from the advice: asked node 0's launcher for a re-advice on what "
              "the run measured (syncopate-advise --from-run); the job goes on meanwhile and switches at a later "
              "multiple of dist.readvise_every if the pick changes", step, static_cast<int>(drift));
  }
  return std::nullopt;
}

}  // namespace syncopate
