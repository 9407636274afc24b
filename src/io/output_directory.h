// A directory that a command (init-model, merge) writes whole or not at all: it is built under a
// temporary name beside its target and swapped into place once complete, so that a reader never
// finds half of one and a failed command leaves the target as it was.
#pragma once
#include <filesystem>
#include <string>

namespace fsdpq {

// `out` as the target of a new directory: absolute and normalised, without a trailing slash ("out/"
// is "out"). A path that names no directory (the root) is refused. `what` names the command in errors.
std::filesystem::path output_directory_target(const std::filesystem::path& out, const std::string& what);

// Refuses a target that exists but is not a directory, or is a directory that is not empty unless
// `overwrite`; `how_to_overwrite` ends that message ("pass --overwrite"). Errors name `out` as given.
void check_output_directory_free(const std::filesystem::path& target, const std::filesystem::path& out, bool overwrite,
                                 const std::string& what, const std::string& how_to_overwrite);

// The temporary directory a new target is written in: .NAME.partial-PID beside it.
class StagedDirectory {
 public:
  // Creates the target's parent directories and a fresh, empty staging directory.
  StagedDirectory(std::filesystem::path target, std::string what);
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;
  // Removes the staging directory unless it was committed.
  ~StagedDirectory();

  const std::filesystem::path& path() const { return path_; }
  // Swaps the completely written staging directory into place as the target
  // (swap_directory_into_place: an existing target is replaced only once the new one is there).
  void commit();

 private:
  std::filesystem::path target_;
  std::string what_;
  std::filesystem::path path_;
  bool committed_ = false;
};

}  // namespace fsdpq
