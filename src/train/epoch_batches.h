// The micro-batches one rank sees in one epoch. Without packing, as torch's
// DataLoader(dataset, batch_size, sampler=DistributedSampler(...)) yields them in fsdp_qlora:
// the sampler's indices for this rank and epoch, cut into batches (the last may be short), each
// collated (padded to its longest example, or to context_length). With packing
// (docs/packing.md), the epoch's whole shuffled order packed into rows (data/packing.h), taken
// world_size × batch_size rows per micro-batch and dealt to the ranks balanced by tokens.
#pragma once
#include <vector>

#include "data/collate.h"
#include "data/example_set.h"
#include "data/examples.h"
#include "data/sampler.h"

namespace fsdpq {

struct BatchShape {
  int64_t batch_size = 1;  // per rank and micro-batch: examples, or rows with packing
  int32_t pad_id = 0;
  int64_t context_length = 512;
  bool pad_to_context_length = false;
  bool packing = false;
  bool padding_free = false;  // unpacked: a batch's examples in one row (data::collate_padding_free)
};

// Packing: the rows of `epoch` over all ranks, each the dataset indices laid end to end in it. The
// same on every rank and at every world size.
std::vector<std::vector<int64_t>> packed_epoch_rows(const data::ExampleSet& examples,
                                                    const data::DistributedSampler& sampler, int64_t epoch,
                                                    int64_t context_length);

class EpochBatches {
 public:
  // `consumed`: what the epoch has trained on so far over all ranks — examples, or rows with
  // packing (a run resumed mid-epoch starts after them).
  EpochBatches(const data::ExampleSet& examples, const data::DistributedSampler& sampler, int64_t epoch,
               const BatchShape& shape, int64_t consumed = 0);
  int64_t size() const { return static_cast<int64_t>(micro_batches_.size()); }
  data::Batch batch(int64_t i) const;

 private:
  using Row = std::vector<int64_t>;  // dataset indices laid end to end (one without packing)
  const data::ExampleSet& examples_;
  BatchShape shape_;
  std::vector<std::vector<Row>> micro_batches_;  // this rank's
};

// Batches of an evaluation set in order (no shuffling, no padding to the world size); with
// padding_free each batch's examples in one row (data::collate_padding_free).
std::vector<data::Batch> sequential_batches(const std::vector<data::Example>& examples, int64_t batch_size,
                                            int32_t pad_id, int64_t context_length, bool padding_free = false);

}  // namespace fsdpq
