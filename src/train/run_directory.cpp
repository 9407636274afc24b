#include "train/run_directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <utility>

#include "io/checkpoint_dir.h"
#include "io/safetensors.h"  // write_all, sync_directory
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace fs = std::filesystem;
namespace {

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

std::string utc_now() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S UTC", &tm);
  return text;
}

std::string read_small_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return std::string(trim(text));
}

void create_directory(const fs::path& dir, const std::string& key) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("{} '{}': cannot create the directory: {}", key, dir.string(), ec.message());
  if (!fs::is_directory(dir, ec)) fail("{} '{}': exists and is not a directory", key, dir.string());
}

bool locks_unsupported(int err) { return err == ENOLCK || err == ENOSYS || err == EOPNOTSUPP || err == EINVAL; }

// Writes `text` to `path` through a temporary file, synced and renamed into place.
void replace_file(const fs::path& path, const std::string& text) {
  const fs::path temp = path.parent_path() / fmt::format(".{}.tmp", path.filename().string());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("cannot rewrite '{}': cannot create '{}': {}", path.string(), temp.string(), std::strerror(errno));
  try {
    write_all(fd, std::as_bytes(std::span(text.data(), text.size())), temp);
  } catch (...) {
    ::close(fd);
    ::unlink(temp.c_str());
    throw;
  }
  const int synced = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (synced != 0) {
    ::unlink(temp.c_str());
    fail("cannot rewrite '{}': syncing '{}' failed: {}", path.string(), temp.string(), std::strerror(err));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int rename_err = errno;
    ::unlink(temp.c_str());
    fail("cannot rewrite '{}': renaming '{}' onto it failed: {}", path.string(), temp.string(),
         std::strerror(rename_err));
  }
  sync_directory(path.parent_path().empty() ? fs::path(".") : path.parent_path());
}

// The records a continued run redoes when they are about a step after the one it continues from.
bool is_step_bound(const std::string& type) {
  return type == "step" || type == "eval" || type == "summary" || type == "preempted";
}

}  // namespace

DirectoryLock DirectoryLock::acquire(const fs::path& dir, const std::string& key) {
  create_directory(dir, key);
  const fs::path path = dir / kRunLockName;
  DirectoryLock lock;
  lock.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock.fd_ < 0) fail("{} '{}': cannot create the lock file '{}': {}", key, dir.string(), path.string(), std::strerror(errno));
  if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK) {
      const std::string holder = read_small_file(path);
      fail("{} '{}' is in use by another fsdpq run ({}): two runs in one directory would mix their checkpoints "
           "and metrics; wait for it to end or choose another {}",
           key, dir.string(), holder.empty() ? "its process is starting" : holder, key);
    }
    if (!locks_unsupported(err))
      fail("{} '{}': cannot lock '{}': {}", key, dir.string(), path.string(), std::strerror(err));
    lock.warning_ = fmt::format("{} '{}': the file system cannot lock '{}' ({}): nothing stops a second run from "
                                "writing into this directory at the same time",
                                key, dir.string(), path.string(), std::strerror(err));
  }
  // Who holds it, for the message a second run gets.
  const std::string holder = fmt::format("pid {} on host {}, started {}", ::getpid(), host_name(), utc_now());
  if (::ftruncate(lock.fd_, 0) == 0) {
    try {
      write_all(lock.fd_, std::as_bytes(std::span(holder.data(), holder.size())), path);
    } catch (const UserError&) {
      // Only the description is lost (a full disk shows at the probe next).
    }
  }
  return lock;
}

DirectoryLock::DirectoryLock(DirectoryLock&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), warning_(std::move(other.warning_)) {}

DirectoryLock& DirectoryLock::operator=(DirectoryLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    warning_ = std::move(other.warning_);
  }
  return *this;
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

void check_writable_directory(const fs::path& dir, const std::string& key) {
  create_directory(dir, key);
  const fs::path probe = dir / fmt::format(".fsdpq-probe.{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("{} '{}' is not writable: {}", key, dir.string(), std::strerror(errno));
  const char byte = 0;
  const bool wrote = ::write(fd, &byte, 1) == 1;
  const int err = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote) fail("{} '{}' is not writable: {}", key, dir.string(), std::strerror(err));
}

