// The first ids of a text without encoding all of it: a 50 MB record cut to context_length tokens
// needs only its first few kilobytes encoded (docs/data.md, "Long texts").
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "data/tokenizer.h"

namespace fsdpq::data {

struct LeadingTokens {
  // The first ids of tokenizer.encode(text), at least `count` of them when the text has that many.
  std::vector<int32_t> ids;
  bool complete = true;  // ids are all of encode(text); false: the text goes on past them
};

// Encodes the shortest prefix of `text` that the tokenizer may cut it at (Tokenizer::cut_point)
// past count × max_token_bytes() bytes, which holds the first `count` tokens; when it still gives
// fewer (a token longer than the bound, e.g. a merged run of <unk>), twice that, and so on.
LeadingTokens encode_leading(const Tokenizer& tokenizer, std::string_view text, size_t count);

}  // namespace fsdpq::data
