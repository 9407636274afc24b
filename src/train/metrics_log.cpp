#include "train/metrics_log.h"

#include <cerrno>
#include <cstring>
#include <utility>

#include "util/error.h"

namespace fsdpq {

MetricsLog::MetricsLog(const std::filesystem::path& path, bool append) : path_(path) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  file_ = std::fopen(path.c_str(), append ? "ab" : "wb");
  if (!file_) fail("cannot write the metrics file '{}': {}", path.string(), std::strerror(errno));
}

MetricsLog::MetricsLog(MetricsLog&& other) noexcept
    : file_(std::exchange(other.file_, nullptr)), path_(std::move(other.path_)) {}

MetricsLog& MetricsLog::operator=(MetricsLog&& other) noexcept {
  if (this != &other) {
    if (file_) std::fclose(file_);
    file_ = std::exchange(other.file_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write(const nlohmann::json& record) {
  if (!file_) return;
  std::string line = record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    fail("cannot write to the metrics file '{}': {}", path_.string(), std::strerror(errno));
}

}  // namespace fsdpq
