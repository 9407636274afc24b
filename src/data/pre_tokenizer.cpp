#include "data/pre_tokenizer.h"

#include <string>

namespace fsdpq::data {

namespace {

// The pattern Hugging Face's ByteLevel pre-tokenizer splits with when use_regex is on (GPT-2's,
// pre_tokenizers/byte_level.rs); part of ByteLevel itself, never written in a tokenizer.json.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Span {
  size_t start, end;
  bool is_match;
};

// Matches and the gaps between them, covering `text` (Hugging Face's Pattern::find_matches).
std::vector<Span> find_spans(const UnicodeRegex& pattern, std::string_view text, bool invert) {
  std::vector<Span> spans;
  size_t previous_end = 0;
  pattern.for_each_match(text, [&](size_t start, size_t end) {
    if (start != previous_end) spans.push_back({previous_end, start, invert});
    spans.push_back({start, end, !invert});
    previous_end = end;
  });
  if (previous_end != text.size()) spans.push_back({previous_end, text.size(), invert});
  return spans;
}

// Each match and each gap between matches, in order: what Isolated keeps, handed on as found.
template <class OnPiece>
void for_each_isolated(const UnicodeRegex& pattern, std::string_view text, OnPiece&& on_piece) {
  size_t previous_end = 0;
  pattern.for_each_match(text, [&](size_t start, size_t end) {
    on_piece(text.substr(previous_end, start - previous_end));
    on_piece(text.substr(start, end - start));
    previous_end = end;
  });
  on_piece(text.substr(previous_end));
}

// Hugging Face's NormalizedString::split: which spans stay, and which are joined to a neighbour.
std::vector<Span> apply_behavior(std::vector<Span> spans, SplitBehavior behavior) {
  std::vector<Span> out;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::Isolated:
      return spans;
    case SplitBehavior::Removed:
      for (const Span& s : spans)
        if (!s.is_match) out.push_back(s);
      return out;
    case SplitBehavior::Contiguous:
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !out.empty())
          out.back().end = s.end;
        else
          out.push_back(s);
        previous_match = s.is_match;
      }
      return out;
    case SplitBehavior::MergedWithPrevious:
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !out.empty())
          out.back().end = s.end;
        else
          out.push_back(s);
        previous_match = s.is_match;
      }
      return out;
    case SplitBehavior::MergedWithNext:
      for (auto s = spans.rbegin(); s != spans.rend(); ++s) {
        if (s->is_match && !previous_match && !out.empty())
          out.back().start = s->start;
        else
          out.push_back(*s);
        previous_match = s->is_match;
      }
      return {out.rbegin(), out.rend()};
  }
  return spans;
}

}  // namespace

PreTokenizer::PreTokenizer(std::vector<Step> steps) : steps_(std::move(steps)) {
  for (const Step& step : steps_)
    if (const auto* byte_level = std::get_if<ByteLevel>(&step); byte_level && byte_level->use_regex)
      gpt2_pattern_ = std::make_unique<UnicodeRegex>(kGpt2Pattern, false, "ByteLevel's GPT-2 pattern");
}

PreTokenizer::~PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;

void PreTokenizer::split(std::string_view text, const Emit& emit) const { run(0, text, emit); }

bool PreTokenizer::splits_as_llama3() const {
  if (steps_.empty() || steps_.size() > 2) return false;
  const auto* split = std::get_if<Split>(&steps_[0]);
  if (!split || split->source != kLlama3SplitPattern || split->behavior != SplitBehavior::Isolated || split->invert)
    return false;
  if (steps_.size() == 1) return true;
  const auto* byte_level = std::get_if<ByteLevel>(&steps_[1]);
  return byte_level && !byte_level->add_prefix_space && !byte_level->use_regex;
}

void PreTokenizer::run(size_t step, std::string_view text, const Emit& emit) const {
  if (text.empty()) return;
  if (step == steps_.size()) return emit(text);
  if (const auto* split = std::get_if<Split>(&steps_[step])) return run_split(*split, step + 1, text, emit);
  run_byte_level(std::get<ByteLevel>(steps_[step]), step + 1, text, emit);
}

void PreTokenizer::run_split(const Split& split, size_t next_step, std::string_view text,
                             const Emit& emit) const {
  const auto next = [&](std::string_view piece) { run(next_step, piece, emit); };
  // Isolated (Llama-3's) needs no list of spans; invert makes no difference to it.
  if (split.behavior == SplitBehavior::Isolated) return for_each_isolated(*split.pattern, text, next);
  for (const Span& s : apply_behavior(find_spans(*split.pattern, text, split.invert), split.behavior))
    next(text.substr(s.start, s.end - s.start));
}

void PreTokenizer::run_byte_level(const ByteLevel& byte_level, size_t next_step, std::string_view text,
                                  const Emit& emit) const {
  std::string prefixed;
  if (byte_level.add_prefix_space && text.front() != ' ') {
    prefixed.reserve(text.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(text);
    text = prefixed;
  }
  if (!byte_level.use_regex) return run(next_step, text, emit);
  for_each_isolated(*gpt2_pattern_, text, [&](std::string_view piece) { run(next_step, piece, emit); });
}

}  // namespace fsdpq::data
