// Resolves a run's configuration: defaults, then the .ini file, then command-line overrides;
// validates every value and the combinations; remembers where each value came from.
#pragma once
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "config/train_config.h"

namespace fsdpq {

struct ValueSource {
  enum class Kind { Default, File, CommandLine } kind = Kind::Default;
  std::string file;
  int line = 0;
  // "inputs/sql.ini:12", "command line" or "default".
  std::string describe() const;
};

struct ConfigOverride {
  std::string key;
  std::string value;
};

struct ResolvedConfig {
  TrainConfig config;
  std::string config_path;                        // "" when no file was given
  std::map<std::string, std::string> text;        // key → the value as written (after resolution)
  std::map<std::string, ValueSource> sources;     // key → where it came from
  std::vector<std::string> warnings;              // settings that have no effect, etc.
  // "key = value (inputs/sql.ini:12)" — how errors and warnings cite a setting.
  std::string cite(const std::string& key) const;
};

// Throws UserError naming file, line and key on any problem; all per-key problems of one call
// are reported together.
ResolvedConfig resolve_config(const std::optional<std::filesystem::path>& ini_path,
                              const std::vector<ConfigOverride>& overrides);
// Same, from the text of an .ini (the embedded demo config); `name` is used in messages.
ResolvedConfig resolve_config_text(const std::string& ini_text, const std::string& name,
                                   const std::vector<ConfigOverride>& overrides);

// The resolved config as an .ini a user could run again, each value annotated with its source.
std::string format_resolved_config(const ResolvedConfig& resolved);
// The reference of every key (docs/config.md is this text; a test keeps them equal).
std::string config_reference_markdown();

}  // namespace fsdpq
