// Causal grouped-query attention on the GPU (flash-attention style, fp32 SIMT math; see
// src/ops/attention.h for the op). q: [B, T, H, D]; k, v: [B, T, KV, D]; out: [B, T, H, D];
// lse: fp32 [B, H, T]. Query head h reads kv head h / (H / KV); scale 1 / sqrt(D); D ≤ 256.
// Every operand has its own storage type; outputs are rounded once. No float atomics: the
// backward sums dk/dv over the group's query heads and query tiles in a fixed order.
#pragma once
#include <cstdint>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

inline constexpr int64_t kAttentionMaxHeadDim = 256;

void attention_forward(void* out, KType out_type, float* lse, const void* q, KType q_type, const void* k,
                       KType k_type, const void* v, KType v_type, int64_t B, int64_t T, int64_t H, int64_t KV,
                       int64_t D, cudaStream_t stream);

// drow: fp32 workspace of B * H * T values (rowsum(dout * out), computed first).
void attention_backward(void* dq, KType dq_type, void* dk, KType dk_type, void* dv, KType dv_type,
                        const void* dout, KType dout_type, const void* q, KType q_type, const void* k,
                        KType k_type, const void* v, KType v_type, const void* out, KType out_type,
                        const float* lse, float* drow, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                        cudaStream_t stream);

}  // namespace fsdpq::cuda
