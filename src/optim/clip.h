// Gradient clipping by global L2 norm, as torch.nn.utils.clip_grad_norm_. The norm is split in
// two steps so that a sharded caller can all-reduce the partial sum of squares first:
//   partial = grad_sq_sum(my shards); all-reduce(partial); norm = sqrt(partial);
//   clip_grads_to_norm(my shards, norm, max_norm).
#pragma once
#include <cstdint>
#include <span>

namespace fsdpq {

struct GradBuffer {
  float* data = nullptr;
  int64_t numel = 0;
};

// Sum of squares over the buffers, accumulated in double (fixed chunking: the result does not
// depend on the number of threads).
double grad_sq_sum(std::span<const GradBuffer> grads);
double grad_sq_sum(const float* grad, int64_t n);
// grad[i] += addend[i] * scale over [0, n), and the sum of squares of the result exactly as
// grad_sq_sum computes it: one pass over memory where accumulating then measuring takes two.
// With `found_nonfinite` (fp16 loss scaling) each accumulated value is also checked and then
// multiplied by `unscale`, as DynamicLossScaler::unscale does between the two passes; the sum is
// of the unscaled values and *found_nonfinite says whether any was inf or NaN.
double accumulate_and_sq_sum(float* grad, const float* addend, float scale, int64_t n, float unscale = 1.0f,
                             bool* found_nonfinite = nullptr);

// torch's clip_coef = max_norm / (total_norm + 1e-6), clamped to at most 1.
double clip_coefficient(double total_norm, double max_norm);

struct ClipResult {
  double total_norm = 0.0;   // the norm before clipping
  double coefficient = 1.0;  // what the gradients were multiplied by (1 when not clipped)
  bool clipped = false;
};

// Scales the buffers by clip_coefficient(total_norm, max_norm) when that is below 1 (a
// non-finite norm gives coefficient 0 → NaN/zero gradients, as torch without
// error_if_nonfinite; callers that use loss scaling skip such steps before clipping).
ClipResult clip_grads_to_norm(std::span<const GradBuffer> grads, double total_norm,
                              double max_norm);

// Single-process convenience: norm over all buffers, then clip.
ClipResult clip_grad_norm(std::span<const GradBuffer> grads, double max_norm);

}  // namespace fsdpq
