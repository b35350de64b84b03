// The programs' shared command line: a TOML file (--config FILE, loaded first so that overrides
// win) and --section.field=value overrides, bound through a ConfigSchema; each program then reads
// its own flags from what is left.
#pragma once
#include <string>
#include <vector>

#include "common/config_schema.h"

namespace syncopate {

// Loads --config FILE (or --config=FILE) into `schema`, then applies every --section.field=value
// override; returns the arguments neither consumed, in order. Throws syncopate::Error (a missing
// file name, an unknown field, a value out of range).
std::vector<std::string> apply_command_line(ConfigSchema& schema, const std::vector<std::string>& args);

// A flag with a value, as "--name VALUE" or "--name=VALUE": true (and `value` set, `i` advanced past
// it) when rest[i] is that flag.
bool flag_value(const std::vector<std::string>& rest, size_t& i, const std::string& name, std::string& value);

}  // namespace syncopate
