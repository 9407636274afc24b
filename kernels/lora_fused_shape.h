// Which groups the fused LoRA kernels (kernels/lora_fused.cuh) take, how they split the work, and
// the fp32 scratch that needs: plain C++, shared by the kernels' launcher and the memory planner
// (src/plan/memory_plan.cpp), so the plan counts exactly what the kernels allocate.
#pragma once
#include <cstddef>
#include <cstdint>

namespace fsdpq::lora_fused {

inline constexpr int kMaxAdapters = 4;
inline constexpr int64_t kMaxTotalRank = 256;  // Σ rank of a group
inline constexpr int64_t kRankMultiple = 16;   // one mma k-step
inline constexpr int64_t kWidthMultiple = 128; // the input-grad kernel's column tile
inline constexpr int64_t kRows = 64;           // rows of M per step
inline constexpr int64_t kTileK = 64;          // columns of x per step (down, weight grad)
inline constexpr int64_t kChunkRows = 1024;    // rows of M per weight-gradient partial sum, at most
inline constexpr int64_t kMinChunkRows = 128;  // and at least (where M has that many)

// Whether the kernels take a group of `count` adapters of these ranks on an input `in` wide
// (16-bit operands and 16-byte alignment are the launcher's to check).
inline bool takes(int64_t in, const int64_t* ranks, size_t count) {
  if (in <= 0 || in % kWidthMultiple != 0 || count == 0 || count > static_cast<size_t>(kMaxAdapters)) return false;
  int64_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    if (ranks[i] <= 0 || ranks[i] % kRankMultiple != 0) return false;
    total += ranks[i];
  }
  return total <= kMaxTotalRank;
}

inline int64_t row_tiles(int64_t M) { return (M + kRows - 1) / kRows; }

// The down kernel's split of `in`: enough blocks for a large GPU (>= 512), whole kTileK steps.
// Fixed by the sizes alone, so the sum order is the same on every GPU.
inline int64_t down_k_per_split(int64_t M, int64_t in) {
  const int64_t steps = in / kTileK, want = (512 + row_tiles(M) - 1) / row_tiles(M);
  const int64_t splits = want < 1 ? 1 : (want > steps ? steps : want);
  return (steps + splits - 1) / splits * kTileK;
}
inline int64_t down_splits(int64_t M, int64_t in) {
  const int64_t per = down_k_per_split(M, in);
  return (in + per - 1) / per;
}
// Rows of M per weight-gradient partial sum: kChunkRows, or fewer (whole 64-row steps, at least
// kMinChunkRows) where the blocks of 128 columns of `in` times the chunks would not reach 256, two
// for each SM of a large GPU: small batches (M 2048 at in 4096: 64 blocks of 1024 rows, or 256
// of 256). Fixed by the sizes alone, so the sum order is the same on every GPU.
inline int64_t weight_grad_chunk_rows(int64_t M, int64_t in) {
  const int64_t column_blocks = in / 128 > 0 ? in / 128 : 1;
  const int64_t want = (256 + column_blocks - 1) / column_blocks;
  const int64_t rows = ((M + want - 1) / want + 63) / 64 * 64;
  return rows < kMinChunkRows ? kMinChunkRows : rows > kChunkRows ? kChunkRows : rows;
}
inline int64_t weight_grad_chunks(int64_t M, int64_t in) {
  const int64_t rows = weight_grad_chunk_rows(M, in);
  return (M + rows - 1) / rows;
}

// fp32 scratch: the down kernel's split-K partial sums (none with one split), and the weight
// gradient's per-chunk partial sums.
inline int64_t down_workspace_floats(int64_t M, int64_t in, int64_t total_rank) {
  const int64_t splits = down_splits(M, in);
  return splits > 1 ? splits * M * total_rank : 0;
}
inline int64_t weight_grad_workspace_floats(int64_t M, int64_t in, int64_t total_rank) {
  return weight_grad_chunks(M, in) * total_rank * in;
}

}  // namespace fsdpq::lora_fused
