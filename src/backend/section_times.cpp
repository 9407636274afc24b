#include "backend/section_times.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string_view>

#include "backend/cuda_backend.h"

#ifdef FSDPQ_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace fsdpq {
namespace {

using Clock = std::chrono::steady_clock;

// One mark on the stream: a CUDA event (GPU) or a time point (CPU backend).
struct Mark {
#ifdef FSDPQ_WITH_CUDA
  cudaEvent_t event = nullptr;
#endif
  Clock::time_point time;
};

struct Span {
  const char* name;
  int start, end;  // indices into marks
};

struct State {
  bool enabled = [] {
    const char* v = std::getenv("FSDPQ_SECTION_TIMES");
    return v != nullptr && std::string_view(v) == "1";
  }();
  bool on_gpu = false;  // decided at the first mark of a batch of spans
  std::vector<Mark> marks;  // pooled: events are created once
  int used = 0;
  std::vector<Span> spans;
  int open = 0;  // sections begun and not ended: marks are reused only when none is
  std::map<std::string, SectionTotal> totals;
};

State& state() {
  static State s;
  return s;
}

constexpr size_t kFlushEvery = 8192;  // spans kept before their times are read

int mark_now() {
  State& s = state();
  if (s.used == 0) s.on_gpu = cuda_initialized();
  if (s.used == static_cast<int>(s.marks.size())) s.marks.emplace_back();
  Mark& m = s.marks[static_cast<size_t>(s.used)];
#ifdef FSDPQ_WITH_CUDA
  if (s.on_gpu) {
    if (!m.event && cudaEventCreate(&m.event) != cudaSuccess) throw std::runtime_error("section times: event create");
    if (cudaEventRecord(m.event, static_cast<cudaStream_t>(cuda_compute_stream())) != cudaSuccess)
      throw std::runtime_error("section times: event record");
    return s.used++;
  }
#endif
  m.time = Clock::now();
  return s.used++;
}

void flush() {
  State& s = state();
  if (s.spans.empty() || s.open > 0) return;
#ifdef FSDPQ_WITH_CUDA
  if (s.on_gpu) cudaEventSynchronize(s.marks[static_cast<size_t>(s.spans.back().end)].event);
#endif
  for (const Span& span : s.spans) {
    const Mark &a = s.marks[static_cast<size_t>(span.start)], &b = s.marks[static_cast<size_t>(span.end)];
    double seconds = 0;
#ifdef FSDPQ_WITH_CUDA
    float ms = 0;
    if (s.on_gpu && cudaEventElapsedTime(&ms, a.event, b.event) == cudaSuccess) seconds = ms / 1e3;
    if (!s.on_gpu) seconds = std::chrono::duration<double>(b.time - a.time).count();
#else
    seconds = std::chrono::duration<double>(b.time - a.time).count();
#endif
    SectionTotal& t = s.totals[span.name];
    t.name = span.name;
    t.seconds += seconds;
    ++t.count;
  }
  s.spans.clear();
  s.used = 0;
}

}  // namespace

bool section_times_enabled() { return state().enabled; }
void set_section_times_enabled(bool enabled) { state().enabled = enabled; }

ScopedSection::ScopedSection(const char* name) {
  if (!state().enabled) return;
  name_ = name;
  start_ = mark_now();
  ++state().open;
}

ScopedSection::~ScopedSection() {
  if (start_ < 0) return;
  State& s = state();
  const int end = mark_now();
  --s.open;
  s.spans.push_back({name_, start_, end});
  if (s.spans.size() >= kFlushEvery) flush();
}

std::vector<SectionTotal> section_totals() {
  flush();
  std::vector<SectionTotal> out;
  for (const auto& [name, total] : state().totals) out.push_back(total);
  std::sort(out.begin(), out.end(), [](const SectionTotal& a, const SectionTotal& b) { return a.seconds > b.seconds; });
  return out;
}

void reset_section_times() {
  flush();
  state().totals.clear();
}

}  // namespace fsdpq
