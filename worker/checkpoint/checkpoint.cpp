#include "worker/checkpoint/checkpoint.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <filesystem>
#include <map>

#include <ATen/ATen.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include "common/atomic_file.h"
#include "common/check.h"
#include "common/monotonic_clock.h"
#include "common/crash_point.h"
#include "common/log.h"
#include "common/flat_adamw.h"
#include "common/safetensors.h"
#include "model/gpt.h"
#include "model/hf_weights.h"
#include "worker/metrics/metrics_log.h"

namespace fs = std::filesystem;

namespace syncopate {
namespace {

std::vector<std::pair<std::string, at::Tensor>> rng_states(const at::Device& dev) {
  std::vector<std::pair<std::string, at::Tensor>> r;
  r.emplace_back("rng.cpu", at::detail::getDefaultCPUGenerator().get_state());
  if (dev.is_cuda()) r.emplace_back("rng.cuda", at::globalContext().defaultGenerator(dev).get_state());
  return r;
}

}  // namespace

CheckpointContents snapshot_checkpoint(int64_t step, GPTImpl& model, FlatAdamW* opt, const nlohmann::json& meta,
                                       const NamedTensors& sync_state, bool detach) {
  // A detached snapshot copies every tensor once, into host memory (to_hf_tensors may otherwise return
  // the live parameters themselves: fp32 on the CPU).
  auto own = [detach](const at::Tensor& t) { return detach ? t.detach().to(at::kCPU, /*non_blocking=*/false, /*copy=*/true) : t; };
  CheckpointContents c;
  c.step = step;
  c.model = to_hf_tensors(model, /*copy=*/detach);
  c.model_info = hf_file_metadata(model.config());
  c.optimizer = rng_states(model.parameters().front().device());  // fresh tensors already
  if (opt) {  // null: the parameter servers hold the optimizer (and checkpoint it themselves)
    c.optimizer.emplace_back("exp_avg", own(opt->exp_avg()));
    c.optimizer.emplace_back("exp_avg_sq", own(opt->exp_avg_sq()));
    c.optimizer_info["step"] = std::to_string(opt->steps());
  }
  for (const auto& [name, t] : sync_state) c.optimizer.emplace_back("sync." + name, own(t));
  c.meta = meta;
  return c;
}

void hold_checkpoint_write(double t0_s, double hold_s) { sleep_until_seconds(t0_s + hold_s); }

std::string write_checkpoint(const std::string& root, const CheckpointContents& c, int64_t keep,
                             const std::function<void()>& before_commit) {
  const int64_t step = c.step;
  const fs::path final_dir = checkpoint_dir(root, step), tmp = final_dir.string() + ".tmp";
  fs::create_directories(root);
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  crash_point("checkpoint", "tmp_dir", step);

  save_safetensors((tmp / "model.safetensors").string(), c.model, c.model_info);
  crash_point("checkpoint", "files", step);
  save_safetensors((tmp / "optimizer.safetensors").string(), c.optimizer, c.optimizer_info);
  write_file_atomic((tmp / "meta.json").string(), c.meta.dump(2));
  fsync_dir(tmp.string());
  if (before_commit) before_commit();

  fs::remove_all(final_dir);
  const std::string name = final_dir.filename().string();
  fs::rename(tmp, final_dir);
  fsync_dir(root);
  crash_point("checkpoint", "rename", step);
  write_file_atomic((fs::path(root) / "latest").string(), name + "\n");
  crash_point("checkpoint", "latest", step);

  std::vector<fs::path> all;
  for (const auto& e : fs::directory_iterator(root)) {
    std::string n = e.path().filename().string();
    if (e.is_directory() && n.rfind("step_", 0) == 0 && n.find(".tmp") == std::string::npos) all.push_back(e.path());
  }
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i + static_cast<size_t>(keep) < all.size(); ++i)
    if (all[i] != final_dir) fs::remove_all(all[i]);
  return final_dir.string();
}

std::string latest_checkpoint(const std::string& root) {
  const fs::path latest = fs::path(root) / "latest";
  if (!fs::exists(latest)) return "";
  std::string name = read_file(latest.string());
  name.erase(name.find_last_not_of(" \n\r\t") + 1);
  const fs::path dir = fs::path(root) / name;
  SYN_CHECK(!name.empty() && fs::is_directory(dir),
            fmt::format("'{}' names checkpoint '{}', which does not exist", latest.string(), name),
            "restore the checkpoint directory, or delete the 'latest' file to start from scratch");
  return dir.string();
}

std::vector<int64_t> list_checkpoints(const std::string& root) {
  std::vector<int64_t> steps;
  if (!fs::is_directory(root)) return steps;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || n.rfind("step_", 0) != 0 || n.find_first_not_of("0123456789", 5) != std::string::npos ||
        n.size() == 5)
      continue;
    bool whole = true;
    for (const char* f : {"meta.json", "model.safetensors", "optimizer.safetensors"}) whole = whole && fs::exists(e.path() / f);
    if (whole) steps.push_back(std::stoll(n.substr(5)));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::string checkpoint_dir(const std::string& root, int64_t step) {
  return (fs::path(root) / fmt::format("step_{:06d}", step)).string();
}

nlohmann::json read_checkpoint_meta(const std::string& dir) {
  try {
    return nlohmann::json::parse(read_file((fs::path(dir) / "meta.json").string()));
  } catch (const nlohmann::json::exception& e) {
    SYN_FAIL(fmt::format("'{}/meta.json' is not valid JSON: {}", dir, e.what()),
             "the checkpoint is incomplete or corrupt: resume from an older step_* directory");
  }
}

