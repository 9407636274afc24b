// SwiGLU on the GPU (kernels/swiglu.cuh); ops/swiglu.cpp checks its arguments and holds the CPU
// reference.
#include "kernels/swiglu.cuh"
#include "ops/cuda/kernel_args.h"
#include "ops/cuda_ops.h"

namespace fsdpq::cuda_ops {

void swiglu_forward(TensorView h, const TensorView& gate, const TensorView& up) {
  constexpr const char* op = "swiglu_forward";
  cuda::swiglu_forward(h.data, ktype(op, h), gate.data, ktype(op, gate), up.data, ktype(op, up), gate.numel(),
                       cuda::stream());
}

void swiglu_backward(TensorView dgate, TensorView dup, const TensorView& dh, const TensorView& gate,
                     const TensorView& up) {
  constexpr const char* op = "swiglu_backward";
  cuda::swiglu_backward(dgate.data, dup.data, dh.data, ktype(op, dh), gate.data, up.data, ktype(op, gate),
                        gate.numel(), cuda::stream());
}

}  // namespace fsdpq::cuda_ops
