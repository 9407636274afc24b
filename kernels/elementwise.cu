#include "kernels/elementwise.cuh"

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/vector8.cuh"

namespace fsdpq::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

// Grid-stride map: each thread loads kUnroll elements (a stride apart, so every load is
// coalesced) before it stores any, which keeps several requests in flight even though the
// compiler must assume outputs alias inputs. Element i's value depends only on element i of the
// inputs, so loading ahead is safe under aliasing.
template <class Op>
__global__ void map_kernel(int64_t n, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    float v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) v[k] = op.load(i + k * stride);
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) op.store(i + k * stride, v[k]);
  }
  for (; i < n; i += stride) op.store(i, op.load(i));
}

// The same map, 8 consecutive elements a thread through 16-byte accesses (Op::load8 / store8), for
// ops over contiguous arrays whose pointers are 16-byte aligned and n a multiple of 8: the scalar
// 2-byte accesses above left e.g. the residual add at ~2 TB/s on an H100 (ncu, bench/RESULTS.md
// stop 40). A thread loads its group before it stores it, so outputs may alias inputs.
template <class Op>
__global__ void map8_kernel(int64_t groups, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    float v[8];
    op.load8(8 * g, v);
    op.store8(8 * g, v);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Throws std::runtime_error("CUDA <what>: <error>") when queueing a copy or a memset failed (and
// clears the error, as check_launch does for kernels).
void check_queued(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(err));
}

template <class Op>
void launch_map(int64_t n, const Op& op, cudaStream_t stream, const char* name) {
  if (n <= 0) return;
  if constexpr (Op::kVector) {
    if (n % 8 == 0 && op.aligned()) {
      map8_kernel<<<blocks_for(n / 8, kThreads), kThreads, 0, stream>>>(n / 8, op);
      check_launch(name);
      return;
    }
  }
  map_kernel<<<blocks_for((n + kUnroll - 1) / kUnroll, kThreads), kThreads, 0, stream>>>(n, op);
  check_launch(name);
}

template <class Y, class A, class B>
struct ResidualAdd {
  Y* out;
  const A* a;
  const B* b;
  __device__ float load(int64_t i) const { return __fadd_rn(to_float(a[i]), to_float(b[i])); }
  __device__ void store(int64_t i, float v) const { out[i] = from_float<Y>(v); }
  static constexpr bool kVector = true;
  bool aligned() const { return aligned16(out) && aligned16(a) && aligned16(b); }
  __device__ void load8(int64_t i, float (&v)[8]) const {
    float w[8];
    cuda::load8(v, a + i);
    cuda::load8(w, b + i);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = __fadd_rn(v[k], w[k]);
  }
  __device__ void store8(int64_t i, const float (&v)[8]) const { cuda::store8(out + i, v); }
};

template <class T>
struct Scale {
  T* x;
  float factor;
  __device__ float load(int64_t i) const { return __fmul_rn(to_float(x[i]), factor); }
  __device__ void store(int64_t i, float v) const { x[i] = from_float<T>(v); }
  static constexpr bool kVector = true;
  bool aligned() const { return aligned16(x); }
  __device__ void load8(int64_t i, float (&v)[8]) const {
    cuda::load8(v, x + i);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = __fmul_rn(v[k], factor);
  }
  __device__ void store8(int64_t i, const float (&v)[8]) const { cuda::store8(x + i, v); }
};

template <class S>
struct Accumulate {
  float* dst;
  const S* src;
  __device__ float load(int64_t i) const { return __fadd_rn(dst[i], to_float(src[i])); }
  __device__ void store(int64_t i, float v) const { dst[i] = v; }
  static constexpr bool kVector = true;
  bool aligned() const { return aligned16(dst) && aligned16(src); }
  __device__ void load8(int64_t i, float (&v)[8]) const {
    float w[8];
    cuda::load8(v, dst + i);
    cuda::load8(w, src + i);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = __fadd_rn(v[k], w[k]);
  }
  __device__ void store8(int64_t i, const float (&v)[8]) const { cuda::store8(dst + i, v); }
};

template <class Y, class X>
struct AddScaled {
  Y* y;
  const X* x;
  float factor;
  __device__ float load(int64_t i) const { return __fadd_rn(to_float(y[i]), __fmul_rn(factor, to_float(x[i]))); }
  __device__ void store(int64_t i, float v) const { y[i] = from_float<Y>(v); }
  static constexpr bool kVector = true;
  bool aligned() const { return aligned16(y) && aligned16(x); }
  __device__ void load8(int64_t i, float (&v)[8]) const {
    float w[8];
    cuda::load8(v, y + i);
    cuda::load8(w, x + i);
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = __fadd_rn(v[k], __fmul_rn(factor, w[k]));
  }
  __device__ void store8(int64_t i, const float (&v)[8]) const { cuda::store8(y + i, v); }
};

template <class Y, class X>
struct Convert {
  Y* dst;
  const X* src;
  __device__ float load(int64_t i) const { return to_float(src[i]); }
  __device__ void store(int64_t i, float v) const { dst[i] = from_float<Y>(v); }
  static constexpr bool kVector = true;
  bool aligned() const { return aligned16(dst) && aligned16(src); }
  __device__ void load8(int64_t i, float (&v)[8]) const { cuda::load8(v, src + i); }
  __device__ void store8(int64_t i, const float (&v)[8]) const { cuda::store8(dst + i, v); }
};

// Element i of a [rows, cols] block, both sides strided.
template <class Y, class X>
struct ScaledBlock {
  Y* dst;
  const X* src;
  int64_t cols, dst_stride, src_stride;
  float scale;
  __device__ float load(int64_t i) const { return __fmul_rn(to_float(src[i / cols * src_stride + i % cols]), scale); }
  __device__ void store(int64_t i, float v) const { dst[i / cols * dst_stride + i % cols] = from_float<Y>(v); }
  static constexpr bool kVector = false;  // strided rows
};

// Block-wide sum of one double per thread, in a fixed tree order (deterministic).
__device__ double block_sum(double v, double* shared /* [32] */) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? shared[lane] : 0.0;
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(0xffffffffu, v, offset);
  }
  return v;  // valid in thread 0
}

