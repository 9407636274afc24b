#include "kernels/rmsnorm.cuh"

#include "kernels/vector8.cuh"

#include <stdexcept>
#include <string>
#include <type_traits>

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

// ---- the fused, vectorized row kernels: one block per row, kRowThreads threads, each holding
// NCH chunks of 8 consecutive elements of the row in registers (NCH 1, 2 or 4: a kernel per count,
// so the registers are what the row needs) ----

constexpr int kRowThreads = 512;
constexpr int kMaxChunks = 4;  // C <= 512 x 8 x 4 = 16384

// Chunk k of this thread: elements [8 (threadIdx.x + k blockDim.x), + 8) of the row.
__device__ __forceinline__ int64_t chunk_at(int k) { return 8 * (static_cast<int64_t>(threadIdx.x) + k * kRowThreads); }

template <class X, class W, class Y, bool kResidual, int NCH>
__global__ void __launch_bounds__(kRowThreads)
    residual_rmsnorm_kernel(X* x2, Y* y, float* rstd, const X* residual, const W* weight, int64_t C, float eps) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  X* x_row = x2 + row * C;
  float v[NCH][8];
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < NCH; ++k) {
    const int64_t c = chunk_at(k);
    if (c >= C) break;
    load8(v[k], x_row + c);
    if constexpr (kResidual) {
      float r[8];
      load8(r, residual + row * C + c);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[k][e] = round_to<X>(__fadd_rn(r[e], v[k][e]));  // residual_add's value
      store8(x_row + c, v[k]);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) sum += v[k][e] * v[k][e];
  }
  sum = block_sum(sum, shared);
  const float variance = __fdiv_rn(sum, static_cast<float>(C));
  const float inv_rms = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(variance, eps)));
  if (threadIdx.x == 0) rstd[row] = inv_rms;
#pragma unroll
  for (int k = 0; k < NCH; ++k) {
    const int64_t c = chunk_at(k);
    if (c >= C) break;
    float w[8], out[8];
    load8(w, weight + c);
#pragma unroll
    for (int e = 0; e < 8; ++e) out[e] = __fmul_rn(w[e], round_to<X>(__fmul_rn(v[k][e], inv_rms)));  // n.to(input_dtype)
    store8(y + row * C + c, out);
  }
}

template <class X, class W, class DY, class ACC, int NCH>
__global__ void __launch_bounds__(kRowThreads)
    rmsnorm_backward_add_kernel(ACC* d_acc, const DY* dy, const X* x, const W* weight, const float* rstd, int64_t C) {
  __shared__ float shared[32];
  const int64_t row = blockIdx.x;
  const float s = rstd[row];
  float g[NCH][8], n[NCH][8];
  float dot = 0.0f;
#pragma unroll
  for (int k = 0; k < NCH; ++k) {
    const int64_t c = chunk_at(k);
    if (c >= C) break;
    float d[8], w[8], xv[8];
    load8(d, dy + row * C + c);
    load8(w, weight + c);
    load8(xv, x + row * C + c);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      g[k][e] = __fmul_rn(d[e], w[e]);
      n[k][e] = __fmul_rn(xv[e], s);
      dot += __fmul_rn(g[k][e], n[k][e]);
    }
  }
  dot = block_sum(dot, shared);
  const float mean_dot = __fdiv_rn(dot, static_cast<float>(C));
#pragma unroll
  for (int k = 0; k < NCH; ++k) {
    const int64_t c = chunk_at(k);
    if (c >= C) break;
    float acc[8];
    load8(acc, d_acc + row * C + c);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float dx = round_to<DY>(__fmul_rn(s, __fsub_rn(g[k][e], __fmul_rn(n[k][e], mean_dot))));
      acc[e] = __fadd_rn(acc[e], dx);
    }
    store8(d_acc + row * C + c, acc);
  }
}

