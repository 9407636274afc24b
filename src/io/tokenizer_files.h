// The files that make up a tokenizer in a Hugging Face model folder, for writing a model folder
// that transformers and fsdpq load with its tokenizer (init-model, a saved full or Llama-Pro model).
#pragma once
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace fsdpq {

// The files of the tokenizer at `tokenizer` (a file or a folder), as (source, name in the model
// folder): the tokenizer file itself under its Hugging Face name (tokenizer.model or
// tokenizer.json, by content), and the companion JSON files transformers reads beside it
// (tokenizer_config.json, special_tokens_map.json).
std::vector<std::pair<std::filesystem::path, std::string>> tokenizer_files(const std::filesystem::path& tokenizer);

// Copies those files into `dir` (replacing files of the same names); `what` names the command in
// the error when a copy fails.
void copy_tokenizer_files(const std::filesystem::path& tokenizer, const std::filesystem::path& dir,
                          const std::string& what);

}  // namespace fsdpq
