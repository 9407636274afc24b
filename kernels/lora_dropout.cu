#include "kernels/lora_dropout.cuh"

#include "kernels/lora_dropout_mask.h"  // keep_word, keeps_lane: the CPU's mask, shared

namespace fsdpq::cuda {
namespace {

// Four consecutive elements, loaded and stored as one access (8 bytes for bf16/f16, 16 for fp32).
template <class T>
struct alignas(4 * sizeof(T)) Quad {
  T v[4];
};

template <class T>
bool quad_aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % sizeof(Quad<T>) == 0;
}

// Each thread takes a quad: elements 4q .. 4q + 3. Full quads go through registers as one vector
// access each (`Vector`: every pointer is Quad-aligned); the tensor's last, partial quad (and every
// quad when a pointer is not aligned) element by element. Loops over the 4 lanes have constant
// bounds, so the quad stays in registers.
template <class T, bool Vector>
__global__ void apply_kernel(const DropoutOutputs outs_param, const T* in, int64_t n, uint32_t threshold,
                             float keep_scale) {
  // Indexed by output at run time: in shared memory, or the parameter is copied to local memory
  // (a 72-byte stack frame, read for every quad).
  __shared__ DropoutOutputs outs;
  if (threadIdx.x == 0) outs = outs_param;
  __syncthreads();
  const int64_t quads = (n + 3) / 4;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < quads;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = q * 4;
    if (Vector && base + 4 <= n) {
      Quad<T> kept = reinterpret_cast<const Quad<T>*>(in)[q];
#pragma unroll
      for (int e = 0; e < 4; ++e) kept.v[e] = from_float<T>(to_float(kept.v[e]) * keep_scale);
      for (int j = 0; j < outs.count; ++j) {
        const uint64_t word = keep_word(outs.mixed_key[j], q);
        Quad<T> out;
#pragma unroll
        for (int e = 0; e < 4; ++e) out.v[e] = keeps_lane(word, e, threshold) ? kept.v[e] : from_float<T>(0.0f);
        reinterpret_cast<Quad<T>*>(outs.data[j])[q] = out;
      }
      continue;
    }
    for (int e = 0; e < 4 && base + e < n; ++e) {
      const T kept = from_float<T>(to_float(in[base + e]) * keep_scale);
      for (int j = 0; j < outs.count; ++j)
        static_cast<T*>(outs.data[j])[base + e] = keeps_lane(keep_word(outs.mixed_key[j], q), e, threshold) ? kept
                                                                                                     : from_float<T>(0.0f);
    }
  }
}

template <class T, class G, bool Vector>
__global__ void accumulate_kernel(T* dx, bool overwrite, const DropoutGradients gs_param, int64_t n,
                                  uint32_t threshold, float keep_scale) {
  __shared__ DropoutGradients gs;  // indexed by gradient at run time (see apply_kernel)
  if (threadIdx.x == 0) gs = gs_param;
  __syncthreads();
  const int64_t quads = (n + 3) / 4;
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < quads;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t base = q * 4;
    if (Vector && base + 4 <= n) {
      Quad<T> d;
      if (overwrite) {
#pragma unroll
        for (int e = 0; e < 4; ++e) d.v[e] = from_float<T>(0.0f);
      } else {
        d = reinterpret_cast<Quad<T>*>(dx)[q];
      }
      for (int j = 0; j < gs.count; ++j) {
        const Quad<G> g = reinterpret_cast<const Quad<G>*>(gs.data[j])[q];
        const uint64_t word = keep_word(gs.mixed_key[j], q);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (keeps_lane(word, e, threshold)) d.v[e] = from_float<T>(to_float(d.v[e]) + keep_scale * to_float(g.v[e]));
      }
      reinterpret_cast<Quad<T>*>(dx)[q] = d;
      continue;
    }
    for (int e = 0; e < 4 && base + e < n; ++e) {
      T d = overwrite ? from_float<T>(0.0f) : dx[base + e];
      for (int j = 0; j < gs.count; ++j)
        if (keeps_lane(keep_word(gs.mixed_key[j], q), e, threshold))
          d = from_float<T>(to_float(d) + keep_scale * to_float(static_cast<const G*>(gs.data[j])[base + e]));
      dx[base + e] = d;
    }
  }
}

}  // namespace

void lora_dropout_apply(KType type, const DropoutOutputs& outs, const void* in, int64_t n, uint32_t threshold,
                        float keep_scale, cudaStream_t stream) {
  if (n == 0 || outs.count == 0) return;
  with_ktype(type, [&](auto tag) {
    using T = decltype(tag);
    bool aligned = quad_aligned<T>(in);
    for (int j = 0; j < outs.count; ++j) aligned = aligned && quad_aligned<T>(outs.data[j]);
    const auto kernel = aligned ? apply_kernel<T, true> : apply_kernel<T, false>;
    kernel<<<blocks_for((n + 3) / 4), 256, 0, stream>>>(outs, static_cast<const T*>(in), n, threshold, keep_scale);
  });
  check_launch("lora_dropout_apply");
}

void lora_dropout_accumulate(KType type, void* dx, bool overwrite, KType g_type, const DropoutGradients& gs,
                             int64_t n, uint32_t threshold, float keep_scale, cudaStream_t stream) {
  if (n == 0 || gs.count == 0) return;
  with_ktype(type, [&](auto dx_tag) {
    using T = decltype(dx_tag);
    with_ktype(g_type, [&](auto g_tag) {
      using G = decltype(g_tag);
      bool aligned = quad_aligned<T>(dx);
      for (int j = 0; j < gs.count; ++j) aligned = aligned && quad_aligned<G>(gs.data[j]);
      const auto kernel = aligned ? accumulate_kernel<T, G, true> : accumulate_kernel<T, G, false>;
      kernel<<<blocks_for((n + 3) / 4), 256, 0, stream>>>(static_cast<T*>(dx), overwrite, gs, n, threshold,
                                                          keep_scale);
    });
  });
  check_launch("lora_dropout_accumulate");
}

}  // namespace fsdpq::cuda
