#include "runtime/available_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "util/strings.h"

namespace fsdpq {
namespace fs = std::filesystem;

namespace {

// cgroup v1 writes "no limit" as the largest page-aligned signed 64-bit number.
constexpr int64_t kUnlimitedV1 = int64_t{1} << 62;

std::optional<std::string> read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::optional<int64_t> read_number(const fs::path& path) {
  const auto text = read_text(path);
  return text ? parse_int(trim(*text)) : std::nullopt;
}

// The number after `key` on a "key value [unit]" line of a memory.stat or meminfo text.
std::optional<int64_t> stat_value(std::string_view text, std::string_view key) {
  for (const std::string& line : split(text, '\n')) {
    const auto space = line.find_first_of(" \t");
    if (space == std::string::npos || line.substr(0, space) != key) continue;
    const std::string_view rest = trim(std::string_view(line).substr(space));
    return parse_int(rest.substr(0, rest.find_first_of(" \t")));
  }
  return std::nullopt;
}

// mountinfo escapes spaces, tabs, newlines and backslashes in paths as \ooo.
std::string unescape_mount_path(std::string_view path) {
  std::string out;
  for (size_t i = 0; i < path.size(); ++i) {
    if (path[i] == '\\' && i + 3 < path.size()) {
      const std::string digits(path.substr(i + 1, 3));
      if (digits.find_first_not_of("01234567") == std::string::npos) {
        out += static_cast<char>(std::strtol(digits.c_str(), nullptr, 8));
        i += 3;
        continue;
      }
    }
    out += path[i];
  }
  return out;
}

struct Mount {
  std::string root, point, fstype, super_options;
};

std::vector<Mount> cgroup_mounts(std::string_view mountinfo) {
  std::vector<Mount> mounts;
  for (const std::string& line : split(mountinfo, '\n')) {
    const std::vector<std::string> fields = split(line, ' ');
    const auto dash = std::find(fields.begin(), fields.end(), "-");
    if (fields.size() < 5 || dash == fields.end() || fields.end() - dash < 4) continue;
    Mount m{unescape_mount_path(fields[3]), unescape_mount_path(fields[4]), *(dash + 1), *(dash + 3)};
    if (m.fstype == "cgroup" || m.fstype == "cgroup2") mounts.push_back(m);
  }
  return mounts;
}

bool has_memory_controller(std::string_view list) {
  const std::vector<std::string> items = split(list, ',');
  return std::find(items.begin(), items.end(), "memory") != items.end();
}

// The folder of cgroup `path` under a mount of its hierarchy whose root is `m.root`.
fs::path folder_of(const std::string& path, const Mount& m) {
  if (m.root == "/") return (fs::path(m.point) / fs::path(path).relative_path()).lexically_normal();
  if (path == m.root || starts_with(path, m.root + "/"))
    return (fs::path(m.point) / fs::path(path.substr(m.root.size())).relative_path()).lexically_normal();
  return fs::path(m.point);  // outside the mount's view (a cgroup namespace): its top is ours
}

fs::path under_root(const fs::path& root, const fs::path& path) { return root / path.relative_path(); }

std::string gib(int64_t bytes) { return fmt::format("{:.2f} GiB", static_cast<double>(bytes) / (1024.0 * 1024 * 1024)); }

}  // namespace

std::optional<int64_t> AvailableMemory::bytes() const {
  if (mem_available && cgroup) return std::min(*mem_available, cgroup->available());
  if (mem_available) return mem_available;
  if (cgroup) return cgroup->available();
  return std::nullopt;
}

std::string AvailableMemory::sources() const {
  std::vector<std::string> parts;
  if (mem_available) parts.push_back("MemAvailable " + gib(*mem_available));
  if (cgroup)
    parts.push_back(fmt::format("cgroup {}: limit {}, {} in use", cgroup->dir.string(), gib(cgroup->limit),
                                gib(cgroup->in_use)));
  return parts.empty() ? "no /proc/meminfo MemAvailable, no cgroup memory limit" : join(parts, "; ");
}

std::string AvailableMemory::describe() const {
  const auto total = bytes();
  return total ? fmt::format("{} ({})", gib(*total), sources()) : "unknown (" + sources() + ")";
}

std::optional<int64_t> parse_mem_available(std::string_view meminfo) {
  const auto kib = stat_value(meminfo, "MemAvailable:");
  if (!kib || *kib < 0) return std::nullopt;
  return *kib * 1024;
}

std::vector<CgroupDir> memory_cgroup_dirs(std::string_view proc_self_cgroup, std::string_view mountinfo) {
  const std::vector<Mount> mounts = cgroup_mounts(mountinfo);
  std::vector<CgroupDir> dirs;
  for (const std::string& line : split(proc_self_cgroup, '\n')) {
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1), path = line.substr(second + 1);
    const bool v2 = line.substr(0, first) == "0" && controllers.empty();
    if (!v2 && !has_memory_controller(controllers)) continue;
    for (const Mount& m : mounts) {
      const bool match = v2 ? m.fstype == "cgroup2" : m.fstype == "cgroup" && has_memory_controller(m.super_options);
      if (!match) continue;
      dirs.push_back({v2 ? 2 : 1, folder_of(path, m), fs::path(m.point)});
      break;
    }
  }
  return dirs;
}

