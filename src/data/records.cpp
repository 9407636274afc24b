#include "data/records.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "util/error.h"
#include "util/strings.h"

namespace fsdpq::data {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kExpectedFormat =
    "expected JSON Lines (one JSON object per line) or a JSON array of objects";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

std::string read_whole_file(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("{}: no such file; {}", path.string(), kExpectedFormat);
  if (fs::is_directory(path, ec))
    fail("{}: is a folder, not a file; {}", path.string(), kExpectedFormat);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open the file ({})", path.string(), std::strerror(errno));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) fail("{}: cannot read the file ({})", path.string(), std::strerror(errno));
  std::string text = std::move(buffer).str();
  // A UTF-8 byte-order mark is legal at the start of a text file and means nothing here.
  if (starts_with(text, "\xEF\xBB\xBF")) text.erase(0, 3);
  return text;
}

std::string a_or_an(std::string_view type_name) {
  bool vowel =
      !type_name.empty() && std::string_view("aeiou").find(type_name[0]) != std::string_view::npos;
  return fmt::format("{} {}", vowel ? "an" : "a", type_name);
}

// Parses one record's JSON text, which starts on line `line`. Returns "" and fills `out` when the
// record is good, else the reason it is bad, already prefixed with "path:line: ".
class RecordParser {
 public:
  RecordParser(const fs::path& path, const std::vector<std::string>& required)
      : path_(path.string()), required_(required), required_list_(join(required, ", ")) {}

  std::string parse(std::string_view text, size_t line, Record* out) const {
    if (!is_valid_utf8(text))
      return where(line) +
             "not valid UTF-8; expected UTF-8 text (convert the file, e.g. with iconv)";
    json value;
    try {
      value = json::parse(text);
    } catch (const json::parse_error& e) {
      return broken_json(text, line, e);
    }
    if (!value.is_object())
      return where(line) + fmt::format("expected a JSON object of string fields, found {}",
                                       a_or_an(value.type_name()));
    Record record;
    record.line = line;
    for (const auto& [key, field] : value.items()) {
      if (!field.is_string())
        return where(line) + fmt::format(
                                 "field '{}' is {}; expected a string (every field must "
                                 "be a JSON string)",
                                 key, a_or_an(field.type_name()));
      record.fields.emplace(key, field.get<std::string>());
    }
    for (const std::string& name : required_)
      if (!record.fields.count(name))
        return where(line) + fmt::format("missing field '{}'; each record needs the fields {}",
                                         name, required_list_);
    *out = std::move(record);
    return "";
  }

  std::string where(size_t line) const { return fmt::format("{}:{}: ", path_, line); }

 private:
  // nlohmann says "[json.exception.parse_error.101] parse error at line 1, column 12: why";
  // report the file's own line and the column within it.
  std::string broken_json(std::string_view text, size_t line, const json::parse_error& e) const {
    size_t offset = std::min<size_t>(e.byte > 0 ? e.byte - 1 : 0, text.size());
    size_t error_line = line, line_start = 0;
    for (size_t i = 0; i < offset; ++i)
      if (text[i] == '\n') ++error_line, line_start = i + 1;
    std::string why = e.what();
    if (size_t p = why.find("column "); p != std::string::npos)
      if (size_t colon = why.find(": ", p); colon != std::string::npos) why = why.substr(colon + 2);
    return fmt::format("{}:{}: broken JSON at column {}: {}", path_, error_line,
                       offset - line_start + 1, why);
  }

  std::string path_;
  const std::vector<std::string>& required_;
  std::string required_list_;
};

// Collects good records and applies the skip_bad policy to bad ones.
class RecordSink {
 public:
  RecordSink(bool skip_bad, ReadStats* stats, size_t limit)
      : skip_bad_(skip_bad), stats_(stats), limit_(limit) {}

  void add(Record record) { records_.push_back(std::move(record)); }
  void reject(std::string reason) {
    if (!skip_bad_) throw UserError(reason);
    ++skipped_;
    if (stats_ && stats_->first_skip_reasons.size() < kMaxSkipReasons)
      stats_->first_skip_reasons.push_back(reason);
    if (first_reason_.empty()) first_reason_ = std::move(reason);
  }
  bool full() const { return records_.size() >= limit_; }

