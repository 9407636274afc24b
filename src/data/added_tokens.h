// Added tokens (special tokens such as <|begin_of_text|> and <|eot_id|>, and any others a
// tokenizer.json lists): found in the raw text before pre-tokenization, exactly the way Hugging
// Face's AddedVocabulary finds them (tokenizer/added_vocabulary.rs):
//  - leftmost-longest matching; a match that is rejected (single_word) still consumes its span;
//  - tokens with normalized = false are split out first, then tokens with normalized = true in
//    what is left (fsdpq supports no normalizer, so both passes see the raw text);
//  - lstrip / rstrip make the token swallow the whitespace before / after it;
//  - single_word keeps a match only when no word character touches it on either side.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fsdpq::data {

class UnicodeRegex;

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  bool special = false;
};

// One matching pass over a set of added tokens.
class AddedTokenPass {
 public:
  explicit AddedTokenPass(const std::vector<AddedToken>& tokens);
  ~AddedTokenPass();
  AddedTokenPass(AddedTokenPass&&) noexcept;

  // Splits `text` into text between tokens (on_text(string_view), possibly empty) and the tokens
  // found (on_token(id)), in order.
  template <class OnText, class OnToken>
  void split(std::string_view text, OnText&& on_text, OnToken&& on_token) const {
    size_t consumed = 0;  // where the text not yet handed out starts
    size_t from = 0;      // where the next search starts
    Found found;
    while (find(text, from, &found)) {
      from = found.end;
      size_t start = found.start, stop = found.end;
      if (!keep(text, found, consumed, &start, &stop)) continue;
      if (consumed < start) on_text(text.substr(consumed, start - consumed));
      on_token(found.token->id);
      consumed = stop;
    }
    if (consumed < text.size()) on_text(text.substr(consumed));
  }

  bool empty() const { return tokens_.empty(); }

 private:
  struct Found {
    size_t start = 0, end = 0;
    const AddedToken* token = nullptr;
  };
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> children;
    int32_t token = -1;  // index into tokens_ of the token ending here
  };
  // The leftmost-longest token occurrence starting at or after `from`.
  bool find(std::string_view text, size_t from, Found* found) const;
  // Applies single_word (false: drop the match) and lstrip / rstrip (widen [start, stop)).
  bool keep(std::string_view text, const Found& found, size_t consumed, size_t* start,
            size_t* stop) const;
  int32_t child(int32_t node, unsigned char byte) const;

  std::vector<AddedToken> tokens_;
  std::vector<Node> trie_;
  bool first_byte_[256] = {};
  std::unique_ptr<UnicodeRegex> word_char_;  // Rust regex's \w, for single_word
};

// Both passes: tokens with normalized = false first, then those with normalized = true.
class AddedTokenMatcher {
 public:
  explicit AddedTokenMatcher(const std::vector<AddedToken>& tokens);

  template <class OnText, class OnToken>
  void split(std::string_view text, OnText&& on_text, OnToken&& on_token) const {
    raw_.split(
        text,
        [&](std::string_view piece) {
          if (!piece.empty()) normalized_.split(piece, on_text, on_token);
        },
        on_token);
  }

 private:
  static std::vector<AddedToken> select(const std::vector<AddedToken>& tokens, bool normalized);
  AddedTokenPass raw_, normalized_;
};

}  // namespace fsdpq::data
