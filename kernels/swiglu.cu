#include "kernels/swiglu.cuh"

#include "kernels/vector8.cuh"

#include <cstdint>
#include <initializer_list>

namespace fsdpq::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

__device__ __forceinline__ float silu(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x))); }

// Grid-stride, kUnroll elements a stride apart per step (coalesced); all inputs of the step are
// loaded before any output is stored, which is safe under element-for-element aliasing.
template <class G, class U, class H>
__global__ void swiglu_forward_kernel(H* h, const G* gate, const U* up, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    float g[kUnroll], u[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      g[k] = to_float(gate[i + k * stride]);
      u[k] = to_float(up[i + k * stride]);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) h[i + k * stride] = from_float<H>(__fmul_rn(silu(g[k]), u[k]));
  }
  for (; i < n; i += stride) {
    const float g = to_float(gate[i]), u = to_float(up[i]);
    h[i] = from_float<H>(__fmul_rn(silu(g), u));
  }
}

// d/dgate and d/dup of h = silu(gate) · up for one element, in fp32.
__device__ __forceinline__ void swiglu_grad_values(float x, float y, float grad, float& dgate, float& dup) {
  const float e = expf(-x);
  const float s = __fdiv_rn(1.0f, __fadd_rn(1.0f, e));
  const float dsilu = __fmul_rn(s, __fadd_rn(1.0f, __fmul_rn(x, __fsub_rn(1.0f, s))));
  const float silu_x = __fdiv_rn(x, __fadd_rn(1.0f, e));
  dgate = __fmul_rn(__fmul_rn(grad, y), dsilu);
  dup = __fmul_rn(grad, silu_x);
}

template <class A, class D>
__device__ __forceinline__ void swiglu_grad(float x, float y, float grad, D* dgate, D* dup, int64_t i) {
  float dg, du;
  swiglu_grad_values(x, y, grad, dg, du);
  dgate[i] = from_float<D>(dg);
  dup[i] = from_float<D>(du);
}

template <class A, class D>
__global__ void swiglu_backward_kernel(D* dgate, D* dup, const D* dh, const A* gate, const A* up, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (kUnroll - 1) * stride < n; i += kUnroll * stride) {
    float x[kUnroll], y[kUnroll], g[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      x[k] = to_float(gate[i + k * stride]);
      y[k] = to_float(up[i + k * stride]);
      g[k] = to_float(dh[i + k * stride]);
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) swiglu_grad<A, D>(x[k], y[k], g[k], dgate, dup, i + k * stride);
  }
  for (; i < n; i += stride) {
    const float x = to_float(gate[i]), y = to_float(up[i]), g = to_float(dh[i]);
    swiglu_grad<A, D>(x, y, g, dgate, dup, i);
  }
}

// ---- the 16-bit kernels: 8 consecutive elements a thread, 16-byte loads and stores (every array
// 16-byte aligned; the last chunk of a size not a multiple of 8 element by element). The same
// arithmetic as the kernels above, element for element, so the same bits; a thread loads all its
// inputs before it stores, which keeps element-for-element aliasing safe.

template <class T>
__global__ void swiglu_forward8_kernel(T* h, const T* gate, const T* up, int64_t n) {
  const int64_t chunks = (n + 7) / 8;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t first = 8 * c;
    if (first + 8 <= n) {
      float g[8], u[8], out[8];
      load8(g, gate + first);
      load8(u, up + first);
#pragma unroll
      for (int k = 0; k < 8; ++k) out[k] = __fmul_rn(silu(g[k]), u[k]);
      store8(h + first, out);
    } else {
      for (int64_t i = first; i < n; ++i) h[i] = from_float<T>(__fmul_rn(silu(to_float(gate[i])), to_float(up[i])));
    }
  }
}

template <class T>
__global__ void swiglu_backward8_kernel(T* dgate, T* dup, const T* dh, const T* gate, const T* up, int64_t n) {
  const int64_t chunks = (n + 7) / 8;
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t first = 8 * c;
    if (first + 8 <= n) {
      float x[8], y[8], g[8], dg[8], du[8];
      load8(x, gate + first);
      load8(y, up + first);
      load8(g, dh + first);
#pragma unroll
      for (int k = 0; k < 8; ++k) swiglu_grad_values(x[k], y[k], g[k], dg[k], du[k]);
      store8(dgate + first, dg);
      store8(dup + first, du);
    } else {
      for (int64_t i = first; i < n; ++i) {
        const float x = to_float(gate[i]), y = to_float(up[i]), g = to_float(dh[i]);
        swiglu_grad<T, T>(x, y, g, dgate, dup, i);
      }
    }
  }
}

bool aligned16(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

}  // namespace

void swiglu_forward(void* h, KType h_type, const void* gate, KType gate_type, const void* up, KType up_type, int64_t n,
                    cudaStream_t stream) {
  if (n <= 0) return;
  if (gate_type == up_type && h_type == gate_type && gate_type != KType::F32 && aligned16({h, gate, up})) {
    with_ktype(gate_type, [&](auto tag) {
      using T = decltype(tag);
      swiglu_forward8_kernel<T><<<blocks_for((n + 7) / 8, kThreads), kThreads, 0, stream>>>(
          static_cast<T*>(h), static_cast<const T*>(gate), static_cast<const T*>(up), n);
    });
    check_launch("swiglu_forward");
    return;
  }
  const unsigned blocks = blocks_for((n + kUnroll - 1) / kUnroll, kThreads);
  with_ktype(gate_type, [&](auto g_tag) {
    with_ktype(up_type, [&](auto u_tag) {
      with_ktype(h_type, [&](auto h_tag) {
        using G = decltype(g_tag);
        using U = decltype(u_tag);
        using H = decltype(h_tag);
        swiglu_forward_kernel<G, U, H><<<blocks, kThreads, 0, stream>>>(static_cast<H*>(h), static_cast<const G*>(gate),
                                                                         static_cast<const U*>(up), n);
      });
    });
  });
  check_launch("swiglu_forward");
}

void swiglu_backward(void* dgate, void* dup, const void* dh, KType grad_type, const void* gate, const void* up,
                     KType act_type, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  if (grad_type == act_type && act_type != KType::F32 && aligned16({dgate, dup, dh, gate, up})) {
    with_ktype(act_type, [&](auto tag) {
      using T = decltype(tag);
      swiglu_backward8_kernel<T><<<blocks_for((n + 7) / 8, kThreads), kThreads, 0, stream>>>(
          static_cast<T*>(dgate), static_cast<T*>(dup), static_cast<const T*>(dh), static_cast<const T*>(gate),
          static_cast<const T*>(up), n);
    });
    check_launch("swiglu_backward");
    return;
  }
  const unsigned blocks = blocks_for((n + kUnroll - 1) / kUnroll, kThreads);
  with_ktype(act_type, [&](auto a_tag) {
    with_ktype(grad_type, [&](auto d_tag) {
      using A = decltype(a_tag);
      using D = decltype(d_tag);
      swiglu_backward_kernel<A, D><<<blocks, kThreads, 0, stream>>>(
          static_cast<D*>(dgate), static_cast<D*>(dup), static_cast<const D*>(dh), static_cast<const A*>(gate),
          static_cast<const A*>(up), n);
    });
  });
  check_launch("swiglu_backward");
}

}  // namespace fsdpq::cuda
