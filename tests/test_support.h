// Helpers shared by the test suites: temporary folders, the real data in ../shared/data,
// and running the fsdpq binary as a user would.
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <string>

#include "util/error.h"

namespace fsdpq::test {

// A fresh, empty folder under the system temp dir (removed at process exit).
std::filesystem::path make_temp_dir(const std::string& tag);

// ../shared/data beside the repo, or $FSDPQ_SHARED_DATA; nullopt when absent.
std::optional<std::filesystem::path> shared_data_dir();

void write_file(const std::filesystem::path& path, const std::string& content);
std::string read_file(const std::filesystem::path& path);

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};
// Runs a shell command (through /bin/sh), capturing its output and exit code.
CommandResult run_command(const std::string& command);
// Runs the fsdpq binary built beside the tests with the given (already quoted) arguments.
CommandResult run_fsdpq(const std::string& args);
// `text` (a path, say) quoted for /bin/sh.
std::string quoted(const std::string& text);
// The message of the error line fsdpq printed, without its "fsdpq: error: " prefix, or the whole
// output when there is none.
std::string error_message(const std::string& output);

// The message of the UserError that `f` throws, or "<no error>" when it throws none.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace fsdpq::test

// Skips the test, loudly, when ../shared/data (or one file in it) is missing.
#define FSDPQ_SHARED_DATA_OR_SKIP(var, file)                                                     \
  auto var##_dir = ::fsdpq::test::shared_data_dir();                                             \
  if (!var##_dir || !std::filesystem::exists(*var##_dir / (file)))                               \
    GTEST_SKIP() << "shared data file '" << (file) << "' not found in ../shared/data or "        \
                 << "$FSDPQ_SHARED_DATA: skipping this test";                                    \
  const std::filesystem::path var = *var##_dir / (file)
