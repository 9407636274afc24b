#include "train/trace_writer.h"

#include <cerrno>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include <utility>

#include "util/error.h"

namespace fsdpq {

TraceWriter::TraceWriter(const std::filesystem::path& path, int rank) : rank_(rank), origin_(Clock::now()) {
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) fail("profile = true: cannot write the trace {}: {}", path.string(), std::strerror(errno));
  std::fputs("[\n", file_);
  // Name the process and lanes so the viewer shows "rank 0: step / compute / comm".
  const nlohmann::json meta = {{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", fmt::format("rank {}", rank_)}}}};
  std::fputs(meta.dump().c_str(), file_);
  first_ = false;
}

TraceWriter::~TraceWriter() { close(); }

TraceWriter::TraceWriter(TraceWriter&& other) noexcept
    : file_(std::exchange(other.file_, nullptr)), rank_(other.rank_), origin_(other.origin_), first_(other.first_) {}

TraceWriter& TraceWriter::operator=(TraceWriter&& other) noexcept {
  if (this != &other) {
    close();
    file_ = std::exchange(other.file_, nullptr);
    rank_ = other.rank_;
    origin_ = other.origin_;
    first_ = other.first_;
  }
  return *this;
}

void TraceWriter::span(const std::string& name, const char* lane, Clock::time_point begin, Clock::time_point end,
                       const nlohmann::json& args) {
  if (!file_) return;
  static std::mutex one_writer;  // the CPU-offload worker writes spans from its own thread
  const std::lock_guard<std::mutex> lock(one_writer);
  auto us = [&](Clock::time_point t) { return std::chrono::duration<double, std::micro>(t - origin_).count(); };
  const nlohmann::json event = {{"name", name}, {"cat", lane},          {"ph", "X"},
                                {"pid", rank_}, {"tid", std::string(lane)}, {"ts", us(begin)},
                                {"dur", us(end) - us(begin)}, {"args", args}};
  std::fputs(first_ ? "" : ",\n", file_);
  std::fputs(event.dump().c_str(), file_);
  first_ = false;
  std::fflush(file_);  // a killed run keeps every finished span
}

void TraceWriter::close() {
  if (!file_) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

}  // namespace fsdpq
