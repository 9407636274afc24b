#include "config/ini_file.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

bool is_key_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
}

// Removes a trailing comment that is preceded by whitespace and not inside quotes.
std::string_view strip_inline_comment(std::string_view value) {
  bool quoted = false;
  for (size_t i = 0; i < value.size(); ++i) {
    char c = value[i];
    if (c == '"') quoted = !quoted;
    if (!quoted && (c == '#' || c == ';') && (i == 0 || std::isspace(static_cast<unsigned char>(value[i - 1]))))
      return trim(value.substr(0, i));
  }
  return value;
}

}  // namespace

std::vector<IniEntry> parse_ini(std::string_view text, const std::string& filename) {
  std::vector<IniEntry> entries;
  std::map<std::string, int> first_line;
  std::string section;
  int line_no = 0;
  size_t pos = 0;
  if (!is_valid_utf8(text)) fail("{}: not a UTF-8 text file", filename);
  // A UTF-8 byte order mark (Windows editors write one) is not part of the first line.
  if (text.starts_with("\xEF\xBB\xBF")) text.remove_prefix(3);
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    std::string_view raw = text.substr(pos, end == std::string_view::npos ? std::string_view::npos : end - pos);
    pos = end == std::string_view::npos ? text.size() + 1 : end + 1;
    ++line_no;
    std::string_view line = trim(raw);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line[0] == '[') {
      if (line.back() != ']' || line.size() < 3)
        fail("{}:{}: malformed section header '{}': expected [name]", filename, line_no, line);
      section = std::string(trim(line.substr(1, line.size() - 2)));
      continue;
    }
    size_t eq = line.find('=');
    if (eq == std::string_view::npos)
      fail("{}:{}: expected 'key = value', '[section]' or a comment, got '{}'", filename, line_no, line);
    std::string key(trim(line.substr(0, eq)));
    if (key.empty()) fail("{}:{}: missing key before '='", filename, line_no);
    for (char c : key)
      if (!is_key_char(c))
        fail("{}:{}: '{}' is not a valid key (letters, digits and _ only)", filename, line_no, key);
    std::string_view value = strip_inline_comment(trim(line.substr(eq + 1)));
    if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
      value = value.substr(1, value.size() - 2);
    } else if (!value.empty() && (value.front() == '"' || value.back() == '"')) {
      fail("{}:{}: unbalanced quotes in the value of '{}'", filename, line_no, key);
    }
    if (auto it = first_line.find(key); it != first_line.end())
      fail("{}:{}: '{}' is set twice (first at line {})", filename, line_no, key, it->second);
    first_line[key] = line_no;
    entries.push_back({section, key, std::string(value), line_no});
  }
  return entries;
}

std::vector<IniEntry> read_ini_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail("config file '{}' not found", path.string());
  if (std::filesystem::is_directory(path, ec)) fail("config file '{}' is a directory, expected an .ini file", path.string());
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("config file '{}' cannot be read: {}", path.string(), std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("config file '{}' cannot be read: {}", path.string(), std::strerror(errno));
  return parse_ini(ss.str(), path.string());
}

}  // namespace fsdpq
