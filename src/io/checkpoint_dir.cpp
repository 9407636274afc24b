#include "io/checkpoint_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <span>
#include <iterator>
#include <stdexcept>

#include "io/safetensors.h"  // write_all, sync_directory
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kStepPrefix = "step-";
constexpr std::string_view kStepSuffix = ".h5";
constexpr std::string_view kTempSuffix = ".tmp";

// A name that stays inside the directory it is looked up in.
bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

// The file name the marker in `dir` holds, or nullopt when there is no marker (or it is empty or
// names something outside the directory: then it is as good as none).
std::optional<std::string> read_marker(const fs::path& dir) {
  const fs::path marker = dir / kLatestMarkerName;
  std::error_code ec;
  if (!fs::exists(marker, ec)) return std::nullopt;
  std::ifstream in(marker, std::ios::binary);
  if (!in.is_open()) fail("cannot open the checkpoint marker '{}': {}", marker.string(), std::strerror(errno));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("cannot read the checkpoint marker '{}': {}", marker.string(), std::strerror(errno));
  const std::string name(trim(text));
  if (!is_plain_file_name(name)) return std::nullopt;
  return name;
}

// The step files (by step) and the temporary files of steps (by step) in `dir`.
struct DirectoryListing {
  std::map<int64_t, fs::path> checkpoints;
  std::multimap<int64_t, fs::path> temporaries;
};

DirectoryListing list_directory(const fs::path& dir) {
  DirectoryListing listing;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) fail("cannot list the checkpoint directory '{}': {}", dir.string(), ec.message());
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec) fail("cannot list the checkpoint directory '{}': {}", dir.string(), ec.message());
    std::error_code type_ec;
    if (!it->is_regular_file(type_ec)) continue;
    const std::string name = it->path().filename().string();
    if (std::optional<int64_t> step = checkpoint_step(name)) {
      listing.checkpoints.emplace(*step, it->path());
    } else if (starts_with(name, ".") && ends_with(name, kTempSuffix)) {
      // ".step-N.h5.tmp", as checkpoint_temp_path names the file of a write in progress
      const std::string inner = name.substr(1, name.size() - 1 - kTempSuffix.size());
      if (std::optional<int64_t> temp_step = checkpoint_step(inner)) listing.temporaries.emplace(*temp_step, it->path());
    }
  }
  if (ec) fail("cannot list the checkpoint directory '{}': {}", dir.string(), ec.message());
  return listing;
}

void remove_file(const fs::path& path) {
  std::error_code ec;
  fs::remove(path, ec);
  if (ec) fail("cannot remove the old checkpoint file '{}': {}", path.string(), ec.message());
}

}  // namespace

std::string checkpoint_file_name(int64_t step) {
  if (step < 0) throw std::logic_error(fmt::format("checkpoint step {} is negative", step));
  return fmt::format("{}{:08d}{}", kStepPrefix, step, kStepSuffix);
}

std::optional<int64_t> checkpoint_step(const std::string& file_name) {
  if (!starts_with(file_name, kStepPrefix) || !ends_with(file_name, kStepSuffix)) return std::nullopt;
  const std::string_view digits =
      std::string_view(file_name).substr(kStepPrefix.size(), file_name.size() - kStepPrefix.size() - kStepSuffix.size());
  // Only digits: no sign, no spaces (parse_int would take "-1" or "+1").
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return parse_int(digits);
}

std::optional<fs::path> find_latest_checkpoint(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  if (std::optional<std::string> marked = read_marker(dir)) {
    const fs::path path = dir / *marked;
    if (fs::is_regular_file(path, ec)) return path;
  }
  DirectoryListing listing = list_directory(dir);
  if (listing.checkpoints.empty()) return std::nullopt;
  return listing.checkpoints.rbegin()->second;
}

void mark_latest(const fs::path& dir, const std::string& file_name) {
  if (!is_plain_file_name(file_name))
    throw std::logic_error(fmt::format("checkpoint marker: '{}' is not a plain file name", file_name));
  const fs::path temp = dir / ".latest.tmp";
  const fs::path marker = dir / kLatestMarkerName;
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot create the checkpoint marker '{}': {}", temp.string(), std::strerror(errno));
  const std::string text = file_name + "\n";
  try {
    write_all(fd, std::as_bytes(std::span(text.data(), text.size())), temp);
  } catch (...) {
    ::close(fd);
    throw;
  }
  int rc;
  do {
    rc = ::fsync(fd);
  } while (rc != 0 && errno == EINTR);
  int err = errno;
  if (::close(fd) != 0 && rc == 0) {
    rc = -1;
    err = errno;
  }
  if (rc != 0) fail("cannot sync the checkpoint marker '{}' to storage: {}", temp.string(), std::strerror(err));
  if (std::rename(temp.c_str(), marker.c_str()) != 0)
    fail("cannot rename the checkpoint marker '{}' to '{}': {}", temp.string(), marker.string(), std::strerror(errno));
  sync_directory(dir);
}

std::vector<fs::path> prune_checkpoints(const fs::path& dir, int keep_last, const std::string& protect_name) {
  std::vector<fs::path> removed;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  const std::optional<std::string> marked = read_marker(dir);
  DirectoryListing listing = list_directory(dir);

  const int64_t newest = listing.checkpoints.empty() ? -1 : listing.checkpoints.rbegin()->first;
  std::vector<std::pair<int64_t, fs::path>> doomed;
  for (const auto& [step, path] : listing.temporaries)
    if (step < newest) doomed.emplace_back(step, path);
  if (keep_last > 0) {
    // Newest first; a protected file among the newest counts as one of them, an older one is kept
    // besides them.
    int kept = 0;
    for (auto it = listing.checkpoints.rbegin(); it != listing.checkpoints.rend(); ++it) {
      const std::string name = it->second.filename().string();
      const bool is_protected = name == protect_name || (marked && name == *marked);
      if (kept < keep_last) {
        ++kept;
      } else if (!is_protected) {
        doomed.emplace_back(it->first, it->second);
      }
    }
  }
  std::sort(doomed.begin(), doomed.end());
  for (const auto& [step, path] : doomed) {
    remove_file(path);
    removed.push_back(path);
    std::error_code ignored;
    fs::remove(path.parent_path() / (path.filename().string() + ".digest"), ignored);  // io/file_digest.h
  }
  return removed;
}

}  // namespace fsdpq
