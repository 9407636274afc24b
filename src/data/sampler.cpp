#include "data/sampler.h"

#include <limits>
#include <random>

#include "util/error.h"

namespace fsdpq::data {

namespace {

// PyTorch's CPU generator is its own mt19937 (ATen/core/MT19937RNGEngine.h) seeded with the low
// 32 bits of the seed by the standard init recurrence, with the standard tempering: the same
// sequence as std::mt19937, whose algorithm the C++ standard fixes.
class TorchCpuGenerator {
 public:
  explicit TorchCpuGenerator(uint64_t seed) : engine_(static_cast<uint32_t>(seed & 0xffffffffu)) {}
  // CPUGeneratorImpl::random(): one 32-bit draw.
  uint32_t random() { return static_cast<uint32_t>(engine_()); }
  // CPUGeneratorImpl::random64(): the first draw is the high half.
  uint64_t random64() {
    uint64_t hi = random();
    uint64_t lo = random();
    return (hi << 32) | lo;
  }

 private:
  std::mt19937 engine_;
};

}  // namespace

std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed) {
  if (n < 0) fail("randperm: n is {}; expected n >= 0", n);
  TorchCpuGenerator generator(seed);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  // aten/src/ATen/native/TensorFactories.cpp, randperm_cpu.
  if (n < static_cast<int64_t>(std::numeric_limits<uint32_t>::max() / 20)) {
    // Small n: start from the identity and swap position i with i + random() % (n - i).
    for (int64_t i = 0; i < n; ++i) perm[i] = i;
    for (int64_t i = 0; i < n - 1; ++i) {
      int64_t z = static_cast<int64_t>(generator.random() % static_cast<uint64_t>(n - i));
      std::swap(perm[i], perm[z + i]);
    }
    return perm;
  }
  // Large n: "inside-out" Fisher-Yates with 64-bit draws.
  for (int64_t i = 0; i < n; ++i) {
    int64_t z = static_cast<int64_t>(generator.random64() % static_cast<uint64_t>(i + 1));
    perm[i] = perm[z];
    perm[z] = i;
  }
  return perm;
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int world_size, int rank,
                                       uint64_t seed, bool shuffle)
    : dataset_size_(dataset_size),
      world_size_(world_size),
      rank_(rank),
      seed_(seed),
      shuffle_(shuffle) {
  if (dataset_size < 0) fail("sampler: dataset size is {}; expected at least 0", dataset_size);
  if (world_size < 1) fail("sampler: world size is {}; expected at least 1", world_size);
  if (rank < 0 || rank >= world_size)
    fail("sampler: rank {} is not in the interval [0, {}]", rank, world_size - 1);
  num_samples_ = (dataset_size + world_size - 1) / world_size;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  const std::vector<int64_t> all = epoch_order(epoch);
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (size_t i = static_cast<size_t>(rank_); i < all.size(); i += static_cast<size_t>(world_size_))
    mine.push_back(all[i]);
  return mine;
}

std::vector<int64_t> DistributedSampler::permutation(int64_t epoch) const {
  // g.manual_seed(self.seed + self.epoch)
  if (shuffle_) return torch_randperm(dataset_size_, seed_ + static_cast<uint64_t>(epoch));
  std::vector<int64_t> all(static_cast<size_t>(dataset_size_));
  for (int64_t i = 0; i < dataset_size_; ++i) all[i] = i;
  return all;
}

std::vector<int64_t> DistributedSampler::epoch_order(int64_t epoch) const {
  std::vector<int64_t> all = permutation(epoch);
  // Pad to total_size by repeating the list from its start (more than once when n < world).
  const int64_t total_size = num_samples_ * world_size_;
  for (int64_t i = dataset_size_; i < total_size; ++i)
    all.push_back(all[static_cast<size_t>(i % dataset_size_)]);
  return all;
}

}  // namespace fsdpq::data
