#include "io/tokenizer_files.h"

#include <system_error>

#include "data/tokenizer.h"
#include "util/error.h"

namespace fsdpq {
namespace fs = std::filesystem;

std::vector<std::pair<fs::path, std::string>> tokenizer_files(const fs::path& tokenizer) {
  std::error_code ec;
  std::vector<std::pair<fs::path, std::string>> files;
  const bool folder = fs::is_directory(tokenizer, ec);
  const fs::path dir = folder ? tokenizer : tokenizer.parent_path();
  if (folder) {
    for (const char* name : {"tokenizer.model", "tokenizer.json"})
      if (fs::is_regular_file(dir / name, ec)) files.emplace_back(dir / name, name);
  } else {
    // A tokenizer.json is JSON whatever its name; anything else is a tokenizer.model.
    files.emplace_back(tokenizer, data::is_json_tokenizer_file(tokenizer) ? "tokenizer.json" : "tokenizer.model");
  }
  for (const char* name : {"tokenizer_config.json", "special_tokens_map.json"})
    if (fs::is_regular_file(dir / name, ec)) files.emplace_back(dir / name, name);
  return files;
}

void copy_tokenizer_files(const fs::path& tokenizer, const fs::path& dir, const std::string& what) {
  for (const auto& [source, name] : tokenizer_files(tokenizer)) {
    std::error_code ec;
    fs::copy_file(source, dir / name, fs::copy_options::overwrite_existing, ec);
    if (ec) fail("{}: cannot copy '{}' into '{}': {}", what, source.string(), dir.string(), ec.message());
  }
}

}  // namespace fsdpq
