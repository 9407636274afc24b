// Whole-buffer passes over flat device fp32 buffers (gradient shards): the sum of squares for
// clipping, scaling, loss-scale unscaling with the inf/NaN check, and filling. Each matches its
// CPU counterpart in optim/clip.cpp, optim/loss_scaler.cpp and fsdp/sharded_training_state.cpp.
#pragma once
#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// clip.cpp's grad_sq_sum chunking: chunk c covers [c·2^16, min(n, (c+1)·2^16)).
constexpr int64_t kSqSumChunk = int64_t{1} << 16;
inline int64_t sum_of_squares_chunks(int64_t n) { return n <= 0 ? 0 : (n + kSqSumChunk - 1) / kSqSumChunk; }

// Σ double(x[i])² over [0, n), deterministically: one fp64 partial per chunk (each square is
// exact in fp64; a fixed tree inside the chunk, where the CPU adds left to right), then the
// partials added in chunk order on the host, as the CPU's final loop does. `scratch` is device
// memory for sum_of_squares_chunks(n) doubles. Waits for the stream and returns the sum.
double sum_of_squares_f64(const float* x, int64_t n, double* scratch, cudaStream_t stream);
// Just the partials (queued, no wait): partials[c] = the fp64 sum of chunk c, for callers that
// collect several buffers' partials and copy them back once.
void sum_of_squares_partials(const float* x, int64_t n, double* partials, cudaStream_t stream);

// x[i] *= f (one fp32 multiply, as the CPU's `g *= f`).
void scale(float* x, int64_t n, float f, cudaStream_t stream);

// DynamicLossScaler::unscale: each value is checked, then multiplied by inv_scale (the fp32
// reciprocal, not a division). Sets *found = 1 (device int) when any value was inf or NaN and
// never clears it, so several buffers can share one flag (zero it first).
void unscale_and_check(float* x, int64_t n, float inv_scale, int32_t* found, cudaStream_t stream);

// x[i] = value.
void fill(float* x, int64_t n, float value, cudaStream_t stream);

}  // namespace fsdpq::cuda
