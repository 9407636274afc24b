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
// dx[i] = keep(i) ? dx[i] + keep_scale * g[i] : dx[i]; dx of storage `type`, g fp32.
void lora_dropout_accumulate(KType type, void* dx, const float* g, int64_t n, uint64_t mixed_key,
                             uint32_t threshold, float keep_scale, cudaStream_t stream);

}  // namespace fsdpq::cuda
