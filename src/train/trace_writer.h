// `profile = true`: a chrome-trace / Perfetto timeline of the step phases, one file per rank
// (output_dir/trace.rank<R>.json; open it in ui.perfetto.dev or chrome://tracing). Events are
// written as they end, in the JSON array format, whose closing bracket the viewers do not need:
// a run that is killed still leaves a readable trace.
#pragma once
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace fsdpq {

class TraceWriter {
 public:
  using Clock = std::chrono::steady_clock;

  TraceWriter() = default;  // disabled: every call does nothing
  TraceWriter(const std::filesystem::path& path, int rank);
  ~TraceWriter();
  TraceWriter(TraceWriter&& other) noexcept;
  TraceWriter& operator=(TraceWriter&& other) noexcept;
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  bool enabled() const { return file_ != nullptr; }
  // A span on lane `lane` ("step", "compute", "comm"), times relative to the writer's start.
  void span(const std::string& name, const char* lane, Clock::time_point begin, Clock::time_point end,
            const nlohmann::json& args = nlohmann::json::object());
  void close();  // writes the closing bracket

 private:
  std::FILE* file_ = nullptr;
  int rank_ = 0;
  Clock::time_point origin_;
  bool first_ = true;
};

}  // namespace fsdpq
