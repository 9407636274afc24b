// LoRA dropout on the GPU: the same mask as the CPU's (ops/lora.h) — element i survives when the
// 16-bit field i % 4 of mix64(mixed_key + (i / 4 + 1)·golden) is ≥ threshold (round(p · 2^16)) —
// so both devices drop the same elements. One thread per 4 elements: one hash each.
#pragma once
#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// A group's tensors of one kind, each with its adapter's key: where one pass over an input writes
// each adapter's dropped copy (DropoutOutputs), or the gradients at those copies
// (DropoutGradients, all of one storage type).
inline constexpr int kMaxDropoutOutputs = 4;
template <class Pointer>
struct DropoutGroup {
  int count = 0;
  Pointer data[kMaxDropoutOutputs] = {};
  uint64_t mixed_key[kMaxDropoutOutputs] = {};
};
using DropoutOutputs = DropoutGroup<void*>;
using DropoutGradients = DropoutGroup<const void*>;

// outs.data[j][i] = keep_j(i) ? in[i] * keep_scale : 0, all of storage `type`; `in` is read once.
void lora_dropout_apply(KType type, const DropoutOutputs& outs, const void* in, int64_t n, uint32_t threshold,
                        float keep_scale, cudaStream_t stream);
// For j = 0, 1, ... in turn, g_j = gs.data[j]: dx[i] = keep_j(i) ? dx[i] + keep_scale * g_j[i] : dx[i], rounded to dx's
// storage `type` after each j (as that many single accumulations would); g of storage `g_type`.
// dx is read (unless `overwrite`: its values start at 0) and written once.
void lora_dropout_accumulate(KType type, void* dx, bool overwrite, KType g_type, const DropoutGradients& gs,
                             int64_t n, uint32_t threshold, float keep_scale, cudaStream_t stream);

}  // namespace fsdpq::cuda
