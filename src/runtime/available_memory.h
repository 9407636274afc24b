// How much host memory this process may still allocate: the kernel's MemAvailable (/proc/meminfo)
// and the tightest memory cgroup limit above the process (cgroup v2 memory.max minus
// memory.current; v1 memory.limit_in_bytes minus memory.usage_in_bytes; page cache the kernel can
// drop counted as free), whichever is lower. Read under a root folder so that tests can point it at
// fixture files; the program reads "/" (or $FSDPQ_HOST_ROOT).
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdpq {

struct CgroupMemory {
  std::filesystem::path dir;  // the limited cgroup's folder
  int64_t limit = 0;
  int64_t in_use = 0;  // usage less the page cache it can drop (active_file + inactive_file)
  int64_t available() const { return limit > in_use ? limit - in_use : 0; }
};

struct AvailableMemory {
  std::optional<int64_t> mem_available;  // /proc/meminfo MemAvailable
  std::optional<CgroupMemory> cgroup;    // the level whose limit leaves least; none when unlimited
  // The lower of the two; nullopt when neither is known.
  std::optional<int64_t> bytes() const;
  // "MemAvailable 20.00 GiB; cgroup /sys/fs/cgroup/job: limit 16.00 GiB, 4.00 GiB in use".
  std::string sources() const;
  // "12.00 GiB (" + sources() + ")".
  std::string describe() const;
};

// The figures as read under `root` ("/": this machine).
AvailableMemory read_available_memory(const std::filesystem::path& root);
// The root the program reads: $FSDPQ_HOST_ROOT when set (tests), else "/".
std::filesystem::path host_root();

// ---- the parts, for tests ---------------------------------------------------------------------

// MemAvailable of a /proc/meminfo text, in bytes.
std::optional<int64_t> parse_mem_available(std::string_view meminfo);

// The folders of this process's memory cgroups (v2 and v1), from /proc/self/cgroup and
// /proc/self/mountinfo texts, each with the mount point a walk up towards the root stops at.
struct CgroupDir {
  int version = 2;
  std::filesystem::path dir;    // as the mount point shows it (not prefixed with a test root)
  std::filesystem::path mount;  // its hierarchy's mount point
};
std::vector<CgroupDir> memory_cgroup_dirs(std::string_view proc_self_cgroup, std::string_view mountinfo);

// One cgroup folder's limit and use; nullopt when it sets no limit (or has no such files).
std::optional<CgroupMemory> read_cgroup_level(const std::filesystem::path& dir, int version);

}  // namespace fsdpq
