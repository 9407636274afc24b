// Gradient passes over flat fp32 buffers in GPU memory, the device counterparts of
// grad_sq_sum (clip.h), ShardedTrainingState::scale_gradients / clip_grads_to_norm's multiply and
// DynamicLossScaler::unscale. Each gives the CPU's result: unscale and scale bit for bit, the
// sum of squares to ~1e-15 relative (the same chunks and chunk order; within a chunk a fixed
// tree instead of left to right). Every pointer is a device pointer; the work runs on the
// compute stream. In a build without CUDA each throws std::logic_error.
#pragma once
#include <cstdint>
#include <span>

#include "optim/clip.h"
#include "optim/loss_scaler.h"

namespace fsdpq {

// grad_sq_sum on the device (waits for the stream).
double device_grad_sq_sum(const float* d, int64_t n);
// Over several buffers, added per buffer in order as grad_sq_sum(span) does; one copy back.
double device_grad_sq_sum(std::span<const GradBuffer> grads);

// d[i] *= f (queued).
void device_scale(float* d, int64_t n, float f);

// scaler.unscale(d, n) on the device: d[i] *= scaler.inv_scale(); returns whether any value was
// inf or NaN (waits for the stream). A NaN stays NaN (its payload may differ from the CPU's).
bool device_unscale(float* d, int64_t n, const DynamicLossScaler& scaler);
// The same over several buffers with one flag and one wait.
bool device_unscale(std::span<const GradBuffer> grads, const DynamicLossScaler& scaler);

// d[i] = 0 (queued).
void device_fill_zero(float* d, int64_t n);

}  // namespace fsdpq
