// The special-token names of the tokenizer_config.json that a Hugging Face model folder keeps
// beside its tokenizer files ("bos_token", "eos_token", "pad_token").
#pragma once
#include <filesystem>
#include <optional>
#include <string>

namespace fsdpq::data {

struct SpecialTokenNames {
  std::optional<std::string> bos, eos, pad;  // unset where the file has none (or null)
  std::string source;  // "tokenizer_config.json at PATH", or why there are no names
};

// Reads the tokenizer_config.json in the folder of `tokenizer_file`; all names unset when there is
// none. A file that is not JSON, or a name that is neither a string nor {"content": "..."}, is a
// UserError naming the file.
SpecialTokenNames read_special_token_names(const std::filesystem::path& tokenizer_file);

}  // namespace fsdpq::data
