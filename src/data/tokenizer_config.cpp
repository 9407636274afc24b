#include "data/tokenizer_config.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "util/error.h"

namespace fsdpq::data {
namespace fs = std::filesystem;

namespace {

// A name is written as a string, or (older transformers) as an AddedToken object.
std::optional<std::string> token_name(const nlohmann::json& config, const char* key,
                                      const fs::path& file) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  fail("'{}': \"{}\" is {}; expected a token name (a string, or an object with \"content\")",
       file.string(), key, it->dump());
}

}  // namespace

SpecialTokenNames read_special_token_names(const fs::path& tokenizer_file) {
  const fs::path file = tokenizer_file.parent_path() / "tokenizer_config.json";
  SpecialTokenNames names;
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) {
    names.source = "there is no tokenizer_config.json beside it";
    return names;
  }
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) fail("cannot read '{}'", file.string());
  nlohmann::json config = nlohmann::json::parse(text.str(), nullptr, false);
  if (config.is_discarded() || !config.is_object())
    fail("'{}' is not a JSON object; expected a Hugging Face tokenizer_config.json", file.string());
  names.bos = token_name(config, "bos_token", file);
  names.eos = token_name(config, "eos_token", file);
  names.pad = token_name(config, "pad_token", file);
  names.source = "tokenizer_config.json at " + file.string();
  return names;
}

}  // namespace fsdpq::data
