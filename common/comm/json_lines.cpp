#include "common/comm/json_lines.h"

#include <fmt/format.h>

#include "common/check.h"

namespace syncopate {

void write_json_line(Connection& c, const nlohmann::json& j) {
  const std::string line = j.dump() + "\n";
  c.send(line.data(), line.size());
}

nlohmann::json read_json_line(Connection& c) {
  std::string line;
  for (char ch = 0; line.size() < (64 << 10);) {
    c.recv(&ch, 1);
    if (ch == '\n') break;
    line.push_back(ch);
  }
  try {
    return nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception&) {
    SYN_FAIL(fmt::format("{} sent a malformed message", c.peer()), "is something else using that port?");
  }
}

}  // namespace syncopate
