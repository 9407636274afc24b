#include "util/write_via_temp.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "util/error.h"

namespace fsdpq {
namespace fs = std::filesystem;

void write_via_temp(const fs::path& path, const std::function<void(std::ostream&)>& write, std::string_view what) {
  fs::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("cannot write '{}': {}", tmp.string(), std::strerror(errno));
    write(out);
    out.close();
    if (!out) fail("cannot write '{}': {}", tmp.string(), std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    fail("cannot move {} into place at '{}': {}", what.empty() ? "'" + tmp.string() + "'" : std::string(what),
         path.string(), why);
  }
}

}  // namespace fsdpq
