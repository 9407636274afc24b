// LoRA dropout on the GPU: the same mask as the CPU's (ops/lora.h) — element i survives when the
// 16-bit field i % 4 of mix64(mixed_key + (i / 4 + 1)·golden) is ≥ threshold (round(p · 2^16)) —
// so both devices drop the same elements. One thread per 4 elements: one hash each.
#pragma once
#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// Where one pass over an input writes each adapter of a group's dropped copy, with its own key.
inline constexpr int kMaxDropoutOutputs = 4;
struct DropoutOutputs {
  int count = 0;
  void* out[kMaxDropoutOutputs] = {};
  uint64_t mixed_key[kMaxDropoutOutputs] = {};
};

// outs.out[j][i] = keep_j(i) ? in[i] * keep_scale : 0, all of storage `type`; `in` is read once.
void lora_dropout_apply(KType type, const DropoutOutputs& outs, const void* in, int64_t n, uint32_t threshold,
                        float keep_scale, cudaStream_t stream);
// The gradients at a group's dropped copies, each with its adapter's key, all of one storage type.
struct DropoutGradients {
  int count = 0;
  const void* g[kMaxDropoutOutputs] = {};
  uint64_t mixed_key[kMaxDropoutOutputs] = {};
};
// For j = 0, 1, ... in turn: dx[i] = keep_j(i) ? dx[i] + keep_scale * g_j[i] : dx[i], rounded to dx's
// storage `type` after each j (as that many single accumulations would); g of storage `g_type`.
// dx is read and written once.
void lora_dropout_accumulate(KType type, void* dx, KType g_type, const DropoutGradients& gs, int64_t n,
                             uint32_t threshold, float keep_scale, cudaStream_t stream);

}  // namespace fsdpq::cuda
