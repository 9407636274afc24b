#include "kernels/dora.cuh"

namespace fsdpq::cuda {
namespace {

constexpr int kThreads = 256;

// Sums one value per thread of the block in a fixed tree; thread 0 gets the total.
__device__ float block_sum(float v, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = threadIdx.x < blockDim.x / 32 ? shared[threadIdx.x] : 0.0f;
  if (warp == 0)
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// One block per row.
__global__ void row_norms_kernel(float* norm, const float* P, int64_t in) {
  __shared__ float shared[kThreads / 32];
  const float* row = P + static_cast<int64_t>(blockIdx.x) * in;
  float sum = 0.0f;
  for (int64_t k = threadIdx.x; k < in; k += blockDim.x) sum = fmaf(row[k], row[k], sum);
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) norm[blockIdx.x] = sqrtf(sum);
}

// One block per row: Σ_j W[o, j]² over the row, then Σ_k B[o, k]·(2s·G[o, k] + s²·H[o, k]) over
// its r entries, in one fixed tree.
template <class W, class B>
__global__ void norm_from_parts_kernel(float* norm, const W* w, const B* b, const float* g, const float* h,
                                       int64_t in, int64_t r, float two_s, float s2) {
  __shared__ float shared[kThreads / 32];
  const int64_t o = blockIdx.x;
  const W* row = w + o * in;
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < in; j += blockDim.x) {
    const float v = to_float(row[j]);
    sum = fmaf(v, v, sum);
  }
  for (int64_t k = threadIdx.x; k < r; k += blockDim.x)
    sum = fmaf(to_float(b[o * r + k]), fmaf(two_s, g[o * r + k], s2 * h[o * r + k]), sum);
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) norm[o] = sqrtf(fmaxf(sum, 0.0f));
}

template <class M>
__global__ void magnitude_scale_kernel(float* g, const M* m, const float* n, int64_t out) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j < out) g[j] = __fdiv_rn(to_float(m[j]), n[j]);
}

template <class I, class O>
__global__ void scale_columns_kernel(O* out, const I* in, const float* g, float offset, bool accumulate, int64_t rows,
                                     int64_t cols) {
  const int64_t n = rows * cols, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += stride) {
    const float scaled = __fmul_rn(to_float(in[e]), __fadd_rn(g[e % cols], offset));
    out[e] = from_float<O>(accumulate ? __fadd_rn(to_float(out[e]), scaled) : scaled);
  }
}

// A block of 32 columns × kRowLanes row lanes: each lane sums rows lane, lane + kRowLanes, ...
// of its column (coalesced across the warp's 32 columns), then lane 0 adds the lanes in order.
constexpr int kRowLanes = 8;

template <class D, class Z>
__global__ void magnitude_backward_kernel(float* dm, const D* dy, const Z* z, const float* n, int64_t rows,
                                          int64_t cols) {
  __shared__ float partial[kRowLanes][32];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float sum = 0.0f;
  if (j < cols)
    for (int64_t t = threadIdx.y; t < rows; t += kRowLanes) sum = fmaf(to_float(dy[t * cols + j]), to_float(z[t * cols + j]), sum);
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || j >= cols) return;
  float total = 0.0f;
  for (int lane = 0; lane < kRowLanes; ++lane) total += partial[lane][threadIdx.x];
  dm[j] += __fdiv_rn(total, n[j]);
}

}  // namespace

void dora_row_norms(float* norm, const float* P, int64_t rows, int64_t in, cudaStream_t stream) {
  if (rows <= 0) return;
  row_norms_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(norm, P, in);
  check_launch("dora_row_norms");
}

void dora_norm_from_parts(float* norm, const void* w, KType w_type, const void* b, KType b_type, const float* g,
                          const float* h, int64_t out, int64_t in, int64_t r, float scaling, cudaStream_t stream) {
  if (out <= 0) return;
  with_ktype(w_type, [&](auto w_tag) {
    with_ktype(b_type, [&](auto b_tag) {
      using W = decltype(w_tag);
      using B = decltype(b_tag);
      norm_from_parts_kernel<W, B><<<static_cast<unsigned>(out), kThreads, 0, stream>>>(
          norm, static_cast<const W*>(w), static_cast<const B*>(b), g, h, in, r, 2.0f * scaling, scaling * scaling);
    });
  });
  check_launch("dora_norm_from_parts");
}

void dora_magnitude_scale(float* g, const void* m, KType m_type, const float* n, int64_t out, cudaStream_t stream) {
  if (out <= 0) return;
  with_ktype(m_type, [&](auto tag) {
    using M = decltype(tag);
    magnitude_scale_kernel<M><<<static_cast<unsigned>((out + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
        g, static_cast<const M*>(m), n, out);
  });
  check_launch("dora_magnitude_scale");
}

void dora_scale_columns(void* out, KType out_type, const void* in, KType in_type, const float* g, float offset,
                        bool accumulate, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows * cols <= 0) return;
  with_ktype(in_type, [&](auto in_tag) {
    with_ktype(out_type, [&](auto out_tag) {
      using I = decltype(in_tag);
      using O = decltype(out_tag);
      scale_columns_kernel<I, O><<<blocks_for(rows * cols, kThreads), kThreads, 0, stream>>>(
          static_cast<O*>(out), static_cast<const I*>(in), g, offset, accumulate, rows, cols);
    });
  });
  check_launch("dora_scale_columns");
}

void dora_magnitude_backward(float* dm, const void* dy, KType dy_type, const void* z, KType z_type, const float* n,
                             int64_t rows, int64_t cols, cudaStream_t stream) {
  if (cols <= 0) return;
  with_ktype(dy_type, [&](auto dy_tag) {
    with_ktype(z_type, [&](auto z_tag) {
      using D = decltype(dy_tag);
      using Z = decltype(z_tag);
      magnitude_backward_kernel<D, Z><<<static_cast<unsigned>((cols + 31) / 32), dim3(32, kRowLanes), 0, stream>>>(
          dm, static_cast<const D*>(dy), static_cast<const Z*>(z), n, rows, cols);
    });
  });
  check_launch("dora_magnitude_backward");
}

}  // namespace fsdpq::cuda
