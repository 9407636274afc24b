// This process's host memory, from /proc/self/status (Linux): the peak resident set (VmHWM,
// counting mapped file pages too) and what is resident now, split into private memory (RssAnon:
// what this rank really costs) and mapped files (RssFile: page cache shared with other ranks).
#pragma once
#include <cstdint>

namespace fsdpq {

struct HostMemory {
  int64_t peak_resident = 0;
  int64_t private_now = 0;
  int64_t file_mapped_now = 0;
};

HostMemory host_memory();  // zeros where /proc is not available

}  // namespace fsdpq
