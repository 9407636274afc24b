// Errors that reach the user. A UserError is something the user can fix (a config key, a file,
// a record): its message already names the file, line or key and says what is allowed.
// Anything else escaping to main() is a bug in fsdpq and is reported as an internal error.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>
#include <utility>

namespace fsdpq {

struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw UserError(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace fsdpq
