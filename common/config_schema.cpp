#include "common/config_schema.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include "common/check.h"

namespace syncopate {
namespace {

const toml::node& node_of(const void* p) { return *static_cast<const toml::node*>(p); }

std::string fmt_double(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

// "[lo, hi]", or ">= lo" / "<= hi" / "any" where a side is unbounded.
template <class T>
std::string range_text(T lo, T hi) {
  const bool open_lo = lo == std::numeric_limits<T>::lowest() || lo == -std::numeric_limits<T>::infinity();
  const bool open_hi = hi == std::numeric_limits<T>::max() || hi == std::numeric_limits<T>::infinity();
  if (open_lo && open_hi) return "any value";
  if (open_hi) return fmt::format(">= {}", lo);
  if (open_lo) return fmt::format("<= {}", hi);
  return fmt::format("[{}, {}]", lo, hi);
}

[[noreturn]] void bad_value(const FieldBinding& f, const std::string& why) {
  SYN_FAIL(fmt::format("config field '{}.{}': {}", f.section, f.name, why),
           fmt::format("allowed: {} ({}); the field is: {}", f.range, f.type, f.doc));
}

}  // namespace

void ConfigSchema::Binder::operator()(const char* name, int64_t& v, const char* doc, int64_t lo,
                                      int64_t hi) {
  FieldBinding f{section, name, doc, "int", range_text(lo, hi), {}, {}};
  int64_t* p = &v;
  f.get = [p] { return std::to_string(*p); };
  f.set = [p, lo, hi, f](const void* n) {
    auto x = node_of(n).value<int64_t>();
    if (!x || !node_of(n).is_integer()) bad_value(f, "not an integer");
    if (*x < lo || *x > hi) bad_value(f, fmt::format("{} is out of range", *x));
    *p = *x;
  };
  schema->add(std::move(f));
}

void ConfigSchema::Binder::operator()(const char* name, double& v, const char* doc, double lo,
                                      double hi) {
  FieldBinding f{section, name, doc, "float", range_text(lo, hi), {}, {}};
  double* p = &v;
  f.get = [p] { return fmt_double(*p); };
  f.set = [p, lo, hi, f](const void* n) {
    auto x = node_of(n).value<double>();  // integers convert too
    if (!x || !(node_of(n).is_floating_point() || node_of(n).is_integer()))
      bad_value(f, "not a number");
    if (!std::isfinite(*x) || *x < lo || *x > hi) bad_value(f, fmt::format("{} is out of range", *x));
    *p = *x;
  };
  schema->add(std::move(f));
}

void ConfigSchema::Binder::operator()(const char* name, bool& v, const char* doc) {
  FieldBinding f{section, name, doc, "bool", "{true, false}", {}, {}};
  bool* p = &v;
  f.get = [p] { return *p ? std::string("true") : std::string("false"); };
  f.set = [p, f](const void* n) {
    if (!node_of(n).is_boolean()) bad_value(f, "not true/false");
    *p = *node_of(n).value<bool>();
  };
  schema->add(std::move(f));
}

void ConfigSchema::Binder::operator()(const char* name, std::string& v, const char* doc,
                                      std::vector<std::string> choices,
                                      std::function<void()> on_set) {
  std::string range = "any string";
  if (!choices.empty()) range = "{" + fmt::format("{}", fmt::join(choices, ", ")) + "}";
  FieldBinding f{section, name, doc, "string", range, {}, {}};
  std::string* p = &v;
  f.get = [p] {
    std::ostringstream o;
    o << toml::value<std::string>(*p);  // quoted and escaped as TOML
    return o.str();
  };
  f.set = [p, choices, f, on_set](const void* n) {
    if (!node_of(n).is_string()) bad_value(f, "not a string");
    std::string x = *node_of(n).value<std::string>();
    if (!choices.empty() && std::find(choices.begin(), choices.end(), x) == choices.end())
      bad_value(f, fmt::format("'{}' is not an allowed value", x));
    *p = x;
    if (on_set) on_set();
  };
  schema->add(std::move(f));
}

FieldBinding* ConfigSchema::find(const std::string& section, const std::string& name) {
  for (auto& f : fields_)
    if (f.section == section && f.name == name) return &f;
  return nullptr;
}

void ConfigSchema::apply_table(const void* tp, const std::string& source) {
  const auto& root = *static_cast<const toml::table*>(tp);
  for (const auto& [sec_key, sec_node] : root) {
    std::string sec(sec_key.str());
    if (foreign_.count(sec)) continue;  // another program's section of the same job file
    const toml::table* sec_tab = sec_node.as_table();
    if (!sec_tab)
      SYN_FAIL(fmt::format("{}:{}: top-level key '{}' is not a [section]", source, sec_node.source().begin.line, sec),
               "put fields under a section header such as [train]; see --help");
    // "preset" fields reset their section, so they are applied before the other fields.
    std::vector<std::pair<std::string, const toml::node*>> items;
    for (const auto& [k, v] : *sec_tab) items.emplace_back(std::string(k.str()), &v);
    std::stable_partition(items.begin(), items.end(), [](auto& kv) { return kv.first == "preset"; });
    const bool known_section = std::any_of(fields_.begin(), fields_.end(), [&](const FieldBinding& f) { return f.section == sec; });
    if (!known_section)
      SYN_FAIL(fmt::format("{}:{}: unknown config section [{}]", source, sec_node.source().begin.line, sec),
               fmt::format("check the spelling; this program's sections are {}", section_list()));
    for (const auto& [name, node] : items) {
      FieldBinding* f = find(sec, name);
      const auto line = node->source().begin.line;  // 0 for text without positions (overrides)
      const std::string where = line ? fmt::format("{}:{}", source, line) : source;
      if (!f)
        SYN_FAIL(fmt::format("{}: unknown config field '{}.{}'", where, sec, name),
                 "check the spelling; `--help` lists every field");
      try {
        f->set(node);
      } catch (const Error& e) {  // the field's own message (name, value, allowed range), placed in the file
        throw Error(fmt::format("{}: {}", where, e.what()));
      }
    }
  }
}

void ConfigSchema::load_string(const std::string& text, const std::string& source) {
  toml::table t;
  try {
    t = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& r = e.source();
    SYN_FAIL(fmt::format("{}:{}:{}: malformed TOML: {}", source, r.begin.line, r.begin.column,
                         e.description()),
             "fix the syntax at that line (strings need quotes, sections look like [train])");
  }
  apply_table(&t, source);
}

void ConfigSchema::load_file(const std::string& path) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& r = e.source();
    std::string d(e.description());
    if (d.find("could not be opened") != std::string::npos || d.find("File could not") != std::string::npos)
      SYN_FAIL(fmt::format("config file '{}' could not be opened", path),
               "check the path given to --config");
    SYN_FAIL(fmt::format("{}:{}:{}: malformed TOML: {}", path, r.begin.line, r.begin.column, d),
             "fix the syntax at that line (strings need quotes, sections look like [train])");
  }
  apply_table(&t, path);
}