// fn(std::integral_constant<int, NCH>) for the chunks per thread a row of C needs.
template <class Fn>
void with_chunks(int64_t C, Fn&& fn) {
  const int64_t chunks = (C + 8 * kRowThreads - 1) / (8 * kRowThreads);
  if (chunks <= 1)
    fn(std::integral_constant<int, 1>{});
  else if (chunks == 2)
    fn(std::integral_constant<int, 2>{});
  else
    fn(std::integral_constant<int, 4>{});
}

void check_rows(int64_t rows, const char* op) {
  if (rows > 0x7fffffff) throw std::logic_error(std::string(op) + ": too many rows for one grid");
}

}  // namespace

bool rmsnorm_rows_fit(int64_t C, std::initializer_list<const void*> pointers) {
  // (callers also need x and y, or x, dy and d_acc, of one storage type: one kernel per weight type)
  if (C <= 0 || C % 8 != 0 || C > static_cast<int64_t>(kRowThreads) * 8 * kMaxChunks) return false;
  for (const void* p : pointers)
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

void residual_rmsnorm_forward(void* x2, KType x_type, void* y, KType y_type, float* rstd, const void* residual,
                              const void* weight, KType weight_type, int64_t rows, int64_t C, float eps,
                              cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return;
  check_rows(rows, "residual_rmsnorm_forward");
  if (!rmsnorm_rows_fit(C, {x2, y, residual, weight}))
    throw std::logic_error("residual_rmsnorm_forward: the row does not fit the vectorized kernel (rmsnorm_rows_fit)");
  if (y_type != x_type) throw std::logic_error("residual_rmsnorm_forward: y must be of x's storage type");
  with_ktype(x_type, [&](auto x_tag) {
    with_ktype(weight_type, [&](auto w_tag) {
      {
        using X = decltype(x_tag);
        using W = decltype(w_tag);
        using Y = X;
        with_chunks(C, [&](auto chunks) {
          constexpr int NCH = decltype(chunks)::value;
          const auto kernel = residual != nullptr ? residual_rmsnorm_kernel<X, W, Y, true, NCH>
                                                  : residual_rmsnorm_kernel<X, W, Y, false, NCH>;
          kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
              static_cast<X*>(x2), static_cast<Y*>(y), rstd, static_cast<const X*>(residual),
              static_cast<const W*>(weight), C, eps);
        });
      }
    });
  });
  check_launch("residual_rmsnorm_forward");
}

void rmsnorm_backward_add(void* d_acc, KType acc_type, const void* dy, KType dy_type, const void* x, KType x_type,
                          const void* weight, KType weight_type, const float* rstd, int64_t rows, int64_t C,
                          cudaStream_t stream) {
  if (rows <= 0 || C <= 0) return;
  check_rows(rows, "rmsnorm_backward_add");
  if (!rmsnorm_rows_fit(C, {d_acc, dy, x, weight}))
    throw std::logic_error("rmsnorm_backward_add: the row does not fit the vectorized kernel (rmsnorm_rows_fit)");
  if (dy_type != x_type || acc_type != x_type)
    throw std::logic_error("rmsnorm_backward_add: dy and d_acc must be of x's storage type");
  with_ktype(x_type, [&](auto x_tag) {
    with_ktype(weight_type, [&](auto w_tag) {
      {
        {
          using X = decltype(x_tag);
          using W = decltype(w_tag);
          using DY = X;
          using ACC = X;
          with_chunks(C, [&](auto chunks) {
            constexpr int NCH = decltype(chunks)::value;
            rmsnorm_backward_add_kernel<X, W, DY, ACC, NCH><<<static_cast<unsigned>(rows), kRowThreads, 0, stream>>>(
                static_cast<ACC*>(d_acc), static_cast<const DY*>(dy), static_cast<const X*>(x),
                static_cast<const W*>(weight), rstd, C);
          });
        }
      }
    });
  });
  check_launch("rmsnorm_backward_add");
}

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