  std::vector<Record> finish(const fs::path& path) {
    if (stats_) {
      stats_->read += records_.size();
      stats_->skipped += skipped_;
    }
    if (records_.empty() && limit_ > 0) {
      if (skipped_ > 0)
        fail("{}: no usable records: all {} records are bad (first: {})", path.string(), skipped_,
             first_reason_);
      fail("{}: the file has no records; {}", path.string(), kExpectedFormat);
    }
    return std::move(records_);
  }

 private:
  bool skip_bad_;
  ReadStats* stats_;
  size_t limit_;
  size_t skipped_ = 0;
  std::string first_reason_;
  std::vector<Record> records_;
};

void read_json_lines(std::string_view text, const RecordParser& parser, RecordSink& sink) {
  size_t line = 0, start = 0;
  while (start < text.size() && !sink.full()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view content = text.substr(start, end - start);
    ++line;
    start = end + 1;
    if (trim(content).empty()) continue;
    Record record;
    std::string reason = parser.parse(content, line, &record);
    if (reason.empty())
      sink.add(std::move(record));
    else
      sink.reject(std::move(reason));
  }
}

// Walks a top-level JSON array element by element, so each element's starting line is known and
// one bad element can be skipped. Strings and nesting are tracked only to find the commas and the
// closing bracket; nlohmann then parses each element.
void read_json_array(std::string_view text, const fs::path& path, const RecordParser& parser,
                     RecordSink& sink) {
  size_t pos = text.find('[') + 1;
  size_t line = 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + pos, '\n'));
  auto skip_space = [&] {
    while (pos < text.size() && is_space(text[pos])) line += text[pos++] == '\n';
  };
  skip_space();
  if (pos < text.size() && text[pos] == ']') {
    ++pos;
  } else {
    while (true) {
      skip_space();
      const size_t element_start = pos, element_line = line;
      int depth = 0;
      bool in_string = false, closed = false;
      for (; pos < text.size(); ++pos) {
        char c = text[pos];
        if (c == '\n') ++line;
        if (in_string) {
          if (c == '\\' && pos + 1 < text.size())
            line += text[++pos] == '\n';
          else if (c == '"')
            in_string = false;
        } else if (c == '"') {
          in_string = true;
        } else if (c == '{' || c == '[') {
          ++depth;
        } else if ((c == '}' || c == ']') && depth > 0) {
          --depth;
        } else if ((c == ',' || c == ']') && depth == 0) {
          closed = true;
          break;
        }
      }
      if (!closed)
        fail("{}{}", parser.where(element_line),
             "this element of the JSON array never ends (an unclosed string, object or array, "
             "or a missing ']' at the end of the file?)");
      std::string_view element = trim(text.substr(element_start, pos - element_start));
      if (element.empty()) {
        sink.reject(parser.where(element_line) +
                    "empty element in the JSON array (a doubled or trailing comma?)");
      } else if (!sink.full()) {
        Record record;
        std::string reason = parser.parse(element, element_line, &record);
        if (reason.empty())
          sink.add(std::move(record));
        else
          sink.reject(std::move(reason));
      }
      if (sink.full()) return;
      if (text[pos++] == ']') break;
    }
  }
  skip_space();
  if (pos < text.size())
    fail("{}:{}: unexpected text after the end of the JSON array; expected one array per file",
         path.string(), line);
}

}  // namespace

std::vector<Record> read_records(const fs::path& path,
                                 const std::vector<std::string>& required_fields, bool skip_bad,
                                 ReadStats* stats, size_t limit) {
  const std::string text = read_whole_file(path);
  size_t first = 0;
  while (first < text.size() && is_space(text[first])) ++first;
  if (first == text.size()) fail("{}: the file is empty; {}", path.string(), kExpectedFormat);

  RecordParser parser(path, required_fields);
  RecordSink sink(skip_bad, stats, limit);
  if (text[first] == '[')
    read_json_array(text, path, parser, sink);
  else
    read_json_lines(text, parser, sink);
  return sink.finish(path);
}

}  // namespace fsdpq::data
