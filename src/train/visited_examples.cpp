#include "train/visited_examples.h"

#include <algorithm>

#include "data/sampler.h"

namespace fsdpq {

std::vector<size_t> examples_the_run_visits(const RunLength& run) {
  const data::DistributedSampler sampler(run.examples, run.world_size, 0, run.seed);
  const int64_t per_rank = sampler.num_samples();
  // As the trainer steps: only whole accumulation steps of an epoch's micro-batches are run.
  const int64_t micro_batches = (per_rank + run.batch_size - 1) / run.batch_size;
  const int64_t steps_per_epoch = micro_batches / run.gradient_accumulation_steps;
  std::vector<char> visited(static_cast<size_t>(run.examples), 0);
  size_t count = 0;  // visited so far: once all are, later epochs add none
  int64_t steps = 0;
  for (int64_t epoch = 0; epoch < run.num_epochs && steps < run.total_steps && steps_per_epoch > 0 &&
                          count < visited.size();
       ++epoch) {
    const int64_t steps_now = std::min(steps_per_epoch, run.total_steps - steps);
    const int64_t samples_per_rank = std::min(per_rank, steps_now * run.gradient_accumulation_steps * run.batch_size);
    // Rank r reads positions r, r + world, … of the epoch's order: together, its first samples × world.
    const std::vector<int64_t> order = sampler.epoch_order(epoch);
    for (int64_t k = 0; k < samples_per_rank * run.world_size; ++k) {
      char& seen = visited[static_cast<size_t>(order[static_cast<size_t>(k)])];
      count += !seen;
      seen = 1;
    }
    steps += steps_now;
  }
  std::vector<size_t> indices;
  for (size_t i = 0; i < visited.size(); ++i)
    if (visited[i]) indices.push_back(i);
  return indices;
}

}  // namespace fsdpq
