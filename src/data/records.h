// Reading dataset records (JSON objects of string fields) from JSON Lines or JSON array files.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace fsdpq::data {

struct Record {
  std::map<std::string, std::string> fields;
  size_t line = 0;  // 1-based line where the record starts in its file (0: made in memory)
};

struct ReadStats {
  size_t read = 0;                              // records returned
  size_t skipped = 0;                           // bad records left out (skip_bad only)
  std::vector<std::string> first_skip_reasons;  // the messages of the first few skipped records
};

// How many skip reasons ReadStats keeps.
inline constexpr size_t kMaxSkipReasons = 5;

// Reads `path`: a JSON array of objects (first non-space character '[') or JSON Lines (one
// object per line; blank lines are ignored). Every value must be a string and every name in
// `required_fields` present. A bad record is an error "path:line: ..." unless `skip_bad`, when it
// is left out and counted in `stats` (which may be null). Stops after `limit` good records.
std::vector<Record> read_records(const std::filesystem::path& path,
                                 const std::vector<std::string>& required_fields, bool skip_bad,
                                 ReadStats* stats, size_t limit = SIZE_MAX);

}  // namespace fsdpq::data
