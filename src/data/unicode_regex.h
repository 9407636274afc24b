// A Unicode regular expression (PCRE2: UTF-8, Unicode properties, JIT-compiled where the machine
// allows) that finds matches the way Hugging Face tokenizers' Oniguruma and tiktoken's Rust regex
// do, so a tokenizer file's split pattern pre-tokenizes exactly as theirs.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

struct pcre2_real_code_8;  // pcre2.h stays out of the headers that include this one

namespace fsdpq::data {

class UnicodeRegex {
 public:
  // `pattern` is a regex, or with `literal` a plain string to find. `where` names its source
  // (a file and key) for error messages: a pattern PCRE2 rejects is a UserError naming it, with
  // PCRE2's message and offset.
  UnicodeRegex(std::string_view pattern, bool literal, const std::string& where);
  ~UnicodeRegex();
  UnicodeRegex(const UnicodeRegex&) = delete;
  UnicodeRegex& operator=(const UnicodeRegex&) = delete;

  // Calls on_match(start, end) for each match in `text`, left to right, without overlaps. As in
  // Oniguruma's and Rust's find_iter, an empty match where the previous match ended is skipped.
  // `text` must be valid UTF-8 (callers check it once; PCRE2 would otherwise re-check it on every
  // search). Thread-safe: each thread uses its own match data.
  template <class OnMatch>  // void(size_t start, size_t end)
  void for_each_match(std::string_view text, OnMatch&& on_match) const {
    size_t from = 0, start = 0, end = 0;
    bool matched_before = false;
    size_t last_end = 0;
    while (from <= text.size() && find(text, from, &start, &end)) {
      if (start == end && matched_before && end == last_end) {
        from = next_char(text, from);  // no empty match where the last one ended: step one char
        continue;
      }
      on_match(start, end);
      matched_before = true;
      last_end = end;
      from = end;
    }
  }

  // The first match at or after byte `from`; false when there is none.
  bool find(std::string_view text, size_t from, size_t* start, size_t* end) const;

 private:
  // The byte after the UTF-8 character at `at` (one past the end when at the end).
  static size_t next_char(std::string_view text, size_t at);

  pcre2_real_code_8* code_ = nullptr;
  std::string where_;
};

}  // namespace fsdpq::data