// One block per chunk: partial[chunk] = Σ over the chunk of double(x)², each thread summing
// its strided elements in order, then the block tree.
template <class T>
__global__ void sum_of_squares_chunks_kernel(const T* x, int64_t n, double* partial) {
  __shared__ double shared[32];
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kSumOfSquaresChunk;
  const int64_t end = begin + kSumOfSquaresChunk < n ? begin + kSumOfSquaresChunk : n;
  double sum = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) {
    const double d = to_float(x[i]);
    sum += d * d;
  }
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// One block: thread t sums partials t, t + blockDim, ... in order, then the block tree.
__global__ void sum_partials_kernel(const double* partial, int64_t count, double* result) {
  __shared__ double shared[32];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) sum += partial[i];
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) *result = sum;
}

}  // namespace

void residual_add(void* out, KType out_type, const void* a, KType a_type, const void* b, KType b_type, int64_t n,
                  cudaStream_t stream) {
  with_ktype(out_type, [&](auto y_tag) {
    with_ktype(a_type, [&](auto a_tag) {
      with_ktype(b_type, [&](auto b_tag) {
        using Y = decltype(y_tag);
        using A = decltype(a_tag);
        using B = decltype(b_tag);
        launch_map(n, ResidualAdd<Y, A, B>{static_cast<Y*>(out), static_cast<const A*>(a), static_cast<const B*>(b)},
                   stream, "residual_add");
      });
    });
  });
}

void scale_in_place(void* x, KType type, float factor, int64_t n, cudaStream_t stream) {
  with_ktype(type, [&](auto tag) {
    using T = decltype(tag);
    launch_map(n, Scale<T>{static_cast<T*>(x), factor}, stream, "scale_in_place");
  });
}

