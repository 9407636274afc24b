// RoPE on the GPU, in place, the arithmetic of src/ops/rope.cpp (fp32 tables, separate multiply
// and add roundings via _rn intrinsics, one rounding to x's type): bit-identical to the CPU.
#pragma once
#include <cstdint>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// x [B, T, heads, D] in place: each (i, i + D/2) pair of token t is rotated by the angle of
// position position_offset + t, or position_offset + positions[b, t] when positions (device I32
// [B, T], each inside the tables: not checked here) is given; cos/sin: device fp32 tables
// [positions, D]. sign = +1 forward, -1 backward (the opposite rotation).
void rope_rotate(void* x, KType type, const float* cos, const float* sin, int64_t B, int64_t T, int64_t heads,
                 int64_t D, int64_t position_offset, const int32_t* positions, float sign, cudaStream_t stream);

}  // namespace fsdpq::cuda
