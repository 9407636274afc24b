// The train examples a run reads, so that only those are tokenized (docs/data.md, "What a run
// tokenizes"): with a million examples and max_steps = 2, a few dozen.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace fsdpq {

struct RunLength {
  int64_t examples = 0;  // train examples (after the cut to whole batches)
  int world_size = 1;
  uint64_t seed = 0;  // the sampler's
  int64_t batch_size = 1;
  int64_t gradient_accumulation_steps = 1;
  int64_t num_epochs = 1;
  int64_t total_steps = 0;  // optimizer steps of the run (BatchPlan::total_steps)
};

// The indices, ascending, of every example the training loop hands a rank in any of its steps:
// epoch after epoch, each rank's sampler indices (DistributedSampler, shuffled over all the
// examples) of the micro-batches of the epoch's steps, until total_steps. A run resumed at a later
// step reads a subset of these.
std::vector<size_t> examples_the_run_visits(const RunLength& run);

}  // namespace fsdpq
