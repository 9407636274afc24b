#include "data/sentencepiece_cuts.h"

#include <algorithm>

#include <fmt/format.h>

namespace fsdpq::data {

namespace {

constexpr std::string_view kSpaceSymbol = "\xe2\x96\x81";  // ▁, what the normalizer makes of ' '
constexpr size_t kLongestUtf8Character = 4;                 // what one <unk> piece stands for

// A piece that could span a boundary between a non-space and a space: one holding a plain space,
// or a ▁ that does not belong to the run of ▁ it starts with.
bool may_span_a_space(std::string_view piece) {
  if (piece.find(' ') != std::string_view::npos) return true;
  while (piece.substr(0, kSpaceSymbol.size()) == kSpaceSymbol) piece.remove_prefix(kSpaceSymbol.size());
  return piece.find(kSpaceSymbol) != std::string_view::npos;
}

// Bytes of input text the piece stands for: each ▁ is one space.
size_t input_bytes(std::string_view piece) {
  size_t spaces = 0;
  for (size_t at = piece.find(kSpaceSymbol); at != std::string_view::npos; at = piece.find(kSpaceSymbol, at + 1))
    ++spaces;
  return piece.size() - spaces * (kSpaceSymbol.size() - 1);
}

std::string normalizer_objection(const SentencePieceSpec& spec) {
  if (spec.model_type != SentencePieceModelType::Bpe) return "it is not a BPE model";
  if (spec.has_precompiled_charsmap) return "its normalizer rewrites characters (a precompiled charsmap)";
  if (!spec.escape_whitespaces) return "its normalizer keeps spaces as they are";
  if (spec.treat_whitespace_as_suffix) return "it treats whitespace as a suffix";
  return "";
}

}  // namespace

SentencePieceCuts sentencepiece_cuts(const SentencePieceSpec& spec, const std::vector<std::string>& pieces) {
  SentencePieceCuts cuts;
  cuts.max_token_bytes = kLongestUtf8Character;
  for (const std::string& piece : pieces) cuts.max_token_bytes = std::max(cuts.max_token_bytes, input_bytes(piece));
  cuts.why_not = normalizer_objection(spec);
  if (cuts.why_not.empty()) {
    const auto spanning = std::find_if(pieces.begin(), pieces.end(), [](const std::string& p) { return may_span_a_space(p); });
    if (spanning != pieces.end())
      cuts.why_not = fmt::format("its piece '{}' (id {}) may span a space", *spanning, spanning - pieces.begin());
  }
  cuts.allowed = cuts.why_not.empty();
  return cuts;
}

size_t cut_before_space(std::string_view text, size_t at) {
  for (size_t p = text.find(' ', std::max<size_t>(at, 1)); p != std::string_view::npos; p = text.find(' ', p + 1)) {
    // Both a space and a ▁ in the text itself become ▁, which pieces like "▁▁" join to the space.
    const std::string_view before = text.substr(0, p);
    if (before.back() != ' ' && !before.ends_with(kSpaceSymbol)) return p;
  }
  return text.size();
}

}  // namespace fsdpq::data
