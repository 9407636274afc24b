// Command-line flags of the subcommands (init-model, init-tokenizer, demo, ...): `--name value`
// or `--name=value`, unknown flags rejected with a "did you mean".
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fsdpq {

struct FlagSpec {
  std::string name;
  std::string value_name;  // "" for a switch that takes no value
  std::string help;
  bool required = false;
};

class ParsedFlags {
 public:
  bool has(const std::string& name) const { return values_.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback = "") const;
  int64_t get_int(const std::string& name, int64_t fallback) const;  // errors name the flag
  std::map<std::string, std::string> values_;
};

// Parses argv[first..] against the specs; `command` names the subcommand in messages.
ParsedFlags parse_flags(const std::string& command, const std::vector<FlagSpec>& specs,
                        const std::vector<std::string>& args);
std::string flags_help(const std::string& usage, const std::vector<FlagSpec>& specs);

// Whether --help or -h is among a subcommand's arguments (it then prints its usage and stops).
bool wants_help(const std::vector<std::string>& args);

// A command-line word "--name" or "--name=value" taken apart (the subcommands' flags, the train
// command line's settings, plan's flags).
struct FlagWord {
  std::string name;
  std::string value;       // what follows the first '=', if any
  bool has_value = false;  // the word carried its value ("--name=value")
};
// `arg` starts with "--".
FlagWord split_flag_word(const std::string& arg);

}  // namespace fsdpq
