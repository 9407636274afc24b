#include "kernels/rope.cuh"

#include <stdexcept>

namespace fsdpq::cuda {
namespace {

constexpr int kThreads = 256;

// One rotated pair: the arithmetic of src/ops/rope.cpp, rounding each multiply and add alone.
struct Rotated {
  float first, second;
};
__device__ __forceinline__ Rotated rotate_pair(float x1, float x2, float c1, float c2, float s1, float s2) {
  return {__fsub_rn(__fmul_rn(x1, c1), __fmul_rn(x2, s1)), __fadd_rn(__fmul_rn(x2, c2), __fmul_rn(x1, s2))};
}

// Block (threads_x, rows_per_block): threadIdx.y picks one head row (b, t, h), threadIdx.x walks its
// (i, i + D/2) pairs, so both halves are read and written coalesced and the row's position is
// computed once per thread (no 64-bit divisions per element). Each pair is owned by one thread.
// The general kernel: any D, any alignment.
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
    const Rotated r = rotate_pair(to_float(v[i]), to_float(v[i + half]), cos_row[i], cos_row[i + half],
                                  __fmul_rn(sign, sin_row[i]), __fmul_rn(sign, sin_row[i + half]));
    v[i] = from_float<S>(r.first);
    v[i + half] = from_float<S>(r.second);
  }
}

// Eight consecutive elements moved as 16-byte pieces (one for 16-bit types, two for fp32).
constexpr int kPairsPerThread = 8;
constexpr int kHeadsPerThread = 8;

template <class S>
struct Eight {
  static constexpr int kPieces = sizeof(S) * kPairsPerThread / 16;
  union {
    uint4 piece[kPieces];
    S value[kPairsPerThread];
  };
};

template <class S>
__device__ __forceinline__ Eight<S> load_eight(const S* p) {
  Eight<S> e;
#pragma unroll
  for (int k = 0; k < Eight<S>::kPieces; ++k) e.piece[k] = reinterpret_cast<const uint4*>(p)[k];
  return e;
}

template <class S>
__device__ __forceinline__ void store_eight(S* p, const Eight<S>& e) {
#pragma unroll
  for (int k = 0; k < Eight<S>::kPieces; ++k) reinterpret_cast<uint4*>(p)[k] = e.piece[k];
}

__device__ __forceinline__ void load_floats(const float* p, float (&out)[kPairsPerThread]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}

// The wide kernel, for D/2 a multiple of 8 and 16-byte aligned rows (every Llama shape): a thread
// takes 8 pairs of one token in up to 8 of its heads, so it reads their cos and sin once for all
// of them and moves x in 16-byte pieces. RoPE reads and writes each element once, so this is a
// memory-bound copy; the narrow kernel's scalar accesses reached ~35% of the bandwidth. The same
// operations per element: the same bits.
template <class S>
__global__ void rope_wide_kernel(S* x, const float* cos, const float* sin, int64_t tokens, int64_t T, int64_t heads,
                                 int64_t D, int64_t position_offset, const int32_t* positions, float sign) {
  const int64_t half = D / 2;
  const int64_t chunks = half / kPairsPerThread;                               // per head
  const int64_t head_groups = (heads + kHeadsPerThread - 1) / kHeadsPerThread;  // per token
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= tokens * head_groups * chunks) return;
  // chunk fastest, so a warp's neighbours touch neighbouring 16-byte pieces of one head row.
  const int64_t chunk = item % chunks;
  const int64_t group = (item / chunks) % head_groups;
  const int64_t token = item / (chunks * head_groups);  // b * T + t
  const int64_t position = position_offset + (positions != nullptr ? positions[token] : token % T);
  const int64_t i = chunk * kPairsPerThread;
  float c1[kPairsPerThread], c2[kPairsPerThread], s1[kPairsPerThread], s2[kPairsPerThread];
  load_floats(cos + position * D + i, c1);
  load_floats(cos + position * D + i + half, c2);
  load_floats(sin + position * D + i, s1);
  load_floats(sin + position * D + i + half, s2);
#pragma unroll
  for (int k = 0; k < kPairsPerThread; ++k) s1[k] = __fmul_rn(sign, s1[k]), s2[k] = __fmul_rn(sign, s2[k]);
  const int64_t head_end = min(heads, (group + 1) * kHeadsPerThread);
  for (int64_t h = group * kHeadsPerThread; h < head_end; ++h) {
    S* v = x + (token * heads + h) * D + i;
    Eight<S> a = load_eight(v), b = load_eight(v + half);
#pragma unroll
    for (int k = 0; k < kPairsPerThread; ++k) {
      const Rotated r = rotate_pair(to_float(a.value[k]), to_float(b.value[k]), c1[k], c2[k], s1[k], s2[k]);
      a.value[k] = from_float<S>(r.first);
      b.value[k] = from_float<S>(r.second);
    }
    store_eight(v, a);
    store_eight(v + half, b);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void rope_rotate(void* x, KType type, const float* cos, const float* sin, int64_t B, int64_t T, int64_t heads,
                 int64_t D, int64_t position_offset, const int32_t* positions, float sign, cudaStream_t stream) {
  const int64_t rows = B * T * heads, half = D / 2;
  if (rows <= 0 || half <= 0) return;
  // 16-byte pieces need 8-pair chunks (so every row offset stays a multiple of 16 bytes) and
  // aligned bases.
  if (half % kPairsPerThread == 0 && aligned16(x) && aligned16(cos) && aligned16(sin)) {
    const int64_t items = B * T * ((heads + kHeadsPerThread - 1) / kHeadsPerThread) * (half / kPairsPerThread);
    const int64_t blocks = (items + kThreads - 1) / kThreads;
    if (blocks > 0x7fffffff) throw std::logic_error("rope_rotate: too many rows for one grid");
    with_ktype(type, [&](auto tag) {
      using S = decltype(tag);
      rope_wide_kernel<S><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
          static_cast<S*>(x), cos, sin, B * T, T, heads, D, position_offset, positions, sign);
    });
    check_launch("rope_rotate");
    return;
  }
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
