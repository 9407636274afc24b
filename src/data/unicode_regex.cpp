#include "data/unicode_regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <nlohmann/json.hpp>

#include "util/error.h"

namespace fsdpq::data {

namespace {

// The pattern as a JSON string, as it is written in a tokenizer.json.
std::string quoted(std::string_view pattern) {
  return nlohmann::json(std::string(pattern)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof buffer) < 0) return fmt::format("PCRE2 error {}", code);
  return reinterpret_cast<const char*>(buffer);
}

// Each thread's match data and JIT stack, shared by every pattern (matching never writes to the
// compiled pattern, so patterns are shared between threads as they are).
class ThreadMatchState {
 public:
  ThreadMatchState()
      : data_(pcre2_match_data_create(1, nullptr)),
        context_(pcre2_match_context_create(nullptr)),
        // JIT backtracking frames live here, growing as needed up to 8 MiB. Llama-3's pattern
        // runs in the 32 KiB default even over megabyte-long runs, but a file's pattern with
        // repeated groups may backtrack deeper; past the limit matching fails with a clear error.
        jit_stack_(pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr)) {
    if (!data_ || !context_) throw std::bad_alloc();
    if (jit_stack_) pcre2_jit_stack_assign(context_, nullptr, jit_stack_);  // null where PCRE2 has no JIT
  }
  ~ThreadMatchState() {
    pcre2_jit_stack_free(jit_stack_);  // accepts null
    pcre2_match_context_free(context_);
    pcre2_match_data_free(data_);
  }
  pcre2_match_data* data() { return data_; }
  pcre2_match_context* context() { return context_; }

 private:
  pcre2_match_data* data_;
  pcre2_match_context* context_;
  pcre2_jit_stack* jit_stack_;
};

ThreadMatchState& thread_match_state() {
  thread_local ThreadMatchState state;
  return state;
}

}  // namespace

UnicodeRegex::UnicodeRegex(std::string_view pattern, bool literal, const std::string& where)
    : where_(where) {
  // Unicode properties (\p{L}, \s beyond ASCII) need UCP; a literal has none (PCRE2 refuses both).
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error,
                        &offset, nullptr);
  if (!code_)
    fail("{}: the regex {} is not one PCRE2 accepts: {} at offset {}; expected a regex in the "
         "Oniguruma / PCRE syntax that Hugging Face tokenizers use",
         where, quoted(pattern), pcre2_message(error), offset);
  // Without JIT (a system that forbids executable memory) PCRE2 interprets the pattern: slower,
  // the same matches.
  pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
}

UnicodeRegex::~UnicodeRegex() { pcre2_code_free(code_); }

bool UnicodeRegex::find(std::string_view text, size_t from, size_t* start, size_t* end) const {
  ThreadMatchState& state = thread_match_state();
  int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), from,
                       PCRE2_NO_UTF_CHECK, state.data(), state.context());
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0)
    fail("{}: matching the split regex on a text of {} bytes failed: {}; the text may hold a "
         "run of one kind of character too long for the regex engine",
         where_, text.size(), pcre2_message(rc));
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data());
  *start = ovector[0];
  *end = ovector[1];
  return true;
}

size_t UnicodeRegex::next_char(std::string_view text, size_t at) {
  if (at >= text.size()) return at + 1;
  ++at;
  while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xC0) == 0x80) ++at;
  return at;
}

}  // namespace fsdpq::data
