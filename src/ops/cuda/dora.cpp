// DoRA's elementwise pieces on the GPU (kernels/dora.cuh); ops/dora.cpp checks their arguments
// and holds the CPU references.
#include "kernels/dora.cuh"
#include "ops/cuda/kernel_args.h"
#include "ops/cuda_ops.h"

namespace fsdpq::cuda_ops {

void dora_row_norms(TensorView norm, const TensorView& P) {
  cuda::dora_row_norms(norm.as<float>(), P.as<const float>(), P.shape[0], P.shape[1], cuda::stream());
}

void dora_norm_from_parts(TensorView norm, const TensorView& W, const TensorView& B, const TensorView& G,
                          const TensorView& H, float scaling) {
  cuda::dora_norm_from_parts(norm.as<float>(), W.data, ktype("dora_norm_from_parts", W), B.data,
                             ktype("dora_norm_from_parts", B), G.as<const float>(), H.as<const float>(), W.shape[0],
                             W.shape[1], B.shape[1], scaling, cuda::stream());
}

void dora_magnitude_scale(TensorView g, const TensorView& magnitude, const TensorView& norm) {
  cuda::dora_magnitude_scale(g.as<float>(), magnitude.data, ktype("dora_magnitude_scale", magnitude),
                             norm.as<const float>(), magnitude.numel(), cuda::stream());
}

void dora_scale_columns(TensorView out, const TensorView& in, const TensorView& g, float offset, bool accumulate) {
  constexpr const char* op = "dora_scale_columns";
  cuda::dora_scale_columns(out.data, ktype(op, out), in.data, ktype(op, in), g.as<const float>(), offset, accumulate,
                           in.shape.rows(), in.shape.last(), cuda::stream());
}

void dora_magnitude_backward(TensorView dm, const TensorView& dy, const TensorView& z, const TensorView& norm) {
  constexpr const char* op = "dora_magnitude_backward";
  cuda::dora_magnitude_backward(dm.as<float>(), dy.data, ktype(op, dy), z.data, ktype(op, z), norm.as<const float>(),
                                dy.shape.rows(), dy.shape.last(), cuda::stream());
}

}  // namespace fsdpq::cuda_ops
