// kernels/lora_fused_shape.h: which groups the fused LoRA kernels take, how the down kernel splits
// `in` and how many fp32 partial sums each kernel needs — what the launcher allocates and the
// planner counts, so both read it from here.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/lora_fused_shape.h"

namespace fsdpq {
namespace {

bool takes(int64_t in, std::vector<int64_t> ranks) { return lora_fused::takes(in, ranks.data(), ranks.size()); }

TEST(LoraFusedShape, TakesLlamaGroupsAndRefusesTheRest) {
  EXPECT_TRUE(takes(4096, {64, 64, 64}));     // q, k, v
  EXPECT_TRUE(takes(11008, {64}));            // down: 86 x 128
  EXPECT_TRUE(takes(128, {16}));
  EXPECT_TRUE(takes(4096, {64, 64, 64, 64}));  // 256: the largest group sum
  EXPECT_FALSE(takes(4096, {128, 128, 16}));   // 272 > 256
  EXPECT_FALSE(takes(4096, {8, 8}));           // ranks not multiples of 16
  EXPECT_FALSE(takes(4000, {64}));             // a width that is not a multiple of 128
  EXPECT_FALSE(takes(4096, {}));
  EXPECT_FALSE(takes(4096, {16, 16, 16, 16, 16}));  // more adapters than a group holds
  EXPECT_FALSE(takes(0, {16}));
}

TEST(LoraFusedShape, DownSplitsFillALargeGpuInWholeSteps) {
  // 8192 rows: 128 row tiles, so 4 splits of 1024 columns at in 4096 (512 blocks).
  EXPECT_EQ(lora_fused::down_splits(8192, 4096), 4);
  EXPECT_EQ(lora_fused::down_k_per_split(8192, 4096), 1024);
  // A few rows: as many splits as 64-column steps.
  EXPECT_EQ(lora_fused::down_splits(1, 256), 4);
  // Many rows: one split, no workspace.
  EXPECT_EQ(lora_fused::down_splits(65536, 4096), 1);
  EXPECT_EQ(lora_fused::down_workspace_floats(65536, 4096, 192), 0);
  // Every split is whole steps and together they cover `in` (11008 = 172 steps).
  for (int64_t M : {1, 100, 8192, 20000}) {
    const int64_t per = lora_fused::down_k_per_split(M, 11008), splits = lora_fused::down_splits(M, 11008);
    EXPECT_EQ(per % lora_fused::kTileK, 0) << M;
    EXPECT_GE(per * splits, 11008) << M;
    EXPECT_LT(per * (splits - 1), 11008) << M;
  }
  EXPECT_EQ(lora_fused::down_workspace_floats(8192, 4096, 192), 4 * 8192 * 192);
}

// Chunks of 1024 rows where the blocks fill a large GPU; small batches split M finer, in whole
// 64-row steps of at least 128 rows, so that 128-column blocks times chunks reach 256.
TEST(LoraFusedShape, WeightGradientChunks) {
  EXPECT_EQ(lora_fused::weight_grad_chunk_rows(8192, 4096), 1024);  // 32 column blocks x 8 chunks
  EXPECT_EQ(lora_fused::weight_grad_chunks(8192, 4096), 8);
  EXPECT_EQ(lora_fused::weight_grad_chunks(8193, 4096), 9);
  EXPECT_EQ(lora_fused::weight_grad_chunks(8192, 11008), 8);
  EXPECT_EQ(lora_fused::weight_grad_chunk_rows(2048, 4096), 256);  // 32 x 8 = 256 blocks, not 32 x 2
  EXPECT_EQ(lora_fused::weight_grad_chunks(2048, 4096), 8);
  EXPECT_EQ(lora_fused::weight_grad_chunk_rows(2048, 11008), 704);  // 86 x 3 = 258 blocks
  EXPECT_EQ(lora_fused::weight_grad_chunks(2048, 11008), 3);
  EXPECT_EQ(lora_fused::weight_grad_chunk_rows(512, 4096), 128);  // the floor: 32 x 4
  EXPECT_EQ(lora_fused::weight_grad_chunks(1, 4096), 1);
  for (int64_t M : {1, 63, 64, 100, 512, 2048, 5000, 8192, 65536})
    for (int64_t in : {128, 4096, 11008, 14336}) {
      const int64_t rows = lora_fused::weight_grad_chunk_rows(M, in), chunks = lora_fused::weight_grad_chunks(M, in);
      EXPECT_EQ(rows % 64, 0) << M << " " << in;
      EXPECT_GE(rows, lora_fused::kMinChunkRows);
      EXPECT_LE(rows, lora_fused::kChunkRows);
      EXPECT_GE(rows * chunks, M);  // the chunks cover M, none empty
      EXPECT_LT(rows * (chunks - 1), M);
    }
  EXPECT_EQ(lora_fused::weight_grad_workspace_floats(8192, 11008, 64), 8 * 64 * 11008);
  EXPECT_EQ(lora_fused::weight_grad_workspace_floats(2048, 4096, 192), 8 * 192 * 4096);
}

}  // namespace
}  // namespace fsdpq
