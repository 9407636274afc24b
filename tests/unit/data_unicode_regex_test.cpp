// UnicodeRegex: PCRE2 with Unicode properties, finding matches as Oniguruma / Rust regex do.
#include <gtest/gtest.h>

#include "data/unicode_regex.h"
#include "test_support.h"

namespace fsdpq::data {
namespace {

using Spans = std::vector<std::pair<size_t, size_t>>;

Spans matches(const std::string& pattern, std::string_view text, bool literal = false) {
  UnicodeRegex regex(pattern, literal, "test");
  Spans out;
  regex.for_each_match(text, [&](size_t start, size_t end) { out.emplace_back(start, end); });
  return out;
}

TEST(UnicodeRegex, EmptyMatchesAsOnigurumaFindsThem) {
  // No empty match where the previous match ended; one everywhere else.
  EXPECT_EQ(matches("a*", "baaac"), (Spans{{0, 0}, {1, 4}, {5, 5}}));
  EXPECT_EQ(matches("(?=\\p{Lu})", "aBcDe"), (Spans{{1, 1}, {3, 3}}));
  EXPECT_EQ(matches("x*", ""), (Spans{{0, 0}}));
  // Stepping past an empty match steps over a whole character, never into one.
  EXPECT_EQ(matches("(?=b)|(?<=\\x{e9})", "\xc3\xa9\xc3\xa9" "b"), (Spans{{2, 2}, {4, 4}}));
}

TEST(UnicodeRegex, UnicodePropertiesAndWhitespace) {
  EXPECT_EQ(matches("\\p{L}+", "h\xc3\xa9llo w\xc3\xb6rld"), (Spans{{0, 6}, {7, 13}}));
  EXPECT_EQ(matches("\\p{N}{1,3}", "12345\xd9\xa1"), (Spans{{0, 3}, {3, 7}}));  // ١: Arabic-Indic 1
  // \s is Unicode White_Space, NEL (U+0085) and NBSP included, as in Oniguruma and Rust.
  EXPECT_EQ(matches("\\s+", "a\xc2\x85\xc2\xa0" "b\xe3\x80\x80"), (Spans{{1, 5}, {6, 9}}));
  // Case-insensitive 's matches the long s, as Unicode case folding has it.
  EXPECT_EQ(matches("(?i:'s)", "'S 's '\xc5\xbf"), (Spans{{0, 2}, {3, 5}, {6, 9}}));
}

TEST(UnicodeRegex, LiteralPatterns) {
  EXPECT_EQ(matches("a.b", "a.b axb a.b", true), (Spans{{0, 3}, {8, 11}}));
  EXPECT_EQ(matches("(", "((", true), (Spans{{0, 1}, {1, 2}}));
}

TEST(UnicodeRegex, LongRunsOfOneClass) {
  // Llama-3's pattern over megabyte-long runs (its \s+(?!\S) backtracks over the whole run).
  const std::string pattern =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const std::string spaces = std::string(1 << 20, ' ') + "x";
  EXPECT_EQ(matches(pattern, spaces), (Spans{{0, (1 << 20) - 1}, {(1 << 20) - 1, (1 << 20) + 1}}));
  const std::string letters(2 << 20, 'a');
  EXPECT_EQ(matches(pattern, letters), (Spans{{0, 2 << 20}}));
}

TEST(UnicodeRegex, ARejectedPatternNamesItsSourceAndOffset) {
  EXPECT_EQ(test::error_of([] { UnicodeRegex("ab(?<x", false, "tokenizer 'f.json': pre_tokenizer Split"); }),
            "tokenizer 'f.json': pre_tokenizer Split: the regex \"ab(?<x\" is not one PCRE2 accepts: "
            "syntax error in subpattern name (missing terminator?) at offset 6; expected a regex in the "
            "Oniguruma / PCRE syntax that Hugging Face tokenizers use");
}

}  // namespace
}  // namespace fsdpq::data
