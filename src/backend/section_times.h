// Where the compute stream's time goes, by named section, when FSDPQ_SECTION_TIMES=1: each
// ScopedSection marks the stream at its start and end (CUDA events on the GPU, the clock on the
// CPU backend) and section_totals() sums the spans by name. For choosing speed work: the trainer
// logs the table at the end of a run. Off, a section costs one branch. Sections are flat (a
// section inside another is counted in both) and belong to the thread that queues compute work.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fsdpq {

bool section_times_enabled();  // FSDPQ_SECTION_TIMES=1, read once per process

class ScopedSection {
 public:
  explicit ScopedSection(const char* name);  // `name` must outlive the process's sections (a literal)
  ~ScopedSection();
  ScopedSection(const ScopedSection&) = delete;
  ScopedSection& operator=(const ScopedSection&) = delete;

 private:
  const char* name_ = nullptr;
  int start_ = -1;
};

struct SectionTotal {
  std::string name;
  double seconds = 0;
  int64_t count = 0;
};

// Waits for the sections recorded so far, adds them to the totals and returns all totals,
// largest first.
std::vector<SectionTotal> section_totals();
void reset_section_times();
// For tests: turns recording on or off regardless of FSDPQ_SECTION_TIMES.
void set_section_times_enabled(bool enabled);

}  // namespace fsdpq