void accumulate(float* dst, const void* src, KType src_type, int64_t n, cudaStream_t stream) {
  with_ktype(src_type, [&](auto tag) {
    using S = decltype(tag);
    launch_map(n, Accumulate<S>{dst, static_cast<const S*>(src)}, stream, "accumulate");
  });
}

void add_scaled(void* y, KType y_type, const void* x, KType x_type, float factor, int64_t n, cudaStream_t stream) {
  with_ktype(y_type, [&](auto y_tag) {
    with_ktype(x_type, [&](auto x_tag) {
      using Y = decltype(y_tag);
      using X = decltype(x_tag);
      launch_map(n, AddScaled<Y, X>{static_cast<Y*>(y), static_cast<const X*>(x), factor}, stream, "add_scaled");
    });
  });
}

void copy_convert(void* dst, KType dst_type, const void* src, KType src_type, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (dst_type == src_type) {  // a plain copy: the conversion would be the identity
    const size_t bytes = static_cast<size_t>(n) * (dst_type == KType::F32 ? 4 : 2);
    if (dst != src) {
      check_queued(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), "copy_convert");
    }
    return;
  }
  with_ktype(dst_type, [&](auto y_tag) {
    with_ktype(src_type, [&](auto x_tag) {
      using Y = decltype(y_tag);
      using X = decltype(x_tag);
      launch_map(n, Convert<Y, X>{static_cast<Y*>(dst), static_cast<const X*>(src)}, stream, "copy_convert");
    });
  });
}

// A block of rows copied 16 bytes a thread (every row's bytes, both strides and both pointers
// 16-byte aligned): on the SMs at close to the memory's bandwidth, where cudaMemcpy2DAsync between
// device buffers ran at ~40% of it (the folded LoRA's [x | xa], docs/model.md).
__global__ void __launch_bounds__(256)
    copy_rows16_kernel(uint4* dst, int64_t dst_stride16, const uint4* src, int64_t src_stride16, int64_t rows,
                       int64_t row16) {
  const int64_t n = rows * row16;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / row16, c = i % row16;
    dst[r * dst_stride16 + c] = src[r * src_stride16 + c];
  }
}

void copy_block(void* dst, KType dst_type, int64_t dst_stride, const void* src, KType src_type, int64_t src_stride,
                int64_t rows, int64_t cols, float scale, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  if (dst_type == src_type && scale == 1.0f) {
    const size_t element = dst_type == KType::F32 ? 4 : 2;
    const auto aligned16 = [](uint64_t v) { return v % 16 == 0; };
    if (aligned16(cols * element) && aligned16(dst_stride * element) && aligned16(src_stride * element) &&
        aligned16(reinterpret_cast<uintptr_t>(dst)) && aligned16(reinterpret_cast<uintptr_t>(src))) {
      const int64_t row16 = cols * static_cast<int64_t>(element) / 16;
      const int64_t per = 16 / static_cast<int64_t>(element);  // elements a uint4 holds
      copy_rows16_kernel<<<blocks_for(rows * row16, 256), 256, 0, stream>>>(
          static_cast<uint4*>(dst), dst_stride / per, static_cast<const uint4*>(src), src_stride / per, rows, row16);
      check_launch("copy_block");
      return;
    }
    check_queued(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_stride) * element, src,
                                   static_cast<size_t>(src_stride) * element, static_cast<size_t>(cols) * element,
                                   static_cast<size_t>(rows), cudaMemcpyDeviceToDevice, stream),
                 "copy_block");
    return;
  }
  with_ktype(dst_type, [&](auto y_tag) {
    with_ktype(src_type, [&](auto x_tag) {
      using Y = decltype(y_tag);
      using X = decltype(x_tag);
      launch_map(rows * cols,
                 ScaledBlock<Y, X>{static_cast<Y*>(dst), static_cast<const X*>(src), cols, dst_stride, src_stride, scale},
                 stream, "copy_block");
    });
  });
}