void ConfigSchema::apply_override(const std::string& key, const std::string& value) {
  auto dot = key.find('.');
  if (dot == std::string::npos)
    SYN_FAIL(fmt::format("override '{}' is not of the form section.field", key),
             "write e.g. --train.steps=20");
  std::string sec = key.substr(0, dot), name = key.substr(dot + 1);
  if (auto owner = foreign_.find(sec); owner != foreign_.end())
    SYN_FAIL(fmt::format("--{} is a setting of {}, not of this program", key, owner->second),
             fmt::format("give it to {} (a shared --config file may hold a [{}] section: this program skips it)",
                         owner->second, sec));
  FieldBinding* f = find(sec, name);
  if (!f)
    SYN_FAIL(fmt::format("unknown config field '{}'", key), "`--help` lists every field");
  toml::table t;
  try {
    t = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    t.insert_or_assign("v", value);  // bare word: take it as a string
  }
  if (f->type == "string" && !t["v"].is_string()) t.insert_or_assign("v", value);
  f->set(t.get("v"));
}

std::vector<std::string> ConfigSchema::apply_args(const std::vector<std::string>& args) {
  std::vector<std::string> rest;
  std::vector<std::pair<std::string, std::string>> kv;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0 || a.find('.') == std::string::npos ||
        a.find('.') > a.find('=')) {
      rest.push_back(a);
      continue;
    }
    auto eq = a.find('=');
    if (eq != std::string::npos) {
      kv.emplace_back(a.substr(2, eq - 2), a.substr(eq + 1));
    } else {
      if (i + 1 >= args.size())
        SYN_FAIL(fmt::format("override '{}' has no value", a), "write --section.field=value");
      kv.emplace_back(a.substr(2), args[++i]);
    }
  }
  std::stable_partition(kv.begin(), kv.end(), [](auto& p) {
    return p.first.size() > 7 && p.first.compare(p.first.size() - 7, 7, ".preset") == 0;
  });
  for (auto& [k, v] : kv) apply_override(k, v);
  return rest;
}

std::string ConfigSchema::section_list() const {
  std::vector<std::string> names;
  for (const auto& f : fields_)
    if (std::find(names.begin(), names.end(), "[" + f.section + "]") == names.end()) names.push_back("[" + f.section + "]");
  std::string s = fmt::format("{}", fmt::join(names, " "));
  std::map<std::string, std::vector<std::string>> by_owner;
  for (const auto& [sec, owner] : foreign_) by_owner[owner].push_back("[" + sec + "]");
  for (const auto& [owner, secs] : by_owner) s += fmt::format("; it skips {}'s {}", owner, fmt::join(secs, " "));
  return s;
}

std::string ConfigSchema::help() const {
  std::ostringstream os;
  std::string sec;
  for (const auto& f : fields_) {
    if (f.section != sec) {
      sec = f.section;
      os << "\n[" << sec << "]\n";
    }
    os << fmt::format("  --{}.{}={:<12} {} ({} in {})\n", f.section, f.name, f.get(), f.doc,
                      f.type, f.range);
  }
  return os.str();
}

std::string ConfigSchema::to_toml() const {
  std::ostringstream os;
  std::string sec;
  for (const auto& f : fields_) {
    if (f.section != sec) {
      sec = f.section;
      os << "[" << sec << "]\n";
    }
    os << f.name << " = " << f.get() << "\n";
  }
  return os.str();
}

}  // namespace syncopate
