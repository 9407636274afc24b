// The option table: one entry per .ini key, with its type, default, limits and documentation.
// Everything else (parsing, validation, --help, --print-config, docs/config.md) reads this table,
// so adding a setting is one entry here plus one field in TrainConfig.
#pragma once
#include <limits>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "config/train_config.h"

namespace fsdpq {

enum class OptionType {
  Bool,
  Int,
  Float,
  String,
  Enum,        // one of `choices`
  List,        // comma-separated; items from `choices` when that is non-empty
  InputFile,   // a file that must exist (when non-empty)
  OutputPath,  // a file or folder the run creates
};

using OptionField = std::variant<bool TrainConfig::*, int64_t TrainConfig::*, double TrainConfig::*,
                                 std::string TrainConfig::*, std::vector<std::string> TrainConfig::*>;

// A value fsdp_qlora accepts that fsdpq recognises but does not implement, and why.
struct NotImplemented {
  std::string_view value;
  std::string_view reason;
};

struct OptionSpec {
  std::string_view name;
  std::string_view section;  // grouping in docs and --print-config; any [section] may hold any key
  OptionType type;
  OptionField field;
  std::string_view default_value;  // parsed with the same rules as a user's value
  std::string_view help;
  std::vector<std::string_view> choices = {};
  double min = -std::numeric_limits<double>::infinity();
  double max = std::numeric_limits<double>::infinity();
  std::vector<NotImplemented> not_implemented = {};
  std::string_view special_values = {};  // words accepted besides the type (e.g. "auto"), for docs
};

const std::vector<OptionSpec>& option_specs();
const OptionSpec* find_option(std::string_view name);
std::vector<std::string> option_names();
std::string_view option_type_name(OptionType type);

}  // namespace fsdpq
