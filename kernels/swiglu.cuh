// SwiGLU on the GPU, the arithmetic of src/ops/swiglu.cpp: silu(g) = g / (1 + exp(-g)) in fp32,
// one rounding per output (CUDA's expf differs from the host's exp by an ulp or so, so results
// match the CPU to fp32 rounding, not bit for bit). Elementwise: each element is read before it is
// written, so h may alias gate or up, dgate may alias gate or dh and dup may alias up.
#pragma once
#include <cstdint>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// h = silu(gate) * up, n elements.
void swiglu_forward(void* h, KType h_type, const void* gate, KType gate_type, const void* up, KType up_type, int64_t n,
                    cudaStream_t stream);

// dgate = dh * up * silu'(gate), dup = dh * silu(gate). gate and up share act_type; dh, dgate and
// dup share grad_type.
void swiglu_backward(void* dgate, void* dup, const void* dh, KType grad_type, const void* gate, const void* up,
                     KType act_type, int64_t n, cudaStream_t stream);

}  // namespace fsdpq::cuda
