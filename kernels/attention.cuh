// Causal grouped-query attention on the GPU (flash-attention style, fp32 SIMT math; see
// src/ops/attention.h for the op). q: [B, T, H, D]; k, v: [B, T, KV, D]; out: [B, T, H, D];
// lse: fp32 [B, H, T]. Query head h reads kv head h / (H / KV); scale 1 / sqrt(D); D ≤ 256.
// Every operand has its own storage type; outputs are rounded once. No float atomics: the
// backward sums dk/dv over the group's query heads and query tiles in a fixed order.
// segment_start: null (plain causal), or device I32 [B, T] with 0 <= segment_start[b, t] <= t
// (not checked here): query t of row b then sees keys segment_start[b, t]..t only (packed rows,
// src/ops/attention.h), and tiles of keys that no query of a tile can see are skipped.
#pragma once
#include <cstdint>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

inline constexpr int64_t kAttentionMaxHeadDim = 256;

void attention_forward(void* out, KType out_type, float* lse, const void* q, KType q_type, const void* k,
                       KType k_type, const void* v, KType v_type, const int32_t* segment_start, int64_t B, int64_t T,
                       int64_t H, int64_t KV, int64_t D, cudaStream_t stream);

// drow: fp32 workspace of B * H * T values (rowsum(dout * out), computed first).
void attention_backward(void* dq, KType dq_type, void* dk, KType dk_type, void* dv, KType dv_type,
                        const void* dout, KType dout_type, const void* q, KType q_type, const void* k,
                        KType k_type, const void* v, KType v_type, const void* out, KType out_type,
                        const float* lse, const int32_t* segment_start, float* drow, int64_t B, int64_t T, int64_t H,
                        int64_t KV, int64_t D, cudaStream_t stream);

}  // namespace fsdpq::cuda
