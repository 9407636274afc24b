// The batched HQQ solver (quant/hqq_solve.h) on the CPU: each group exactly as the one-group solver
// gives it, the block error sums in group order, and the GPU refused where there is none. (Its GPU
// twin is compared against this in tests/gpu/hqq_gpu_test.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fmt/format.h>

#include "quant/hqq_solve.h"
#include "unit/hqq_test_weights.h"
#include "util/bf16.h"
#include "util/error.h"

namespace fsdpq {
namespace {

TEST(HqqSolveGroups, EqualsTheOneGroupSolverAndSumsBlocksInGroupOrder) {
  const int64_t count = 3 * kHqqBlockGroups + 5;  // a short last block
  const std::vector<float> w = test::hqq_test_weights(count, 7);
  for (int bits : {1, 3, 4, 8})
    for (int updates : {0, 7, kHqqSolverIterations}) {
      SCOPED_TRACE(fmt::format("{} bits, {} updates", bits, updates));
      const HqqSolved solved = hqq_solve_groups(w.data(), count, bits, updates, HqqSolverPrecision::kHalf, true,
                                                HqqSolverDevice::kCpu);
      ASSERT_EQ(solved.groups.size(), static_cast<size_t>(count));
      ASSERT_EQ(solved.block_errors.size(), static_cast<size_t>(4 * kHqqSolverIterations));
      std::vector<double> blocks(solved.block_errors.size(), 0.0);
      for (int64_t g = 0; g < count; ++g) {
        const float* v = w.data() + g * kHqqGroupSize;
        const HqqGroup one = hqq_solve_group(v, hqq_group_start(v, bits), bits, updates, HqqSolverPrecision::kHalf,
                                             blocks.data() + g / kHqqBlockGroups * kHqqSolverIterations);
        EXPECT_EQ(float_bits(solved.groups[static_cast<size_t>(g)].scale), float_bits(one.scale)) << "group " << g;
        EXPECT_EQ(float_bits(solved.groups[static_cast<size_t>(g)].zero), float_bits(one.zero)) << "group " << g;
      }
      EXPECT_EQ(std::memcmp(blocks.data(), solved.block_errors.data(), blocks.size() * sizeof(double)), 0);
      if (updates > 0) EXPECT_GT(solved.block_errors[0], 0.0);
      if (updates < kHqqSolverIterations) EXPECT_EQ(solved.block_errors[kHqqSolverIterations - 1], 0.0);
    }
}

// A reader that finds the groups elsewhere (here stored last to first) gives what the values one
// after another give: the solver reads group g wherever its caller keeps it.
TEST(HqqSolveGroups, AGroupReaderGivesTheContiguousResult) {
  const int64_t count = 2 * kHqqBlockGroups + 9;
  const std::vector<float> w = test::hqq_test_weights(count, 4);
  std::vector<float> reversed(w.size());
  for (int64_t g = 0; g < count; ++g)
    std::copy_n(w.data() + g * kHqqGroupSize, kHqqGroupSize, reversed.data() + (count - 1 - g) * kHqqGroupSize);
  const auto read = [&](int64_t g, float* out) {
    std::copy_n(reversed.data() + (count - 1 - g) * kHqqGroupSize, kHqqGroupSize, out);
  };
  const HqqSolved want = hqq_solve_groups(w.data(), count, 4, 9, HqqSolverPrecision::kHalf, true, HqqSolverDevice::kCpu);
  const HqqSolved got = hqq_solve_groups(read, count, 4, 9, HqqSolverPrecision::kHalf, true, HqqSolverDevice::kCpu);
  ASSERT_EQ(got.groups.size(), want.groups.size());
  for (size_t g = 0; g < want.groups.size(); ++g) {
    EXPECT_EQ(float_bits(got.groups[g].scale), float_bits(want.groups[g].scale)) << "group " << g;
    EXPECT_EQ(float_bits(got.groups[g].zero), float_bits(want.groups[g].zero)) << "group " << g;
  }
  ASSERT_EQ(got.block_errors.size(), want.block_errors.size());
  EXPECT_EQ(std::memcmp(got.block_errors.data(), want.block_errors.data(), want.block_errors.size() * sizeof(double)), 0);
}

TEST(HqqSolveGroups, WithoutBlockErrorsReturnsNone) {
  const std::vector<float> w = test::hqq_test_weights(10, 3);
  const HqqSolved solved = hqq_solve_groups(w.data(), 10, 4, 5, HqqSolverPrecision::kHalf, false);
  EXPECT_EQ(solved.groups.size(), 10u);
  EXPECT_TRUE(solved.block_errors.empty());
}

TEST(HqqSolveGroups, TheGpuWithoutOneIsAnError) {
  const std::vector<float> w = test::hqq_test_weights(2, 1);
  try {
    hqq_solve_groups(w.data(), 2, 4, 3, HqqSolverPrecision::kHalf, false, HqqSolverDevice::kGpu);
    FAIL() << "expected an error: no GPU in this process";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("drives no GPU"), std::string::npos) << e.what();
  }
}

TEST(HqqSolveGroups, BadRequestsAreLogicErrors) {
  const std::vector<float> w = test::hqq_test_weights(1, 1);
  EXPECT_THROW(hqq_solve_groups(w.data(), 1, 5, 3, HqqSolverPrecision::kHalf, false), std::logic_error);
  EXPECT_THROW(hqq_solve_groups(w.data(), 1, 4, 21, HqqSolverPrecision::kHalf, false), std::logic_error);
  EXPECT_THROW(hqq_solve_groups(w.data(), -1, 4, 3, HqqSolverPrecision::kHalf, false), std::logic_error);
}

TEST(HqqSolveGroups, CountsItsWork) {
  const std::vector<float> w = test::hqq_test_weights(6, 2);
  const HqqSolverWork before = hqq_solver_work();
  hqq_solve_groups(w.data(), 6, 4, 2, HqqSolverPrecision::kHalf, false, HqqSolverDevice::kCpu);
  const HqqSolverWork after = hqq_solver_work();
  EXPECT_EQ(after.groups - before.groups, 6);
  EXPECT_EQ(after.gpu_groups, before.gpu_groups);
  EXPECT_GE(after.seconds, before.seconds);
}

}  // namespace
}  // namespace fsdpq
