// HF causal-LM loss: fp32 logits, position t of each sequence predicts label t + 1, labels equal
// to -100 are ignored, and the loss is the mean over the counted positions.
#pragma once
#include "backend/tensor.h"

#include <cstdint>

namespace fsdpq {

constexpr int32_t kIgnoreIndex = -100;

struct CrossEntropyResult {
  double loss_sum = 0.0;  // sum over counted positions of -log softmax(logits)[target]
  int64_t count = 0;      // counted positions
  double mean() const { return count == 0 ? 0.0 : loss_sum / static_cast<double>(count); }
};

// Positions that count towards the loss: labels[b, t + 1] != -100 for t < T - 1. Use it to set
// grad_scale (1 / count for HF's per-batch mean) before calling the op below.
int64_t cross_entropy_count_targets(const TensorView& labels, int64_t B, int64_t T);

// logits: [B*T, V] (or [B, T, V]), F32, BF16 or F16, upcast to fp32 row by row; labels: I32 [B*T].
// dlogits (same shape, F32, BF16 or F16; may be the logits buffer itself, overwritten) receives
// grad_scale * (softmax - onehot) for counted positions and 0 elsewhere. Rows are processed one
// at a time per thread, so fp32 logits for the whole batch never exist. A label outside [0, V)
// other than -100 is a UserError. With no counted position: loss 0, zero gradients, no NaN.
CrossEntropyResult cross_entropy_forward_backward(const TensorView& logits, const TensorView& labels, int64_t B,
                                                  int64_t T, TensorView dlogits, float grad_scale);

// The same rows without a host round trip, for a caller that queues many chunks and reads their
// losses once: the labels are range-checked on the host (`host_labels`, CPU) and read by the
// kernel from `labels` (the same values on the logits' device; on the CPU it may be host_labels);
// each row's loss (fp32, 0 for a row that does not count) goes to row_loss (F32 [B*T], the logits'
// device). Summing the counted rows' losses in row order in double gives the op above's loss_sum.
void cross_entropy_rows_forward_backward(const TensorView& logits, const TensorView& host_labels,
                                         const TensorView& labels, int64_t B, int64_t T, TensorView dlogits,
                                         float grad_scale, TensorView row_loss);

}  // namespace fsdpq
