#include "app/arg_parser.h"

#include <fmt/format.h>

#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {

std::string ParsedFlags::get(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

int64_t ParsedFlags::get_int(const std::string& name, int64_t fallback) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  auto v = parse_int(it->second);
  if (!v) fail("--{} {}: expected an integer", name, it->second);
  return *v;
}

ParsedFlags parse_flags(const std::string& command, const std::vector<FlagSpec>& specs,
                        const std::vector<std::string>& args) {
  ParsedFlags out;
  std::vector<std::string> names;
  for (const auto& s : specs) names.push_back(s.name);
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (!starts_with(arg, "--"))
      fail("{}: unexpected argument '{}' (flags look like --name value; see fsdpq {} --help)", command, arg,
           command);
    auto [name, value, inline_value] = split_flag_word(arg);
    const FlagSpec* spec = nullptr;
    for (const auto& s : specs)
      if (s.name == name) spec = &s;
    if (!spec) {
      std::string guess = closest_match(name, names);
      fail("{}: unknown flag --{}{}", command, name,
           guess.empty() ? fmt::format(" (fsdpq {} --help lists the flags)", command)
                         : fmt::format(" (did you mean --{}?)", guess));
    }
    if (out.has(name)) fail("{}: --{} is given twice", command, name);
    if (spec->value_name.empty()) {
      if (inline_value) fail("{}: --{} takes no value", command, name);
      value = "true";
    } else if (!inline_value) {
      if (i + 1 >= args.size()) fail("{}: --{} needs a value ({})", command, name, spec->value_name);
      value = args[++i];
    }
    out.values_[name] = value;
  }
  for (const auto& s : specs)
    if (s.required && !out.has(s.name)) fail("{}: --{} {} is required", command, s.name, s.value_name);
  return out;
}

bool wants_help(const std::vector<std::string>& args) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") return true;
  return false;
}

FlagWord split_flag_word(const std::string& arg) {
  FlagWord word;
  word.name = arg.substr(2);
  if (auto eq = word.name.find('='); eq != std::string::npos) {
    word.value = word.name.substr(eq + 1);
    word.name = word.name.substr(0, eq);
    word.has_value = true;
  }
  return word;
}

std::string flags_help(const std::string& usage, const std::vector<FlagSpec>& specs) {
  std::string out = "usage: " + usage + "\n\n";
  for (const auto& s : specs) {
    std::string left = "  --" + s.name + (s.value_name.empty() ? "" : " " + s.value_name);
    out += fmt::format("{:<28} {}{}\n", left, s.help, s.required ? " (required)" : "");
  }
  return out;
}

}  // namespace fsdpq