std::optional<CgroupMemory> read_cgroup_level(const fs::path& dir, int version) {
  CgroupMemory level;
  level.dir = dir;
  std::optional<int64_t> usage;
  std::string stat_prefix;
  if (version == 2) {
    const auto max = read_text(dir / "memory.max");
    if (!max || trim(*max) == "max") return std::nullopt;
    const auto limit = parse_int(trim(*max));
    if (!limit) return std::nullopt;
    level.limit = *limit;
    usage = read_number(dir / "memory.current");
  } else {
    const auto limit = read_number(dir / "memory.limit_in_bytes");
    if (!limit || *limit >= kUnlimitedV1) return std::nullopt;
    level.limit = *limit;
    usage = read_number(dir / "memory.usage_in_bytes");
    stat_prefix = "total_";  // v1's hierarchical figures, as usage_in_bytes is
  }
  if (!usage) return std::nullopt;
  // Page cache the kernel drops before it fails an allocation counts as free.
  int64_t droppable = 0;
  if (const auto stat = read_text(dir / "memory.stat"))
    for (const char* key : {"active_file", "inactive_file"})
      droppable += stat_value(*stat, stat_prefix + key).value_or(stat_value(*stat, key).value_or(0));
  level.in_use = std::max<int64_t>(0, *usage - droppable);
  return level;
}

AvailableMemory read_available_memory(const fs::path& root) {
  AvailableMemory m;
  if (const auto meminfo = read_text(root / "proc/meminfo")) m.mem_available = parse_mem_available(*meminfo);
  const auto self_cgroup = read_text(root / "proc/self/cgroup");
  const auto mountinfo = read_text(root / "proc/self/mountinfo");
  if (!self_cgroup || !mountinfo) return m;
  for (const CgroupDir& d : memory_cgroup_dirs(*self_cgroup, *mountinfo)) {
    // Every level up to the hierarchy's top limits the process: the one that leaves least counts.
    for (fs::path dir = d.dir;; dir = dir.parent_path()) {
      if (auto level = read_cgroup_level(under_root(root, dir), d.version)) {
        level->dir = dir;
        if (!m.cgroup || level->available() < m.cgroup->available()) m.cgroup = level;
      }
      if (dir == d.mount || !dir.has_relative_path() || dir == dir.parent_path()) break;
    }
  }
  return m;
}

fs::path host_root() {
  const char* root = std::getenv("FSDPQ_HOST_ROOT");
  return root && *root ? fs::path(root) : fs::path("/");
}

}  // namespace fsdpq
