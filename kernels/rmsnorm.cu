#include "kernels/rmsnorm.cuh"

#include <stdexcept>
#include <string>

namespace fsdpq::cuda {
namespace {

// Rows per dweight partial: fixed (not derived from the GPU), so the sum order never changes.
constexpr int64_t kRowChunk = 64;
constexpr int kColumnThreads = 256;

int row_threads(int64_t C) { return C >= 4096 ? 512 : 256; }

// Sum over the block, returned to every thread. The xor butterfly gives every lane the same bits
// (fp addition is commutative), and the order is fixed: deterministic.
__device__ float block_sum(float v, float* shared /* [32] */) {
  for (int mask = 16; mask > 0; mask >>= 1) v += __shfl_xor_sync(0xffffffffu, v, mask);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : 0.0f;
  for (int mask = 16; mask > 0; mask >>= 1) v += __shfl_xor_sync(0xffffffffu, v, mask);
  __syncthreads();  // shared may be reused by the caller's next reduction
  return v;
}

// One block per row. Every read of the row (the sum of squares) happens before the barrier in
// block_sum; afterwards each thread writes only the elements it reads, so y may alias x.
template <class X, class W, class Y>
__global__ void rmsnorm_forward_kernel(Y* y, float* rstd, const X* x, const W* weight, int64_t C, float eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const X* x_row = x + row * C;
  Y* y_row = y + row * C;
  float sum = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float v = to_float(x_row[c]);
    sum += v * v;
  }
  sum = block_sum(sum, shared);
  const float variance = __fdiv_rn(sum, static_cast<float>(C));
  const float inv_rms = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(variance, eps)));
  if (threadIdx.x == 0) rstd[row] = inv_rms;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float normalized = round_to<X>(__fmul_rn(to_float(x_row[c]), inv_rms));  // n.to(input_dtype)
    y_row[c] = from_float<Y>(__fmul_rn(to_float(weight[c]), normalized));
  }
}

// Grid (column blocks, row chunks): thread c sums its column over the chunk's rows in order.
template <class X, class DY>
__global__ void rmsnorm_dweight_partial_kernel(float* partial, const DY* dy, const X* x, const float* rstd,
                                               int64_t rows, int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowChunk;
  const int64_t r1 = r0 + kRowChunk < rows ? r0 + kRowChunk : rows;
  float sum = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float n = round_to<X>(__fmul_rn(to_float(x[r * C + c]), rstd[r]));
    sum = __fadd_rn(sum, __fmul_rn(to_float(dy[r * C + c]), n));
  }
  partial[blockIdx.y * C + c] = sum;
}

// dweight[c] += the chunk partials of column c, summed in chunk order.
__global__ void rmsnorm_dweight_finish_kernel(float* dweight, const float* partial, int64_t chunks, int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float sum = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) sum = __fadd_rn(sum, partial[k * C + c]);
  dweight[c] = __fadd_rn(dweight[c], sum);
}

// One block per row: the dot product first (all reads of dy), then each thread writes the dx
// elements whose dy it reads, so dx may alias dy.
template <class X, class W, class DY, class DX>
__global__ void rmsnorm_dx_kernel(DX* dx, const DY* dy, const X* x, const W* weight, const float* rstd, int64_t C) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const X* x_row = x + row * C;
  const DY* dy_row = dy + row * C;
  DX* dx_row = dx + row * C;
  const float s = rstd[row];
  float dot = 0.0f;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
    dot += __fmul_rn(__fmul_rn(to_float(dy_row[c]), to_float(weight[c])), __fmul_rn(to_float(x_row[c]), s));
  dot = block_sum(dot, shared);
  const float mean_dot = __fdiv_rn(dot, static_cast<float>(C));
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    const float g = __fmul_rn(to_float(dy_row[c]), to_float(weight[c]));
    const float n = __fmul_rn(to_float(x_row[c]), s);
    dx_row[c] = from_float<DX>(__fmul_rn(s, __fsub_rn(g, __fmul_rn(n, mean_dot))));
  }
}

void check_rows(int64_t rows, const char* op) {
  if (rows > 0x7fffffff) throw std::logic_error(std::string(op) + ": too many rows for one grid");
}

}  // namespace

void rmsnorm_forward(void* y, KType y_type, float* rstd, const void* x, KType x_type, const void* weight,
                     KType weight_type, int64_t rows, int64_t C, float eps, cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return;
  check_rows(rows, "rmsnorm_forward");
  with_ktype(x_type, [&](auto x_tag) {
    with_ktype(weight_type, [&](auto w_tag) {
      with_ktype(y_type, [&](auto y_tag) {
        using X = decltype(x_tag);
        using W = decltype(w_tag);
        using Y = decltype(y_tag);
        rmsnorm_forward_kernel<X, W, Y><<<static_cast<unsigned>(rows), row_threads(C), 0, stream>>>(
            static_cast<Y*>(y), rstd, static_cast<const X*>(x), static_cast<const W*>(weight), C, eps);
      });
    });
  });
  check_launch("rmsnorm_forward");
}

int64_t rmsnorm_backward_workspace(int64_t rows, int64_t C) { return ((rows + kRowChunk - 1) / kRowChunk) * C; }

void rmsnorm_backward(void* dx, KType dx_type, float* dweight, const void* dy, KType dy_type, const void* x,
                      KType x_type, const void* weight, KType weight_type, const float* rstd, int64_t rows,
                      int64_t C, float* workspace, cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return;
  check_rows(rows, "rmsnorm_backward");
  const int64_t chunks = (rows + kRowChunk - 1) / kRowChunk;
  if (dweight != nullptr && chunks > 65535) throw std::logic_error("rmsnorm_backward: too many row chunks for one grid");
  const dim3 partial_grid(static_cast<unsigned>((C + kColumnThreads - 1) / kColumnThreads), static_cast<unsigned>(chunks));
  // dweight first: it reads dy, which the dx kernel may overwrite (dx aliasing dy). A frozen
  // weight (dweight null) has none.
  if (dweight != nullptr) {
    with_ktype(x_type, [&](auto x_tag) {
      with_ktype(dy_type, [&](auto dy_tag) {
        using X = decltype(x_tag);
        using DY = decltype(dy_tag);
        rmsnorm_dweight_partial_kernel<X, DY><<<partial_grid, kColumnThreads, 0, stream>>>(
            workspace, static_cast<const DY*>(dy), static_cast<const X*>(x), rstd, rows, C);
      });
    });
    check_launch("rmsnorm_dweight_partial");
    rmsnorm_dweight_finish_kernel<<<static_cast<unsigned>((C + kColumnThreads - 1) / kColumnThreads), kColumnThreads, 0,
                                    stream>>>(dweight, workspace, chunks, C);
    check_launch("rmsnorm_dweight_finish");
  }
  with_ktype(x_type, [&](auto x_tag) {
    with_ktype(weight_type, [&](auto w_tag) {
      with_ktype(dy_type, [&](auto dy_tag) {
        with_ktype(dx_type, [&](auto dx_tag) {
          using X = decltype(x_tag);
          using W = decltype(w_tag);
          using DY = decltype(dy_tag);
          using DX = decltype(dx_tag);
          rmsnorm_dx_kernel<X, W, DY, DX><<<static_cast<unsigned>(rows), row_threads(C), 0, stream>>>(
              static_cast<DX*>(dx), static_cast<const DY*>(dy), static_cast<const X*>(x),
              static_cast<const W*>(weight), rstd, C);
        });
      });
    });
  });
  check_launch("rmsnorm_dx");
}

}  // namespace fsdpq::cuda
