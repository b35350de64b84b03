#include "common/command_line.h"

#include "common/check.h"

namespace syncopate {

std::vector<std::string> apply_command_line(ConfigSchema& schema, const std::vector<std::string>& args) {
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {  // --config first, so overrides win
    std::string path;
    if (flag_value(args, i, "--config", path)) {
      SYN_CHECK(!path.empty(), "--config needs a file", "write --config run.toml");
      schema.load_file(path);
    } else {
      rest.push_back(args[i]);
    }
  }
  return schema.apply_args(rest);
}

bool flag_value(const std::vector<std::string>& rest, size_t& i, const std::string& name, std::string& value) {
  const std::string& a = rest[i];
  if (a == name) {
    value = i + 1 < rest.size() ? rest[++i] : "";
    return true;
  }
  if (a.rfind(name + "=", 0) == 0) {
    value = a.substr(name.size() + 1);
    return true;
  }
  return false;
}

}  // namespace syncopate
