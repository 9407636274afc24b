#include "data/added_tokens.h"

#include <algorithm>

#include "data/unicode_regex.h"

namespace fsdpq::data {

namespace {

// Unicode's White_Space property (PropList.txt): what Rust regex's \s, which Hugging Face uses for
// lstrip / rstrip, matches.
bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  return 4;
}

uint32_t code_point_at(std::string_view text, size_t at) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const size_t n = utf8_length(byte(at));
  if (n == 1) return byte(at);
  uint32_t c = byte(at) & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) c = (c << 6) | (byte(at + i) & 0x3F);
  return c;
}

// The start of the UTF-8 character that ends just before `end` (> 0).
size_t previous_char(std::string_view text, size_t end) {
  size_t at = end - 1;
  while (at > 0 && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) --at;
  return at;
}

// Where the run of whitespace that ends at `end` starts (Rust's \s*$ on text[..end]).
size_t whitespace_run_start(std::string_view text, size_t end) {
  while (end > 0) {
    const size_t at = previous_char(text, end);
    if (!is_white_space(code_point_at(text, at))) break;
    end = at;
  }
  return end;
}

// Where the run of whitespace that starts at `start` ends (Rust's ^\s* on text[start..]).
size_t whitespace_run_end(std::string_view text, size_t start) {
  while (start < text.size() && is_white_space(code_point_at(text, start)))
    start += utf8_length(static_cast<unsigned char>(text[start]));
  return start;
}

}  // namespace

AddedTokenPass::AddedTokenPass(const std::vector<AddedToken>& tokens) : tokens_(tokens), trie_(1) {
  for (size_t t = 0; t < tokens_.size(); ++t) {
    const std::string& content = tokens_[t].content;
    if (content.empty()) continue;  // Hugging Face ignores empty added tokens
    first_byte_[static_cast<unsigned char>(content[0])] = true;
    int32_t node = 0;
    for (unsigned char byte : content) {
      int32_t next = child(node, byte);
      if (next < 0) {
        next = static_cast<int32_t>(trie_.size());
        trie_[node].children.emplace_back(byte, next);
        trie_.emplace_back();
      }
      node = next;
    }
    trie_[node].token = static_cast<int32_t>(t);
  }
  const bool any_single_word = std::any_of(tokens_.begin(), tokens_.end(),
                                           [](const AddedToken& t) { return t.single_word; });
  // Rust regex's Unicode \w, which Hugging Face's single_word check uses.
  if (any_single_word)
    word_char_ = std::make_unique<UnicodeRegex>(
        "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]", false, "the word-character class");
}

AddedTokenPass::~AddedTokenPass() = default;
AddedTokenPass::AddedTokenPass(AddedTokenPass&&) noexcept = default;

int32_t AddedTokenPass::child(int32_t node, unsigned char byte) const {
  for (const auto& [b, next] : trie_[node].children)
    if (b == byte) return next;
  return -1;
}

bool AddedTokenPass::find(std::string_view text, size_t from, Found* found) const {
  if (tokens_.empty()) return false;
  for (size_t start = from; start < text.size(); ++start) {
    if (!first_byte_[static_cast<unsigned char>(text[start])]) continue;
    int32_t node = 0, longest = -1;
    size_t longest_end = 0;
    for (size_t i = start; i < text.size(); ++i) {
      node = child(node, static_cast<unsigned char>(text[i]));
      if (node < 0) break;
      if (trie_[node].token >= 0) {
        longest = trie_[node].token;
        longest_end = i + 1;
      }
    }
    if (longest >= 0) {
      *found = {start, longest_end, &tokens_[longest]};
      return true;
    }
  }
  return false;
}

bool AddedTokenPass::keep(std::string_view text, const Found& found, size_t consumed, size_t* start,
                          size_t* stop) const {
  const AddedToken& token = *found.token;
  if (token.single_word) {
    const auto is_word = [&](size_t at, size_t end) {
      size_t match_start = 0, match_end = 0;
      return word_char_->find(text.substr(at, end - at), 0, &match_start, &match_end);
    };
    const bool word_before = found.start > 0 && is_word(previous_char(text, found.start), found.start);
    const bool word_after =
        found.end < text.size() &&
        is_word(found.end, found.end + utf8_length(static_cast<unsigned char>(text[found.end])));
    if (word_before || word_after) return false;
  }
  // lstrip never reaches back into what an earlier token already took.
  if (token.lstrip) *start = std::max(whitespace_run_start(text, found.start), consumed);
  if (token.rstrip) *stop = whitespace_run_end(text, found.end);
  return true;
}

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens)
    : raw_(select(tokens, false)), normalized_(select(tokens, true)) {}

std::vector<AddedToken> AddedTokenMatcher::select(const std::vector<AddedToken>& tokens,
                                                  bool normalized) {
  std::vector<AddedToken> out;
  for (const AddedToken& t : tokens)
    if (t.normalized == normalized) out.push_back(t);
  return out;
}

}  // namespace fsdpq::data
