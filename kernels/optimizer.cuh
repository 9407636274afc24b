// The optimizer step on the GPU: the same per-element arithmetic as optim/optimizer.cpp, operation
// by operation in fp32 with every multiply, add, divide and square root rounded separately
// (__fmul_rn & co., so nvcc never fuses them into an FMA the CPU does not do), and the scalars
// computed on the host exactly as the CPU computes them. A GPU step therefore gives the CPU's
// bits, and a shard can move between the CPU and the GPU mid-run.
#pragma once
#include "kernels/kernel_types.cuh"
#include "kernels/optimizer_config.h"

namespace fsdpq::cuda {

// One step over elements [0, n) of flat device fp32 buffers, as the CPU's optimizer_step (lr is
// the scheduled rate; config.lr is not read): `state` is a host array of device pointers, one per state buffer in optimizer_state_names
// order (none for sgd); `step` is the count after its increment (≥ 1, else std::logic_error).
// When `compute` is not null, the updated param is also stored there as `compute_type`
// (round to nearest even, the bits of util/bf16.h) in the same pass.
void optimizer_step(const OptimizerConfig& config, double lr, int64_t step, float* param, const float* grad,
                    float* const* state, int64_t n, void* compute, KType compute_type, cudaStream_t stream);

// dst[i] = src[i] stored as dst_type (F32: a device-to-device copy; BF16 / F16: convert.cuh's
// round-to-nearest-even conversions). dst needs only its element alignment.
void store_compute(const float* src, void* dst, KType dst_type, int64_t n, cudaStream_t stream);

}  // namespace fsdpq::cuda
