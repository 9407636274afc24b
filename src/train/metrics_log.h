// output_dir/metrics.jsonl: one JSON object per line — a run header, one line per optimizer
// step, eval results and a summary. Rank 0 writes it; each line is flushed as it is written so
// a killed run keeps every completed step. (The analysis scripts read this file.)
#pragma once
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace fsdpq {

class MetricsLog {
 public:
  MetricsLog() = default;  // disabled: writes nothing (ranks other than 0)
  // Appends when resuming, else starts the file afresh.
  MetricsLog(const std::filesystem::path& path, bool append);
  MetricsLog(MetricsLog&&) noexcept;
  MetricsLog& operator=(MetricsLog&&) noexcept;
  ~MetricsLog();

  void write(const nlohmann::json& record);
  bool enabled() const { return file_ != nullptr; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::FILE* file_ = nullptr;
  std::filesystem::path path_;
};

}  // namespace fsdpq
