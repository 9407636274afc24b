#include "runtime/host_memory.h"

#include <fstream>
#include <sstream>
#include <string>

namespace fsdpq {

HostMemory host_memory() {
  HostMemory m;
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = 0;
    if (!(fields >> key >> kib)) continue;
    if (key == "VmHWM:") m.peak_resident = kib * 1024;
    if (key == "RssAnon:") m.private_now = kib * 1024;
    if (key == "RssFile:") m.file_mapped_now = kib * 1024;
  }
  return m;
}

}  // namespace fsdpq
