// The row-selection ops on the GPU (kernels/rows.cuh); ops/rows.cpp checks their arguments and
// holds the CPU reference.
#include "kernels/rows.cuh"
#include "ops/cuda/kernel_args.h"
#include "ops/cuda_ops.h"

namespace fsdpq::cuda_ops {

void gather_rows(TensorView out, const TensorView& src, const TensorView& rows) {
  cuda::copy_rows(out.data, nullptr, src.data, rows.as<const int32_t>(), rows.numel(),
                  static_cast<int64_t>(src.shape[1] * dtype_size(src.dtype)), cuda::stream());
}

void scatter_rows(TensorView dst, const TensorView& rows, const TensorView& src) {
  cuda::copy_rows(dst.data, rows.as<const int32_t>(), src.data, nullptr, rows.numel(),
                  static_cast<int64_t>(dst.shape[1] * dtype_size(dst.dtype)), cuda::stream());
}

}  // namespace fsdpq::cuda_ops
