// The directories a training run writes into (output_dir, checkpoint_dir): claimed for the run's
// life so that two runs never interleave their files, checked for a previous run's results so that
// a fresh run never mixes with (or silently truncates) them, and the metrics of a continued run
// rewound so that no step is counted twice (docs/checkpoints.md, "Run directories").
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace fsdpq {

// The lock file a run holds in each directory it claims.
inline constexpr const char* kRunLockName = ".fsdpq.lock";

// An exclusive claim on a directory: flock(2) on DIR/.fsdpq.lock, held until destruction or the
// end of the process (the kernel releases it then, so a killed run leaves no stale lock). The file
// records the holder (pid, host, start time) for the error a second run gets.
class DirectoryLock {
 public:
  DirectoryLock() = default;
  // Creates `dir` (and its parents) when missing. UserError naming `key` and the directory when it
  // cannot be created or written (the errno text says why), or when another process holds the lock
  // (naming that process). Where the file system has no locks (ENOLCK, ENOSYS, EOPNOTSUPP: some
  // parallel file systems without `-o flock`) the claim is not exclusive: `exclusive()` is false
  // and `warning()` says so.
  static DirectoryLock acquire(const std::filesystem::path& dir, const std::string& key);

  DirectoryLock(DirectoryLock&& other) noexcept;
  DirectoryLock& operator=(DirectoryLock&& other) noexcept;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  ~DirectoryLock();

  bool exclusive() const { return fd_ >= 0 && warning_.empty(); }
  const std::string& warning() const { return warning_; }

 private:
  int fd_ = -1;
  std::string warning_;
};

// Creates `dir` when missing and proves it writable by creating and removing a probe file.
// UserError naming `key`, the directory and the cause ("Permission denied", "Not a directory",
// "No space left on device", ...).
void check_writable_directory(const std::filesystem::path& dir, const std::string& key);

// For a directory that does not exist yet (a dry run creates nothing): UserError naming `key` when
// it could not be created — a part of its path is a file, or its nearest existing ancestor is not
// writable (probed there with a file created and removed).
void check_creatable_directory(const std::filesystem::path& dir, const std::string& key);

// What an earlier run left in a run's directories: the files fsdpq writes there.
struct PreviousRun {
  int64_t logged_steps = 0;                  // step records in metrics.jsonl
  std::optional<int64_t> newest_checkpoint;  // the highest checkpoint step in checkpoint_dir
  int checkpoints = 0;
  std::vector<std::filesystem::path> files;  // every file found, in a stable order

  bool empty() const { return files.empty(); }
  // "metrics.jsonl with 12 steps, 3 checkpoints (newest: step 12)".
  std::string describe() const;
};

// Looks for metrics.jsonl, train.log and trace.rank*.json in output_dir and for checkpoints
// (step files, their digests, temporaries and the `latest` marker) in checkpoint_dir. Missing
// directories hold nothing.
PreviousRun find_previous_run(const std::filesystem::path& output_dir, const std::filesystem::path& checkpoint_dir);

// Removes the files `run` lists (overwrite = true). UserError naming a file that cannot be removed.
void remove_previous_run(const PreviousRun& run);

// Rewinds the metrics file of a run that continues from `step` (a checkpoint's, or 0 when a
// resumed run found none): each step, eval, summary and preempted record of a later step becomes
// {"type": "superseded", "superseded_type": <its type>, ...} with its fields kept, so no reader
// that selects "step" records counts a redone step twice. A last line cut off mid-record (a run
// killed while writing it) is dropped, so that the next record starts on a line of its own. The
// file is rewritten through a temporary and renamed. Returns the number of records superseded; a
// missing file supersedes nothing. UserError naming the file on I/O errors.
int64_t supersede_records_after(const std::filesystem::path& metrics_file, int64_t step);

}  // namespace fsdpq
