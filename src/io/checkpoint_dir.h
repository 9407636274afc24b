// A directory of checkpoints, one file per step: step-00000042.h5 (see checkpoint_file.h), the
// `latest` marker naming the checkpoint to resume from, and pruning of older ones. Plain file
// system work, done by one rank; no MPI.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace fsdpq {

// The marker file: one line holding the file name of the newest complete checkpoint.
inline constexpr const char* kLatestMarkerName = "latest";

// "step-00000042.h5" for step 42 (steps past 99999999 get more digits); std::logic_error when < 0.
std::string checkpoint_file_name(int64_t step);

// The step of a checkpoint file name ("step-<digits>.h5"), or nullopt for any other name.
std::optional<int64_t> checkpoint_step(const std::string& file_name);

// The checkpoint to resume from: the file the `latest` marker names, when it exists; otherwise the
// highest-step step-*.h5 file (temporary .tmp files and names that do not parse never count);
// nullopt when there is none or `dir` does not exist. A UserError names the path when the
// directory or the marker cannot be read.
std::optional<std::filesystem::path> find_latest_checkpoint(const std::filesystem::path& dir);

// Makes `file_name` (a file in `dir`) the `latest` marker's content, atomically: the marker is
// written as .latest.tmp, synced and renamed, so a crash leaves the old or the new marker.
// std::logic_error when file_name is not a plain file name; UserError naming the path on I/O errors.
void mark_latest(const std::filesystem::path& dir, const std::string& file_name);

// Deletes all but the newest `keep_last` step files (keep_last <= 0 keeps them all), never the one
// named `protect_name` nor the one the `latest` marker names (kept besides the newest when older),
// and the temporary files
// .step-N.h5.tmp of steps N older than the newest checkpoint (writes that never committed; one
// of a newer step may be in progress). Returns the removed paths, oldest first. A missing `dir`
// has nothing to prune; a UserError names the path when listing or removing fails.
std::vector<std::filesystem::path> prune_checkpoints(const std::filesystem::path& dir, int keep_last,
                                                     const std::string& protect_name);

}  // namespace fsdpq
