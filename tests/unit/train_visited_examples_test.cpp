// The examples a run reads: exactly those the trainer's loop (EpochBatches over every rank, whole
// accumulation steps, total_steps) hands its ranks, so tokenizing only these changes nothing.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "data/sampler.h"
#include "train/epoch_batches.h"
#include "train/visited_examples.h"

namespace fsdpq {
namespace {

// `n` examples whose one token is their index; only those in `tokenized` exist.
data::ExampleSet indexed_examples(size_t n, const std::vector<size_t>& tokenized) {
  std::vector<data::Example> made;
  for (size_t i : tokenized) {
    data::Example e;
    e.input_ids = e.labels = {static_cast<int32_t>(i)};
    e.full_length = 1;
    made.push_back(e);
  }
  return data::ExampleSet(n, tokenized, std::move(made));
}

// The trainer's loop (src/train/trainer.cpp) on every rank, from optimizer step `first_step` (a
// resumed run starts its epoch after the samples of the steps done): the examples its batches hold.
std::set<size_t> read_by_the_training_loop(const RunLength& run, const data::ExampleSet& examples,
                                           int64_t first_step = 0) {
  std::set<size_t> read;
  const int64_t global_batch = run.batch_size * run.gradient_accumulation_steps * run.world_size;
  for (int rank = 0; rank < run.world_size; ++rank) {
    const data::DistributedSampler sampler(run.examples, run.world_size, rank, run.seed);
    int64_t step = first_step;
    const int64_t steps_per_epoch =
        (sampler.num_samples() + run.batch_size - 1) / run.batch_size / run.gradient_accumulation_steps;
    for (int64_t epoch = first_step / steps_per_epoch; epoch < run.num_epochs && step < run.total_steps; ++epoch) {
      const int64_t samples_in_epoch = epoch == first_step / steps_per_epoch ? (first_step % steps_per_epoch) * global_batch : 0;
      EpochBatches batches(examples, sampler, epoch, BatchShape{run.batch_size, -1, 1 << 20, false, false},
                           samples_in_epoch);
      const int64_t usable = batches.size() / run.gradient_accumulation_steps * run.gradient_accumulation_steps;
      for (int64_t i = 0; i < usable && step < run.total_steps; ++i) {
        const data::Batch batch = batches.batch(i);
        for (int64_t row = 0; row < batch.batch_size; ++row)
          read.insert(static_cast<size_t>(batch.input_ids[static_cast<size_t>(row * batch.seq_len)]));
        if ((i + 1) % run.gradient_accumulation_steps == 0) ++step;
      }
    }
  }
  return read;
}

int64_t steps_per_epoch(const RunLength& r) {
  const int64_t per_rank = (r.examples + r.world_size - 1) / r.world_size;
  return (per_rank + r.batch_size - 1) / r.batch_size / r.gradient_accumulation_steps;
}

TEST(VisitedExamples, AreExactlyWhatTheTrainingLoopReads) {
  size_t partial = 0, whole = 0;
  for (int64_t examples : {12, 30, 97})
    for (int world : {1, 2, 3})
      for (int64_t batch : {1, 3})
        for (int64_t accumulation : {1, 2})
          for (int64_t epochs : {1, 3}) {
            RunLength run{examples, world, 42, batch, accumulation, epochs, 0};
            const int64_t per_epoch = steps_per_epoch(run);
            if (per_epoch == 0) continue;
            for (int64_t total : {int64_t{1}, per_epoch / 2 + 1, per_epoch + 1, per_epoch * epochs}) {
              run.total_steps = std::min(total, per_epoch * epochs);
              const std::string what = fmt::format("{} examples, {} ranks, batch {} × {}, {} epochs, {} steps",
                                                   examples, world, batch, accumulation, epochs, run.total_steps);
              const std::vector<size_t> visited = examples_the_run_visits(run);
              std::vector<size_t> everything(static_cast<size_t>(examples));
              for (size_t i = 0; i < everything.size(); ++i) everything[i] = i;
              // Reading only the visited examples never asks for another (which would throw).
              const std::set<size_t> read = read_by_the_training_loop(run, indexed_examples(everything.size(), visited));
              EXPECT_EQ(std::vector<size_t>(read.begin(), read.end()), visited) << what;
              // A run resumed at a later step reads some of them.
              if (run.total_steps > 1)
                EXPECT_NO_THROW(read_by_the_training_loop(run, indexed_examples(everything.size(), visited),
                                                          run.total_steps - 1))
                    << what;
              (visited.size() < everything.size() ? partial : whole) += 1;
            }
          }
  EXPECT_GT(partial, 0u);
  EXPECT_GT(whole, 0u);
}

TEST(VisitedExamples, AMillionExamplesAndTwoStepsReadAFew) {
  const RunLength run{1000000, 2, 42, 4, 2, 1, 2};
  const std::vector<size_t> visited = examples_the_run_visits(run);
  EXPECT_EQ(visited.size(), 2u * 4 * 2 * 2);  // steps × batch × accumulation × ranks
  const std::vector<int64_t> order = data::DistributedSampler(1000000, 2, 0, 42).epoch_order(0);
  std::vector<size_t> first(order.begin(), order.begin() + 32);
  std::sort(first.begin(), first.end());
  EXPECT_EQ(visited, first) << "the first 32 of the shuffled order, over the whole million";
}

}  // namespace
}  // namespace fsdpq
