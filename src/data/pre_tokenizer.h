// The pre-tokenizer of a byte-level tokenizer.json: the steps its "pre_tokenizer" lists (Split
// with the file's own regex, ByteLevel), cutting each stretch of text between added tokens into the
// pre-tokens that BPE encodes one by one. Pieces come out as Hugging Face's PreTokenizedString
// holds them: in order, empty ones dropped.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>
#include <variant>
#include <vector>

#include "data/unicode_regex.h"

namespace fsdpq::data {

// What Split does with the pieces its pattern matches (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

class PreTokenizer {
 public:
  struct Split {
    std::unique_ptr<UnicodeRegex> pattern;
    SplitBehavior behavior = SplitBehavior::Isolated;
    bool invert = false;  // the pattern matches what lies between delimiters
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

 private:
  void run(size_t step, std::string_view text, const Emit& emit) const;
  void run_split(const Split& split, size_t next_step, std::string_view text, const Emit& emit) const;
  void run_byte_level(const ByteLevel& byte_level, size_t next_step, std::string_view text,
                      const Emit& emit) const;

  std::vector<Step> steps_;
  std::unique_ptr<UnicodeRegex> gpt2_pattern_;  // ByteLevel's use_regex pattern, when needed
};

}  // namespace fsdpq::data
