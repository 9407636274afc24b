// A small .ini reader that remembers the line of every key, so that every config error can
// name file and line. (inih drops line numbers for values, which is why this is not inih.)
#pragma once
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace fsdpq {

struct IniEntry {
  std::string section;  // "" before the first [section]
  std::string key;
  std::string value;  // trimmed; surrounding double quotes removed
  int line = 0;
};

// Syntax: `key = value`, `[section]`, comments on their own line (# or ;) or after a value
// when preceded by whitespace (`lr = 1e-4  # peak`). Quote a value to keep # or ; in it.
// A key may appear once per file.
std::vector<IniEntry> parse_ini(std::string_view text, const std::string& filename);
std::vector<IniEntry> read_ini_file(const std::filesystem::path& path);

}  // namespace fsdpq
