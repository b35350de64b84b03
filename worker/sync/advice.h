// --dist.mode=auto: start the synchronization that syncopate-advise recommended for this cluster.
// experiments/advise.py (scripts/syncopate-advise) writes advice.json from a probe of the cluster
// (syncopate-probe); its "recommended" entry names a configuration and the worker flags that run it,
// all of them [dist] fields ("--dist.mode=ps", "--dist.sync_every=10", ...). The worker reads the
// file named by dist.advice before its config is validated and applies those flags. The advice
// never touches the learning rate, the model or the data (only [dist] flags are accepted), and a
// [dist] field the user set to another value than the advice's is refused by name, not overridden.
#pragma once
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

// Reads `path` (advice.json) and applies its recommended worker flags to `schema` (bound to the
// run's config, whose [dist] mode is "auto"). `defaults` is a schema bound to a default-constructed
// config of the same program: a [dist] field whose current value differs from both its default and
// the advice's value was set by the user and is refused. `nodes`: the job's node count (0 = unknown),
// compared with the advice's. Throws syncopate::Error naming the file and the problem.
AppliedAdvice apply_advice(ConfigSchema& schema, const ConfigSchema& defaults, const std::string& path, int64_t nodes);

}  // namespace syncopate
