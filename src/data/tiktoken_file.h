// Reads Meta's Llama-3 tokenizer.model, tiktoken's format: one "base64(token bytes) rank" line per
// token. The file holds only the ranks; the split pattern and the 256 special tokens are those of
// Meta's tokenizer.py (llama-models, llama3/tokenizer.py), so encoding matches
// tiktoken.Encoding(pat_str, mergeable_ranks, special_tokens).encode(text, allowed_special="all").
#pragma once
#include <filesystem>
#include <memory>

#include "data/bpe_tokenizer.h"

namespace fsdpq::data {

// Whether the first line of `file` is a base64 token, a space and a rank (a sentencepiece model is
// a binary protobuf, never such a line).
bool looks_like_tiktoken(const std::filesystem::path& file);

std::unique_ptr<BpeTokenizer> load_tiktoken_file(const std::filesystem::path& file);

}  // namespace fsdpq::data
