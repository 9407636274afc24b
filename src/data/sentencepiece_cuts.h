// Where a long text may be cut before a sentencepiece model encodes it, so that the ids of the kept
// part are exactly the first ids of the whole text (docs/data.md, "Long texts").
//
// Why a cut just before a space that follows a non-space is exact, for the models that allow it:
// - the normalizer works character by character (no precompiled charsmap), turns spaces into ▁
//   and adds its dummy ▁ in front (not behind): the kept text normalizes to a prefix of what the
//   whole text normalizes to (removing extra whitespace changes nothing there either: the kept
//   text ends in a non-space);
// - no piece holds a plain space, nor a ▁ after anything but ▁ (Llama's 32000 pieces: ▁ only at
//   the start), so no piece can span the cut;
// - BPE (sentencepiece's bpe_model.cc) only ever merges two symbols into a piece of the
//   vocabulary, taking pairs by score, then position: with no piece across the cut, the merges
//   left of it are the same, in the same order, whatever follows it.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "data/sentencepiece_spec.h"

namespace fsdpq::data {

struct SentencePieceCuts {
  bool allowed = false;
  std::string why_not;         // when not allowed: which property of the model forbids it
  size_t max_token_bytes = 0;  // the most bytes of input text one piece stands for (▁ = 1 space)
};

// What `spec` and the model's `pieces` (every piece's text, by id) allow.
SentencePieceCuts sentencepiece_cuts(const SentencePieceSpec& spec, const std::vector<std::string>& pieces);

// The first position p >= at, p >= 1, where text[p] is a space and the character before it neither a
// space nor a ▁ (which the normalizer would make one run of ▁ with it); text.size() when there is none.
size_t cut_before_space(std::string_view text, size_t at);

}  // namespace fsdpq::data