nlohmann::json load_checkpoint(const std::string& dir, GPTImpl& model, FlatAdamW* opt, const NamedTensors& sync_state,
                               bool switching) {
  const std::string hint = "the checkpoint is incomplete or corrupt: resume from an older step_* directory";
  nlohmann::json meta = read_checkpoint_meta(dir);
  // Validate everything before touching the model or optimizer.
  Safetensors weights = load_safetensors((fs::path(dir) / "model.safetensors").string());
  Safetensors state = load_safetensors((fs::path(dir) / "optimizer.safetensors").string());
  SYN_CHECK(state.tensors.count("rng.cpu"), fmt::format("'{}/optimizer.safetensors' lacks 'rng.cpu'", dir), hint);
  if (opt && switching && !state.tensors.count("exp_avg")) opt = nullptr;  // none to carry: the moments stay zero
  if (opt) {
    const std::string no_state = "a checkpoint of dist.mode=ps holds no optimizer state (the servers hold it): resume "
                                 "it in ps mode, or start fresh; otherwise " + hint;
    for (const char* k : {"exp_avg", "exp_avg_sq"})
      SYN_CHECK(state.tensors.count(k), fmt::format("'{}/optimizer.safetensors' lacks '{}'", dir, k), no_state);
    SYN_CHECK(state.metadata.count("step"), fmt::format("'{}/optimizer.safetensors' lacks the step count", dir), hint);
    const int64_t numel = opt->exp_avg().numel();
    SYN_CHECK(state.tensors["exp_avg"].numel() == numel && state.tensors["exp_avg_sq"].numel() == numel,
              fmt::format("'{}': optimizer state has {} elements but the model has {}", dir,
                          state.tensors["exp_avg"].numel(), numel),
              "the checkpoint belongs to another model shape: use the same --model.* settings");
  }
  NamedTensors restored;  // the sync state to copy in (all of it, unless switching modes)
  for (const auto& [name, t] : sync_state) {
    const auto it = state.tensors.find("sync." + name);
    if (switching) continue;  // another synchronization's state, or none: the new one starts its own
    restored.emplace_back(name, t);
    SYN_CHECK(it != state.tensors.end(), fmt::format("'{}/optimizer.safetensors' lacks 'sync.{}'", dir, name),
              "the checkpoint was written by another dist mode (local SGD keeps its round's state): resume with the "
              "same --dist.sync_every, or start fresh");
    SYN_CHECK(it->second.numel() == t.numel(),
              fmt::format("'{}': sync.{} has {} elements, the model {}", dir, name, it->second.numel(), t.numel()),
              "the checkpoint belongs to another model shape: use the same --model.* settings");
  }
  load_hf_tensors(model, weights, dir + "/model.safetensors");  // throws on any shape mismatch

  torch::NoGradGuard no_grad;
  if (opt) {
    opt->exp_avg().copy_(state.tensors["exp_avg"]);
    opt->exp_avg_sq().copy_(state.tensors["exp_avg_sq"]);
    opt->set_steps(std::stoll(state.metadata["step"]));
  }
  for (const auto& [name, t] : restored) t.copy_(state.tensors["sync." + name].reshape(t.sizes()));
  at::Generator cpu_gen = at::detail::getDefaultCPUGenerator();
  cpu_gen.set_state(state.tensors["rng.cpu"]);
  const auto dev = model.parameters().front().device();
  if (dev.is_cuda() && state.tensors.count("rng.cuda"))
  {
    at::Generator cuda_gen = at::globalContext().defaultGenerator(dev);
    cuda_gen.set_state(state.tensors["rng.cuda"]);
  }
  return meta;
}

}  // namespace syncopate

namespace syncopate {

int64_t agreed_resume_step(const std::vector<std::vector<int64_t>>& per_node) {
  bool any = false;
  for (const auto& v : per_node) any = any || !v.empty();
  if (!any) return -1;
  std::vector<int64_t> common = per_node.front();
  std::sort(common.begin(), common.end());
  for (size_t i = 1; i < per_node.size(); ++i) {
    std::vector<int64_t> mine = per_node[i], both;
    std::sort(mine.begin(), mine.end());
    std::set_intersection(common.begin(), common.end(), mine.begin(), mine.end(), std::back_inserter(both));
    common.swap(both);
  }
  if (!common.empty()) return common.back();
  std::string held;
  for (size_t r = 0; r < per_node.size(); ++r)
    held += fmt::format("{}node {}: {}", r ? "; " : "", r,
                        per_node[r].empty() ? std::string("none") : fmt::format("{}", fmt::join(per_node[r], ",")));
  log::warn("[checkpoint] no checkpoint step is held by every node ({}): every node starts fresh from step 0 "
            "(copy a checkpoint to the nodes that lack it to resume from it instead)", held);
  return -1;
}

int remove_checkpoint_leftovers(const std::string& root) {
  int removed = 0;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return 0;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (e.is_directory(ec) && n.rfind("step_", 0) == 0 && n.size() > 4 && n.compare(n.size() - 4, 4, ".tmp") == 0)
      removed += fs::remove_all(e.path(), ec) > 0;
  }
  return removed + remove_temp_files((fs::path(root) / "latest").string());
}

std::string encode_checkpoint_steps(const std::vector<int64_t>& steps) { return nlohmann::json(steps).dump(); }

std::vector<int64_t> decode_checkpoint_steps(const std::string& blob, int node) {
  if (blob.empty()) return {};
  try {
    return nlohmann::json::parse(blob).get<std::vector<int64_t>>();
  } catch (const nlohmann::json::exception&) {
    SYN_FAIL(fmt::format("node {} sent a malformed checkpoint list", node), "run the same Syncopate build on every node");
  }
}

}  // namespace syncopate
