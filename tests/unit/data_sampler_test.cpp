// Sampler: known answers from real PyTorch, and the properties a distributed sampler must have.
#include <gtest/gtest.h>

#include "test_support.h"

#include <algorithm>
#include <set>

#include "data/sampler.h"
#include "util/error.h"

namespace fsdpq::data {
namespace {
using Indices = std::vector<int64_t>;

using test::error_of;

// Printed by tests/reference/sampler_reference.py with torch 2.11.0 (CPU generator):
//   torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
TEST(DataSampler, RandpermMatchesPyTorch) {
  EXPECT_EQ(torch_randperm(0, 0), Indices{});
  EXPECT_EQ(torch_randperm(1, 0), (Indices{0}));
  EXPECT_EQ(torch_randperm(2, 0), (Indices{0, 1}));
  EXPECT_EQ(torch_randperm(5, 0), (Indices{4, 0, 1, 3, 2}));
  EXPECT_EQ(torch_randperm(10, 0), (Indices{4, 1, 7, 5, 3, 9, 0, 8, 6, 2}));
  EXPECT_EQ(torch_randperm(10, 42), (Indices{2, 6, 1, 8, 4, 5, 0, 9, 3, 7}));
  EXPECT_EQ(torch_randperm(16, 1), (Indices{5, 15, 6, 4, 11, 2, 7, 12, 1, 0, 9, 8, 10, 3, 13, 14}));
  EXPECT_EQ(
      torch_randperm(100, 42),
      (Indices{42, 96, 62, 98, 46, 95, 60, 24, 78, 16, 68, 70, 11, 13, 97, 52, 99, 19, 71, 10,
               89, 86, 18, 40, 5,  38, 9,  82, 83, 43, 32, 94, 67, 93, 75, 59, 79, 1,  50, 73,
               66, 45, 63, 58, 22, 3,  87, 4,  61, 51, 12, 74, 21, 20, 6,  35, 44, 48, 37, 33,
               15, 88, 31, 69, 27, 81, 85, 56, 7,  65, 47, 41, 29, 80, 57, 84, 36, 17, 34, 72,
               2,  91, 8,  53, 30, 90, 26, 23, 54, 76, 14, 55, 0,  64, 77, 39, 25, 92, 49, 28}));
  // Only the low 32 bits of the seed reach the engine: 2^32 + 3 is seed 3 to torch.
  EXPECT_EQ(torch_randperm(10, (uint64_t{1} << 32) + 3), (Indices{6, 0, 3, 7, 8, 5, 1, 9, 2, 4}));
  EXPECT_EQ(torch_randperm(10, (uint64_t{1} << 32) + 3), torch_randperm(10, 3));
  Indices big = torch_randperm(1000, 7);
  EXPECT_EQ(Indices(big.begin(), big.begin() + 20),
            (Indices{615, 284, 599, 580, 347, 92,  383, 891, 452, 41,
                     998, 773, 264, 301, 190, 230, 610, 261, 977, 583}));
}

// torch.utils.data.DistributedSampler(num_replicas=world, rank=rank, seed=seed) after
// set_epoch(epoch), from the same script.
TEST(DataSampler, DistributedSamplerMatchesPyTorch) {
  EXPECT_EQ(DistributedSampler(10, 1, 0, 42).indices(0), (Indices{2, 6, 1, 8, 4, 5, 0, 9, 3, 7}));
  EXPECT_EQ(DistributedSampler(10, 2, 0, 42).indices(0), (Indices{2, 1, 4, 0, 3}));
  EXPECT_EQ(DistributedSampler(10, 2, 1, 42).indices(0), (Indices{6, 8, 5, 9, 7}));
  EXPECT_EQ(DistributedSampler(10, 2, 1, 42).indices(1), (Indices{4, 0, 1, 7, 3}));
  EXPECT_EQ(DistributedSampler(11, 4, 3, 42).indices(0), (Indices{2, 7, 6}));  // padded
  EXPECT_EQ(DistributedSampler(3, 8, 7, 0).indices(0), (Indices{0}));          // n < world
  EXPECT_EQ(DistributedSampler(128, 4, 2, 42).indices(5),
            (Indices{5,  20, 61, 11, 107, 80, 9,   111, 44, 29, 93, 30, 53, 117, 31, 52,
                     73, 72, 28, 46, 66,  24, 114, 12,  75, 83, 89, 70, 81, 127, 59, 123}));
  EXPECT_EQ(DistributedSampler(0, 2, 0, 1).indices(0), Indices{});
  EXPECT_EQ(DistributedSampler(11, 4, 3, 42).num_samples(), 3);
}

TEST(DataSampler, RanksAreDisjointAndCoverTheDataset) {
  const int64_t n = 96;
  for (int world : {1, 2, 3, 4, 8}) {
    std::vector<int64_t> seen;
    for (int rank = 0; rank < world; ++rank) {
      DistributedSampler sampler(n, world, rank, 42);
      Indices mine = sampler.indices(3);
      EXPECT_EQ(static_cast<int64_t>(mine.size()), sampler.num_samples());
      seen.insert(seen.end(), mine.begin(), mine.end());
    }
    std::sort(seen.begin(), seen.end());
    Indices all(n);
    for (int64_t i = 0; i < n; ++i) all[i] = i;
    EXPECT_EQ(seen, all) << "world " << world;
  }
}

TEST(DataSampler, PadsByRepeatingTheFirstIndices) {
  // 10 over 4 ranks: total 12, the first two shuffled indices are visited twice.
  const Indices order = torch_randperm(10, 5);
  std::multiset<int64_t> seen;
  for (int rank = 0; rank < 4; ++rank) {
    Indices mine = DistributedSampler(10, 4, rank, 5).indices(0);
    EXPECT_EQ(mine.size(), 3u);
    seen.insert(mine.begin(), mine.end());
  }
  EXPECT_EQ(seen.size(), 12u);
  EXPECT_EQ(seen.count(order[0]), 2u);
  EXPECT_EQ(seen.count(order[1]), 2u);
  EXPECT_EQ(seen.count(order[2]), 1u);
  // Rank r takes positions r, r + world, ... of the padded order.
  EXPECT_EQ(DistributedSampler(10, 4, 2, 5).indices(0), (Indices{order[2], order[6], order[0]}));
}

TEST(DataSampler, EpochChangesTheOrderAndSeedsAreDeterministic) {
  DistributedSampler sampler(200, 2, 1, 42);
  EXPECT_EQ(sampler.indices(0), sampler.indices(0));
  EXPECT_EQ(sampler.indices(0), DistributedSampler(200, 2, 1, 42).indices(0));
  EXPECT_NE(sampler.indices(0), sampler.indices(1));
  EXPECT_NE(sampler.indices(0), DistributedSampler(200, 2, 1, 43).indices(0));
  // seed + epoch is what seeds the generator.
  EXPECT_EQ(sampler.indices(1), DistributedSampler(200, 2, 1, 43).indices(0));
  // Without shuffling: rank r gets r, r + world, ...
  EXPECT_EQ(DistributedSampler(7, 3, 1, 42, false).indices(9), (Indices{1, 4, 0}));
}

TEST(DataSampler, BadArguments) {
  EXPECT_EQ(error_of([] { DistributedSampler(10, 2, 2, 0); }),
            "sampler: rank 2 is not in the interval [0, 1]");
  EXPECT_EQ(error_of([] { DistributedSampler(10, 0, 0, 0); }),
            "sampler: world size is 0; expected at least 1");
  EXPECT_EQ(error_of([] { DistributedSampler(-1, 1, 0, 0); }),
            "sampler: dataset size is -1; expected at least 0");
  EXPECT_EQ(error_of([] { torch_randperm(-3, 0); }), "randperm: n is -3; expected n >= 0");
}

}  // namespace
}  // namespace fsdpq::data
