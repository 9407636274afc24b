// The fused causal-LM cross entropy of src/ops/cross_entropy.cpp on the GPU: one block per row of
// logits [rows, V]. Row r of sequence position t = r % T scores labels[r + 1] when t + 1 < T and
// that label is not -100; other rows get loss 0 and exactly-zero gradients. The caller has
// checked the labels (all in [0, V) or -100).
#pragma once
#include <cstdint>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// row_loss[r] = max + log Σ exp(logits - max) - logits[target] in fp32 (0 for rows that do not
// count); dlogits = grad_scale * (softmax - onehot) on counted rows, 0 elsewhere. dlogits may be
// the logits buffer: each row is fully read (max, sum and the target's logit) before it is written.
void cross_entropy_forward_backward(const void* logits, KType logits_type, const int32_t* labels, int64_t rows,
                                    int64_t T, int64_t V, void* dlogits, KType dlogits_type, float grad_scale,
                                    float* row_loss, cudaStream_t stream);

}  // namespace fsdpq::cuda
