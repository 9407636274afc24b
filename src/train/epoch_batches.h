// The micro-batches one rank sees in one epoch, as torch's
// DataLoader(dataset, batch_size, sampler=DistributedSampler(...)) yields them in fsdp_qlora:
// the sampler's indices for this rank and epoch, cut into batches (the last may be short),
// each collated (padded to its longest example, or to context_length).
#pragma once
#include <vector>

#include "data/collate.h"
#include "data/example_set.h"
#include "data/examples.h"
#include "data/sampler.h"

namespace fsdpq {

class EpochBatches {
 public:
  // `skip`: drop this rank's first `skip` indices (a run resumed mid-epoch starts after them).
  EpochBatches(const data::ExampleSet& examples, const data::DistributedSampler& sampler, int64_t epoch,
               int64_t batch_size, int32_t pad_id, int64_t context_length, bool pad_to_context_length,
               int64_t skip = 0);
  int64_t size() const { return static_cast<int64_t>((indices_.size() + batch_size_ - 1) / batch_size_); }
  data::Batch batch(int64_t i) const;

 private:
  const data::ExampleSet& examples_;
  std::vector<int64_t> indices_;
  size_t batch_size_;
  int32_t pad_id_;
  int64_t context_length_;
  bool pad_to_context_length_;
};

// Batches of an evaluation set in order (no shuffling, no padding to the world size).
std::vector<data::Batch> sequential_batches(const std::vector<data::Example>& examples, int64_t batch_size,
                                            int32_t pad_id, int64_t context_length);

}  // namespace fsdpq
