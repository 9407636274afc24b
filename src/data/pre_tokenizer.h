// The pre-tokenizer of a byte-level tokenizer.json: the steps its "pre_tokenizer" lists (Split
// with the file's own regex, ByteLevel), cutting each stretch of text between added tokens into the
// pre-tokens that BPE encodes one by one. Pieces come out as Hugging Face's PreTokenizedString
// holds them: in order, empty ones dropped.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "data/unicode_regex.h"

namespace fsdpq::data {

// Meta's Llama-3 split pattern (its tokenizer.py's pat_str; the same text in a Llama-3 tokenizer.json).
inline constexpr std::string_view kLlama3SplitPattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// What Split does with the pieces its pattern matches (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class PreTokenizer {
 public:
  struct Split {
    std::unique_ptr<UnicodeRegex> pattern;
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;  // the pattern matches what lies between delimiters
    std::string source;   // the pattern as the file gives it (a regex)
  };
  struct ByteLevel {
    bool add_prefix_space = false;  // a space before each piece that lacks one
    bool use_regex = false;         // split with GPT-2's own pattern first
  };
  using Step = std::variant<Split, ByteLevel>;
  using Emit = std::function<void(std::string_view piece)>;

  explicit PreTokenizer(std::vector<Step> steps);
  ~PreTokenizer();
  PreTokenizer(PreTokenizer&&) noexcept;

  // Calls emit(piece) for each pre-token of `text` (valid UTF-8). Thread-safe.
  void split(std::string_view text, const Emit& emit) const;

  // Whether this is Llama-3's pre-tokenizer: its split pattern (Isolated), then at most a ByteLevel
  // step that adds no space and splits nothing. No pre-token it makes spans the end of a word
  // (an ASCII letter followed by a space or a newline): see BpeTokenizer::cut_point.
  bool splits_as_llama3() const;

 private:
  void run(size_t step, std::string_view text, const Emit& emit) const;
  void run_split(const Split& split, size_t next_step, std::string_view text, const Emit& emit) const;
  void run_byte_level(const ByteLevel& byte_level, size_t next_step, std::string_view text,
                      const Emit& emit) const;

  std::vector<Step> steps_;
  std::unique_ptr<UnicodeRegex> gpt2_pattern_;  // ByteLevel's use_regex pattern, when needed
};

}  // namespace fsdpq::data
