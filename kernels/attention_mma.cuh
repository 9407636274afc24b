// Causal grouped-query attention on tensor cores (FlashAttention-2 style, mma.sync
// m16n8k16 with fp32 accumulators), for the common case: q, k, v of one 16-bit storage type
// (BF16 or F16) and head dim 64 or 128. Same contract as attention_forward / attention_backward
// in kernels/attention.cuh: q [B, T, H, D]; k, v [B, T, KV, D]; out [B, T, H, D]; lse fp32
// [B, H, T]; query head h reads kv head h / (H / KV); scale 1 / sqrt(D); out, dq, dk, dv of any
// KType, rounded once on store; dout of any KType, rounded to q's type when loaded (what
// autocast does: the products run in bf16/f16), and the backward is then the exact gradient for
// that rounded dout (rowsum(dout * out) uses it too). The probabilities P and dS are rounded to
// q's type before their products (as FlashAttention does). Deterministic: no float atomics; dk /
// dv of a kv head sum the group's query heads and query tiles in a fixed order.
// Packed rows: segment_start [B, T] int32 (nullptr: plain causal attention) gives each query row
// its example's first position; key j is visible to query i iff segment_start[b, i] <= j <= i
// (ops/attention.h). Key tiles no query of a tile sees are skipped, so a packed row costs about
// what its examples cost. Without segments the results are bit for bit those of plain causal.
// The default where it applies (src/ops/attention.cpp); FSDPQ_ATTENTION=simt opts out.
#pragma once
#include <cstdint>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// True when these kernels handle the operand types and head dim (q == k == v in {BF16, F16},
// D in {64, 128}; out may be any KType).
bool attention_mma_supported(KType q, KType k, KType v, KType out, int64_t D);

// The kernels read q, k, v and dout with 16-byte loads: their base pointers must be 16-byte
// aligned (rows are D elements, so every row then is).
inline bool attention_mma_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Floats of the backward's workspace (the drow argument): rowsum(dout * out) per query row.
inline int64_t attention_mma_workspace_floats(int64_t B, int64_t H, int64_t T) { return B * H * T; }

void attention_mma_forward(void* out, KType out_type, float* lse, const void* q, KType q_type, const void* k,
                           KType k_type, const void* v, KType v_type, const int32_t* segment_start, int64_t B,
                           int64_t T, int64_t H, int64_t KV, int64_t D, cudaStream_t stream);

// drow: fp32 workspace of attention_mma_workspace_floats(B, H, T) values.
void attention_mma_backward(void* dq, KType dq_type, void* dk, KType dk_type, void* dv, KType dv_type,
                            const void* dout, KType dout_type, const void* q, KType q_type, const void* k,
                            KType k_type, const void* v, KType v_type, const void* out, KType out_type,
                            const float* lse, const int32_t* segment_start, float* drow, int64_t B, int64_t T,
                            int64_t H, int64_t KV, int64_t D, cudaStream_t stream);

}  // namespace fsdpq::cuda
