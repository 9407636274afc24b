#include "kernels/rope.cuh"

#include <stdexcept>

namespace fsdpq::cuda {
namespace {

constexpr int kThreads = 256;

// Block (threads_x, rows_per_block): threadIdx.y picks one head row (b, t, h), threadIdx.x walks its
// (i, i + D/2) pairs, so both halves are read and written coalesced and the row's position is
// computed once per thread (no 64-bit divisions per element). Each pair is owned by one thread.
template <class S>
__global__ void rope_kernel(S* x, const float* cos, const float* sin, int64_t rows, int64_t T, int64_t heads,
                            int64_t D, int64_t position_offset, const int32_t* positions, float sign) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;  // (b * T + t) * heads + h
  if (row >= rows) return;
  const int64_t half = D / 2;
  const int64_t token = row / heads;  // b * T + t
  const int64_t position = position_offset + (positions != nullptr ? positions[token] : token % T);
  const float* cos_row = cos + position * D;
  const float* sin_row = sin + position * D;
  S* v = x + row * D;
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float x1 = to_float(v[i]), x2 = to_float(v[i + half]);
    const float s1 = __fmul_rn(sign, sin_row[i]), s2 = __fmul_rn(sign, sin_row[i + half]);
    v[i] = from_float<S>(__fsub_rn(__fmul_rn(x1, cos_row[i]), __fmul_rn(x2, s1)));
    v[i + half] = from_float<S>(__fadd_rn(__fmul_rn(x2, cos_row[i + half]), __fmul_rn(x1, s2)));
  }
}

}  // namespace

void rope_rotate(void* x, KType type, const float* cos, const float* sin, int64_t B, int64_t T, int64_t heads,
                 int64_t D, int64_t position_offset, const int32_t* positions, float sign, cudaStream_t stream) {
  const int64_t rows = B * T * heads, half = D / 2;
  if (rows <= 0 || half <= 0) return;
  // threads_x: the pairs of a row rounded up to a warp (at most kThreads); the rest of the block
  // takes further rows.
  const int threads_x = static_cast<int>(half >= kThreads ? kThreads : ((half + 31) / 32) * 32);
  const int rows_per_block = kThreads / threads_x;
  const int64_t blocks = (rows + rows_per_block - 1) / rows_per_block;
  if (blocks > 0x7fffffff) throw std::logic_error("rope_rotate: too many rows for one grid");
  const dim3 block(static_cast<unsigned>(threads_x), static_cast<unsigned>(rows_per_block));
  with_ktype(type, [&](auto tag) {
    using S = decltype(tag);
    rope_kernel<S><<<static_cast<unsigned>(blocks), block, 0, stream>>>(static_cast<S*>(x), cos, sin, rows, T, heads, D,
                                                                        position_offset, positions, sign);
  });
  check_launch("rope_rotate");
}

}  // namespace fsdpq::cuda