void check_creatable_directory(const fs::path& dir, const std::string& key) {
  std::error_code ec;
  fs::path existing = fs::absolute(dir, ec);
  while (!existing.empty() && !fs::exists(existing, ec) && existing.has_relative_path()) existing = existing.parent_path();
  if (!fs::is_directory(existing, ec))
    fail("{} '{}': cannot create the directory: '{}' is not a directory", key, dir.string(), existing.string());
  const fs::path probe = existing / fmt::format(".fsdpq-probe.{}", ::getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("{} '{}': cannot create the directory in '{}': {}", key, dir.string(), existing.string(), std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

std::string PreviousRun::describe() const {
  std::vector<std::string> parts;
  if (logged_steps > 0) parts.push_back(fmt::format("metrics.jsonl with {} step{}", logged_steps, logged_steps == 1 ? "" : "s"));
  if (checkpoints > 0)
    parts.push_back(fmt::format("{} checkpoint{} (newest: step {})", checkpoints, checkpoints == 1 ? "" : "s",
                                newest_checkpoint.value_or(0)));
  if (parts.empty()) parts.push_back(fmt::format("{} file{} of a run", files.size(), files.size() == 1 ? "" : "s"));
  return join(parts, ", ");
}

PreviousRun find_previous_run(const fs::path& output_dir, const fs::path& checkpoint_dir) {
  PreviousRun run;
  std::error_code ec;
  const fs::path metrics = output_dir / "metrics.jsonl";
  if (fs::is_regular_file(metrics, ec)) {
    run.files.push_back(metrics);
    std::ifstream in(metrics, std::ios::binary);
    std::string line;
    while (std::getline(in, line))
      if (line.find("\"type\":\"step\"") != std::string::npos) ++run.logged_steps;
  }
  auto add_matching = [&](const fs::path& dir, auto&& matches) {
    std::vector<fs::path> found;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code type_ec;
      if (it->is_regular_file(type_ec) && matches(it->path().filename().string())) found.push_back(it->path());
    }
    std::sort(found.begin(), found.end());
    run.files.insert(run.files.end(), found.begin(), found.end());
  };
  if (fs::is_directory(output_dir, ec))
    add_matching(output_dir, [](const std::string& name) {
      return name == "train.log" || (starts_with(name, "trace.rank") && ends_with(name, ".json"));
    });
  if (fs::is_directory(checkpoint_dir, ec))
    add_matching(checkpoint_dir, [&run](const std::string& name) {
      if (const std::optional<int64_t> step = checkpoint_step(name)) {
        ++run.checkpoints;
        run.newest_checkpoint = std::max(run.newest_checkpoint.value_or(*step), *step);
        return true;
      }
      if (name == kLatestMarkerName || name == ".latest.tmp") return true;
      // A checkpoint's digest (step-N.h5.digest) and the temporaries of unfinished writes (.step-N.h5.tmp).
      if (ends_with(name, ".digest")) return checkpoint_step(name.substr(0, name.size() - 7)).has_value();
      return starts_with(name, ".step-") && ends_with(name, ".tmp");
    });
  return run;
}

void remove_previous_run(const PreviousRun& run) {
  for (const fs::path& file : run.files) {
    std::error_code ec;
    fs::remove(file, ec);
    if (ec) fail("overwrite = true: cannot remove '{}' of the previous run: {}", file.string(), ec.message());
  }
}

int64_t supersede_records_after(const fs::path& metrics_file, int64_t step) {
  std::error_code ec;
  if (!fs::exists(metrics_file, ec)) return 0;
  std::ifstream in(metrics_file, std::ios::binary);
  if (!in) fail("cannot read the metrics file '{}' to continue it: {}", metrics_file.string(), std::strerror(errno));
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail("cannot read the metrics file '{}' to continue it: {}", metrics_file.string(), std::strerror(errno));

  std::string out;
  out.reserve(text.size() + 1024);
  int64_t superseded = 0;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t newline = text.find('\n', begin);
    if (newline == std::string::npos) break;  // cut off mid-record: dropped
    const std::string_view line(text.data() + begin, newline - begin);
    begin = newline + 1;
    nlohmann::json record = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    bool later = false;
    if (record.is_object() && record.contains("type") && record["type"].is_string() &&
        is_step_bound(record["type"].get<std::string>())) {
      const char* key = record["type"] == "summary" ? "steps" : "step";  // a summary counts the run's steps
      later = record.contains(key) && record[key].is_number() && record[key].get<double>() > static_cast<double>(step);
    }
    if (!later) {
      out.append(line);
      out += '\n';
      continue;
    }
    nlohmann::json marked = nlohmann::json::object();
    marked["type"] = "superseded";
    marked["superseded_type"] = record["type"];
    marked["superseded_by_resume_from_step"] = step;
    for (auto it = record.begin(); it != record.end(); ++it)
      if (it.key() != "type") marked[it.key()] = it.value();
    out += marked.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    out += '\n';
    ++superseded;
  }
  if (out.size() != text.size() || superseded > 0) replace_file(metrics_file, out);
  return superseded;
}

}  // namespace fsdpq
