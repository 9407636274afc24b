#include "data/leading_tokens.h"

#include <algorithm>
#include <limits>

namespace fsdpq::data {

namespace {

size_t saturating_product(size_t a, size_t b) {
  return b != 0 && a > std::numeric_limits<size_t>::max() / b ? std::numeric_limits<size_t>::max() : a * b;
}

}  // namespace

LeadingTokens encode_leading(const Tokenizer& tokenizer, std::string_view text, size_t count) {
  size_t budget = saturating_product(count, tokenizer.max_token_bytes());
  for (;;) {
    const size_t cut = tokenizer.cut_point(text, budget);
    if (cut >= text.size()) return {tokenizer.encode(text), true};
    LeadingTokens prefix{tokenizer.encode(text.substr(0, cut)), false};
    if (prefix.ids.size() >= count) return prefix;
    budget = saturating_product(std::max<size_t>(cut, 1), 2);  // grows even from an empty prefix
  }
}

}  // namespace fsdpq::data