namespace {

// The blocks of one copy_blocks launch and where each one's 16-byte chunks begin in the launch's
// numbering of them.
struct BlockCopies {
  BlockCopyArgs copy[kMaxBlockCopies];
  int64_t first_chunk[kMaxBlockCopies + 1];
  int count;
};

// 8 elements a thread: raw bits at scale 1 (copy_block's copy), else each scaled and rounded once
// (copy_block's ScaledBlock).
template <class T>
__global__ void copy_blocks_kernel(const __grid_constant__ BlockCopies c) {
  const int64_t chunks = c.first_chunk[c.count];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < chunks;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int k = 0;
    while (i >= c.first_chunk[k + 1]) ++k;
    const BlockCopyArgs& b = c.copy[k];
    const int64_t local = i - c.first_chunk[k], per_row = b.cols / 8;
    const int64_t row = local / per_row, column = local % per_row * 8;
    uint4 v = *reinterpret_cast<const uint4*>(static_cast<const T*>(b.src) + row * b.src_stride + column);
    if (b.scale != 1.0f) {
      T* e = reinterpret_cast<T*>(&v);
#pragma unroll
      for (int j = 0; j < 8; ++j) e[j] = from_float<T>(__fmul_rn(to_float(e[j]), b.scale));
    }
    *reinterpret_cast<uint4*>(static_cast<T*>(b.dst) + row * b.dst_stride + column) = v;
  }
}

}  // namespace

bool block_copy_batches(const BlockCopyArgs& copy, KType dst_type, KType src_type) {
  const auto whole = [](int64_t elements) { return elements % 8 == 0; };
  return dst_type == src_type && (dst_type == KType::BF16 || dst_type == KType::F16) && whole(copy.cols) &&
         whole(copy.dst_stride) && whole(copy.src_stride) && aligned16(copy.dst) && aligned16(copy.src) &&
         copy.rows >= 0 && copy.cols >= 0;
}

void copy_blocks(const BlockCopyArgs* copies, int count, KType type, cudaStream_t stream) {
  if (count < 0 || count > kMaxBlockCopies) throw std::logic_error("copy_blocks: 0 to kMaxBlockCopies blocks a launch");
  BlockCopies c{};
  c.count = count;
  for (int k = 0; k < count; ++k) {
    if (!block_copy_batches(copies[k], type, type)) throw std::logic_error("copy_blocks: a block copy_blocks does not take");
    c.copy[k] = copies[k];
    c.first_chunk[k + 1] = c.first_chunk[k] + copies[k].rows * (copies[k].cols / 8);
  }
  if (c.first_chunk[count] == 0) return;
  with_ktype(type, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 2) copy_blocks_kernel<T><<<blocks_for(c.first_chunk[count], 256), 256, 0, stream>>>(c);
  });
  check_launch("copy_blocks");
}

void fill_zero(void* x, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  check_queued(cudaMemsetAsync(x, 0, bytes, stream), "fill_zero");
}

int64_t sum_of_squares_workspace(int64_t n) {
  const int64_t chunks = (n + kSumOfSquaresChunk - 1) / kSumOfSquaresChunk;
  return 1 + chunks;  // [0] the result, [1, 1 + chunks) the partials
}

void sum_of_squares(const void* x, KType type, int64_t n, double* workspace, cudaStream_t stream) {
  const int64_t chunks = (n + kSumOfSquaresChunk - 1) / kSumOfSquaresChunk;
  if (chunks > 0x7fffffff) throw std::logic_error("sum_of_squares: too many elements for one grid");
  if (chunks > 0) {
    with_ktype(type, [&](auto tag) {
      using T = decltype(tag);
      sum_of_squares_chunks_kernel<T><<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(
          static_cast<const T*>(x), n, workspace + 1);
    });
    check_launch("sum_of_squares_chunks");
  }
  sum_partials_kernel<<<1, 1024, 0, stream>>>(workspace + 1, chunks, workspace);
  check_launch("sum_of_squares_partials");
}

}  // namespace fsdpq::cuda
