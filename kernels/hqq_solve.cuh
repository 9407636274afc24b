// HQQ's solver on the GPU (kernels/hqq_solver.h, docs/hqq.md): each group's starting scale and zero
// point and `updates` proximal updates of the zero point in float16 arithmetic, one thread per
// group, bit-identical to the CPU's half solver (src/quant/hqq.cpp). The error sums that decide
// when hqq stops are kept per block of 64 consecutive groups, summed in group order as the CPU
// sums them.
#pragma once
#include <cstdint>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// The groups a block of error statistics holds (quant/hqq.h's kHqqBlockGroups).
inline constexpr int64_t kHqqSolveBlockGroups = 64;

// values: groups * 64 floats on the device (group k at values + 64k); scales, zeros: one float per
// group (the solver's scale and zero point, float16 values); block_errors: nullptr, or
// ceil(groups / 64) * 20 doubles, block b's sum over its groups of their error before update i at
// [b * 20 + i] (0 past `updates`). host_shrink_powers: quant/hqq.h's table of |x|^-0.3 for every
// non-negative half x (0x7c01 floats), copied to the device on the first call.
void hqq_solve(const float* values, int64_t groups, int n_bits, int updates, const float* host_shrink_powers,
               float* scales, float* zeros, double* block_errors, cudaStream_t stream);

}  // namespace fsdpq::cuda
