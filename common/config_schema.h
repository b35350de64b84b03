// Config as plain structs: each config struct lists its fields once, with doc and allowed range,
// in a `fields(V&)` method. ConfigSchema visits those lists to load a TOML file, apply
// `--section.field=value` overrides, validate ranges and print --help. No torch here.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace syncopate {

// One bound field: how to set it from text/TOML, how to print it, and its doc.
struct FieldBinding {
  std::string section;  // e.g. "train"
  std::string name;     // e.g. "steps"
  std::string doc;      // one line, with unit
  std::string type;     // "int", "float", "bool", "string"
  std::string range;    // human-readable allowed values, e.g. "[1, 1e9]"
  // Parses a TOML value (already a toml++ node, passed type-erased) and stores it, or throws
  // syncopate::Error naming the field and the allowed range.
  std::function<void(const void* toml_node)> set;
  std::function<std::string()> get;  // current value, TOML-formatted
};

// Collects bindings from config structs. Usage:
//   ConfigSchema s; s.section("train", cfg.train); ... s.load_file(path); s.apply_override("train.steps", "20");
class ConfigSchema {
 public:
  template <class Struct>
  void section(const std::string& name, Struct& s) {
    Binder b{this, name};
    s.fields(b);
  }

  // A section owned by another program that reads the same job file (the server's [ps] in the
  // worker's job.toml, the worker's [train] in the server's): skipped when a file holds it, refused
  // by name (with its owner) when given on the command line.
  void foreign_section(const std::string& name, const std::string& owner) { foreign_[name] = owner; }

  // Loads a TOML file; unknown sections/fields are errors (typos must not pass silently).
  void load_file(const std::string& path);
  // Loads TOML text (used for embedded defaults and tests).
  void load_string(const std::string& toml_text, const std::string& source_name);
  // Applies one override "section.field" = value-as-text; the value is parsed as TOML
  // (20, 3e-4, true, "x") and, failing that, taken as a bare string.
  void apply_override(const std::string& key, const std::string& value);
  // Parses argv-style overrides of the form --section.field=value (or --section.field value).
  // Returns the arguments it did not consume.
  std::vector<std::string> apply_args(const std::vector<std::string>& args);

  // "[model] [data] ...; it skips [ps] (syncopate-server)": the sections this schema reads, and
  // the other programs' sections it skips.
  std::string section_list() const;
  // "--section.field  (type, default X) doc" lines for every field.
  std::string help() const;
  // The full current config as TOML text (saved into checkpoints and run directories).
  std::string to_toml() const;

  const std::vector<FieldBinding>& fields() const { return fields_; }

  // Used by Binder.
  void add(FieldBinding b) { fields_.push_back(std::move(b)); }

 private:
  struct Binder {
    ConfigSchema* schema;
    std::string section;
    void operator()(const char* name, int64_t& v, const char* doc,
                    int64_t lo = std::numeric_limits<int64_t>::min(),
                    int64_t hi = std::numeric_limits<int64_t>::max());
    void operator()(const char* name, double& v, const char* doc,
                    double lo = -std::numeric_limits<double>::infinity(),
                    double hi = std::numeric_limits<double>::infinity());
    void operator()(const char* name, bool& v, const char* doc);
    // choices: allowed values, empty = any string; on_set runs after a new value is stored
    // (used by presets, which reset the rest of their section).
    void operator()(const char* name, std::string& v, const char* doc,
                    std::vector<std::string> choices = {}, std::function<void()> on_set = {});
  };
  FieldBinding* find(const std::string& section, const std::string& name);
  void apply_table(const void* toml_table, const std::string& source_name);

  std::vector<FieldBinding> fields_;
  std::map<std::string, std::string> foreign_;  // section -> the program that owns it
};

}  // namespace syncopate
