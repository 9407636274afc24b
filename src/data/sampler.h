// The order examples are visited in: PyTorch's CPU randperm and DistributedSampler, reproduced
// exactly so a run sees the same batches as fsdp_qlora with the same seed.
#pragma once
#include <cstdint>
#include <vector>

namespace fsdpq::data {

// torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU.
std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed);

// torch.utils.data.DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=seed,
// shuffle=shuffle, drop_last=False) after set_epoch(epoch).
class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int world_size, int rank, uint64_t seed,
                     bool shuffle = true);

  // The dataset indices this rank visits in `epoch`, in order (num_samples() of them).
  std::vector<int64_t> indices(int64_t epoch) const;
  // Every rank's indices of `epoch` in one list (num_samples() × world_size): the shuffled indices
  // padded by repeating them; rank r visits positions r, r + world_size, r + 2·world_size, …
  std::vector<int64_t> epoch_order(int64_t epoch) const;
  // The epoch's order of the whole dataset, each index once: epoch_order before its padding.
  // Packing (docs/packing.md) packs this order into rows and deals the rows to the ranks.
  std::vector<int64_t> permutation(int64_t epoch) const;
  // ceil(dataset_size / world_size): ranks pad by repeating indices so all get the same count.
  int64_t num_samples() const { return num_samples_; }
  int world_size() const { return world_size_; }
  int rank() const { return rank_; }

 private:
  int64_t dataset_size_;
  int world_size_, rank_;
  uint64_t seed_;
  bool shuffle_;
  int64_t num_samples_;
};

}  // namespace fsdpq::data
