#include "worker/sync/advice.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "common/check.h"

namespace syncopate {
namespace {

const FieldBinding* find_field(const ConfigSchema& s, const std::string& key) {
  for (const auto& f : s.fields())
    if (f.section + "." + f.name == key) return &f;
  return nullptr;
}

}  // namespace

const std::set<std::string> kAdvisableFields = {
    "dist.mode",          "dist.sync_every",    "dist.outer",       "dist.outer_delay",
    "dist.outer_lr",      "dist.outer_momentum", "dist.wire",       "dist.clip_scope",
    "dist.overlap",       "dist.ps_overlap",    "dist.ps_partition_mb", "dist.ps_push_in_backward"};

AppliedAdvice apply_advice(ConfigSchema& schema, const ConfigSchema& defaults, const std::string& path, int64_t nodes,
                           const std::set<std::string>& user_keys) {
  const std::string hint = "run scripts/syncopate-advise probe.json (after build/bin/syncopate-probe) to write it, or "
                           "give --dist.mode=ring|ps|none";
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error& e) {
    SYN_FAIL(fmt::format("dist.mode=auto: cannot read the advice '{}': {}", path, e.what()), hint);
  }
  nlohmann::json a;
  try {
    a = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    SYN_FAIL(fmt::format("dist.mode=auto: '{}' is not JSON ({})", path, e.what()), hint);
  }
  SYN_CHECK(a.is_object() && a.value("format", std::string()) == "syncopate-advice/1",
            fmt::format("dist.mode=auto: '{}' is not an advice file (format '{}', expected 'syncopate-advice/1')", path,
                        a.is_object() ? a.value("format", std::string("none")) : std::string("none")),
            hint);
  SYN_CHECK(a.contains("recommended") && a["recommended"].is_object() && a["recommended"].contains("worker_flags") &&
                a["recommended"]["worker_flags"].is_array(),
            fmt::format("dist.mode=auto: '{}' has no recommended.worker_flags", path), hint);
  const auto& rec = a["recommended"];
  AppliedAdvice out;
  out.name = rec.value("name", std::string("unnamed"));
  bool sets_mode = false;
  for (const auto& f : rec["worker_flags"]) {
    SYN_CHECK(f.is_string(), fmt::format("dist.mode=auto: a worker flag in '{}' is not a string", path), hint);
    const std::string flag = f.get<std::string>();
    const size_t eq = flag.find('=');
    SYN_CHECK(flag.rfind("--dist.", 0) == 0 && eq != std::string::npos,
              fmt::format("dist.mode=auto: the advice '{}' gives '{}', but an advice may only set [dist] fields "
                          "(--dist.field=value): the learning rate, model and data stay the job's", path, flag),
              "re-run scripts/syncopate-advise; do not edit advice.json by hand");
    const std::string key = flag.substr(2, eq - 2), value = flag.substr(eq + 1);
    SYN_CHECK(key != "dist.mode" || (value != "auto" && !value.empty()),
              fmt::format("dist.mode=auto: the advice '{}' recommends dist.mode={}", path, value), hint);
    SYN_CHECK(key != "dist.advice", fmt::format("dist.mode=auto: the advice '{}' names another advice", path), hint);
    SYN_CHECK(kAdvisableFields.count(key), fmt::format("dist.mode=auto: the advice '{}' sets {}, which is not the "
                                                       "synchronization's to choose (membership, addresses and security "
                                                       "stay the job's)", path, key),
              "re-run scripts/syncopate-advise; do not edit advice.json by hand");
    for (const auto& f0 : out.flags)
      SYN_CHECK(f0.rfind("--" + key + "=", 0) != 0, fmt::format("dist.mode=auto: the advice '{}' sets {} twice", path, key),
                "re-run scripts/syncopate-advise; do not edit advice.json by hand");
    sets_mode = sets_mode || key == "dist.mode";
    const FieldBinding* now = find_field(schema, key);
    const FieldBinding* dflt = find_field(defaults, key);
    SYN_CHECK(now && dflt, fmt::format("dist.mode=auto: the advice '{}' sets {}, which this worker does not have", path, key),
              "the advice was written by another version: re-run scripts/syncopate-advise");
    const std::string before = now->get();
    schema.apply_override(key, value);  // parses and range-checks; throws naming the field
    const std::string after = now->get();
    if (key != "dist.mode" && (before != dflt->get() || user_keys.count(key)) && before != after)
      SYN_FAIL(fmt::format("dist.mode=auto: {} = {} is set for this job, but the advice '{}' ({}) gives {}", key, before,
                           path, out.name, after),
               fmt::format("drop --{} (the advice decides the synchronization), or give the mode yourself", key));
    out.flags.push_back(flag);
  }
  SYN_CHECK(sets_mode, fmt::format("dist.mode=auto: the advice '{}' does not set dist.mode", path), hint);
  if (rec.contains("server_flags") && rec["server_flags"].is_array())
    for (const auto& f : rec["server_flags"])
      if (f.is_string()) out.server_flags.push_back(f.get<std::string>());
  if (const auto it = a.find("cluster"); it != a.end() && it->is_object() && nodes > 0) {
    const int64_t advised = it->value("nodes", int64_t{0});
    if (advised > 0 && advised != nodes)
      out.warnings.push_back(fmt::format("the advice '{}' was made for {} nodes and this job has {}: re-probe and "
                                         "re-advise for this cluster", path, advised, nodes));
  }
  if (!rec.value("resolved", false))
    out.warnings.push_back(fmt::format("the advice '{}' did not resolve {} apart from every runner-up (see its "
                                       "candidates): another configuration may do as well", path, out.name));
  if (a.contains("validated") && a["validated"].is_object() && !a["validated"].value("inside", true))
    out.warnings.push_back(fmt::format("the advice '{}' is outside the simulator's validated range (see its "
                                       "validated.notes)", path));
  std::string predicted;
  for (const auto& c : a.value("candidates", nlohmann::json::array()))
    if (c.is_object() && c.value("name", std::string()) == out.name && c.contains("predicted_s") &&
        c["predicted_s"].is_object() && c["predicted_s"].value("mean", nlohmann::json()).is_number())
      predicted = fmt::format(", predicted {:.4g} s to the target", c["predicted_s"]["mean"].get<double>());
  std::string joined;
  for (const auto& f : out.flags) joined += (joined.empty() ? "" : " ") + f;
  out.summary = fmt::format("dist.mode=auto: {} recommends {}{}; applying {}", path, out.name, predicted, joined);
  if (!out.server_flags.empty()) {
    std::string s;
    for (const auto& f : out.server_flags) s += (s.empty() ? "" : " ") + f;
    out.summary += fmt::format(" (its servers: {})", s);
  }
  return out;
}

}  // namespace syncopate
