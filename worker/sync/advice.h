// --dist.mode=auto: start the synchronization that syncopate-advise recommended for this cluster.
// experiments/advise.py (scripts/syncopate-advise) writes advice.json from a probe of the cluster
// (syncopate-probe); its "recommended" entry names a configuration and the worker flags that run it,
// all of them [dist] fields ("--dist.mode=ps", "--dist.sync_every=10", ...). The worker reads the
// file named by dist.advice before its config is validated and applies those flags. The advice
// sets only how the nodes synchronize (kAdvisableFields): never the learning rate, the model, the
// data, nor where the job's peers are or how they authenticate (servers, master_addr, ps_encrypt,
// curve_server_key, nnodes, ...). A [dist] field the user set to another value than the advice's
// is refused by name, not overridden; so is a field the advice names twice.
#pragma once
#include <set>
#include <string>
#include <vector>

#include "common/config_schema.h"

namespace syncopate {

struct AppliedAdvice {
  std::string name;                // the recommended configuration ("diloco10", "bsp_backup", ...)
  std::vector<std::string> flags;  // the worker flags applied, as written in the advice
  std::vector<std::string> server_flags;  // what the advice gives the servers (ps modes; the launcher's to pass)
  std::string summary;             // one line for the log: what was applied, the prediction, the advice's age
  std::vector<std::string> warnings;  // the advice was made for another node count, was not resolved, ...
};

// The file in a run's output directory that holds the advice it was started from (a copy, written
// at start in --dist.mode=auto; absent otherwise).
inline constexpr const char* kAppliedAdviceFile = "advice.applied.json";

// The [dist] fields an advice may set: the synchronization, nothing about membership or security.
extern const std::set<std::string> kAdvisableFields;

// Reads `path` (advice.json) and applies its recommended worker flags to `schema` (bound to the
// run's config, whose [dist] mode is "auto"). The user's value of a field wins nowhere silently: a
// field in `user_keys` ("dist.sync_every": given on the command line), or whose current value differs
// from its default in `defaults` (a schema bound to a default-constructed config: set by a config
// file), and that the advice sets to another value, is refused. `nodes`: the job's node count
// (0 = unknown), compared with the advice's. Throws syncopate::Error naming the file and the problem.
AppliedAdvice apply_advice(ConfigSchema& schema, const ConfigSchema& defaults, const std::string& path, int64_t nodes,
                           const std::set<std::string>& user_keys = {});

}  // namespace syncopate
