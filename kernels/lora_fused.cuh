// The LoRA products of a group of adapters that read one input x (q, k, v; gate, up; o; down) with
// dropout applied inside the products (issue #24's fused LoRA path): each adapter i sees
// dropout_i(x) = keep_i ⊙ round(x / (1 - p)) (the CPU's mask, kernels/lora_dropout_mask.h, and
// rounding, ops/lora.cpp), but no kernel writes dropout_i(x) out: each multiplies masked tiles in
// shared memory. Without them, a group's dropout costs one copy of x per adapter in the forward,
// again in the backward (for dA), and an fp32 [M, in] product per adapter for dx; with them x is
// read once per pass. mma.sync on 16-bit x, A and dxa (kernels/mma_fragments.cuh), fp32
// accumulation; deterministic (fixed split and reduction orders, no atomics).
//   down:        xa[:, first_i : first_i + rank_i] = dropout_i(x) · A_iᵀ
//   input grad:  dx += Σ_i keep_i ⊙ (1 / (1 - p)) ⊙ (dxa_i · A_i)     (one rounding of dx)
//   weight grad: dA_i += dxa_iᵀ · dropout_i(x)                         (dA_i fp32)
// x [M, in], dxa and xa [M, Σ rank] row-major; A_i [rank_i, in]; every 16-bit operand of one type.
#pragma once
#include <cstdint>

#include "kernels/kernel_types.cuh"
#include "kernels/lora_fused_shape.h"

namespace fsdpq::cuda {

inline constexpr int kLoraFusedMaxAdapters = lora_fused::kMaxAdapters;
inline constexpr int kLoraFusedMaxRank = static_cast<int>(lora_fused::kMaxTotalRank);

struct LoraFusedGroup {
  int count = 0;
  const void* A[kLoraFusedMaxAdapters] = {};  // adapter i's A [rank_i, in]
  int rank[kLoraFusedMaxAdapters] = {};       // multiples of 16
  int first[kLoraFusedMaxAdapters] = {};      // adapter i's first column of xa / dxa
  uint64_t mixed_key[kLoraFusedMaxAdapters] = {};
  int total_rank = 0;                          // Σ rank, at most kLoraFusedMaxRank
  uint32_t threshold = 0;                      // round(p · 2^16)
  float keep_scale = 1.0f;                     // 1 / (1 - p)
};

// Whether the kernels take a group: x, A (and dxa) of one 16-bit type, and the group's ranks and
// width as lora_fused::takes (kernels/lora_fused_shape.h) says; every base pointer 16-byte aligned
// (checked by the caller). The scratch they need: lora_fused::*_workspace_floats.
bool lora_fused_supported(KType type, int64_t in, const LoraFusedGroup& group);

void lora_fused_down(void* xa, KType xa_type, const void* x, KType type, const LoraFusedGroup& group, int64_t M,
                     int64_t in, float* workspace, cudaStream_t stream);
// xa = the down kernels' split-K partial sums (partial [splits][n]), added in split order and
// rounded once: the second launch of a split down product (this one's, or the Hopper kernel's,
// kernels/lora_fused_sm90a.cuh).
void lora_fused_split_sum(void* xa, KType xa_type, const float* partial, int splits, int64_t n, cudaStream_t stream);
void lora_fused_input_grad(void* dx, KType dx_type, const void* dxa, KType type, const LoraFusedGroup& group,
                           int64_t M, int64_t in, cudaStream_t stream);
// dA[i]: adapter i's fp32 gradient [rank_i, in], accumulated.
void lora_fused_weight_grad(float* const* dA, const void* dxa, const void* x, KType type, const LoraFusedGroup& group,
                            int64_t M, int64_t in, float* workspace, cudaStream_t stream);

// dA[i] += the weight-gradient kernels' per-chunk partial sums (partial [chunks][Σ rank][in]), added
// in chunk order: the second launch of lora_fused_weight_grad (and of the Hopper kernel's,
// kernels/lora_fused_sm90a.cuh).
void lora_fused_weight_grad_sum(float* const* dA, const float* partial, const LoraFusedGroup& group, int chunks,
                                int64_t in, cudaStream_t stream);

}  // namespace fsdpq::cuda
