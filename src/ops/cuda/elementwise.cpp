// The elementwise ops on the GPU (kernels/elementwise.cuh); ops/elementwise.cpp checks their
// arguments and holds the CPU reference.
#include "kernels/elementwise.cuh"
#include "ops/cuda/kernel_args.h"
#include "ops/cuda_ops.h"
#include "ops/elementwise.h"

#include <vector>

namespace fsdpq::cuda_ops {

void residual_add(TensorView out, const TensorView& a, const TensorView& b) {
  constexpr const char* op = "residual_add";
  cuda::residual_add(out.data, ktype(op, out), a.data, ktype(op, a), b.data, ktype(op, b), out.numel(), cuda::stream());
}

void scale_in_place(TensorView x, float factor) {
  constexpr const char* op = "scale_in_place";
  cuda::scale_in_place(x.data, ktype(op, x), factor, x.numel(), cuda::stream());
}

void accumulate(TensorView dst, const TensorView& src) {
  constexpr const char* op = "accumulate";
  cuda::accumulate(dst.as<float>(), src.data, ktype(op, src), dst.numel(), cuda::stream());
}

void add_scaled(TensorView y, const TensorView& x, float factor) {
  constexpr const char* op = "add_scaled";
  cuda::add_scaled(y.data, ktype(op, y), x.data, ktype(op, x), factor, y.numel(), cuda::stream());
}

void copy_convert(TensorView dst, const TensorView& src) {
  constexpr const char* op = "copy_convert";
  cuda::copy_convert(dst.data, ktype(op, dst), src.data, ktype(op, src), dst.numel(), cuda::stream());
}

void copy_block(const MatrixView& dst, const MatrixView& src, float scale) {
  constexpr const char* op = "copy_block";
  cuda::copy_block(dst.data(), ktype(op, dst.tensor), dst.row_stride(), src.data(), ktype(op, src.tensor),
                   src.row_stride(), dst.rows(), dst.cols(), scale, cuda::stream());
}

void copy_blocks(std::span<const BlockCopy> copies) {
  constexpr const char* op = "copy_blocks";
  // Batches of blocks the one-launch kernel takes, by type; copy_block for the rest.
  std::vector<cuda::BlockCopyArgs> batch;
  cuda::KType batch_type = cuda::KType::BF16;
  const auto flush = [&] {
    if (!batch.empty()) cuda::copy_blocks(batch.data(), static_cast<int>(batch.size()), batch_type, cuda::stream());
    batch.clear();
  };
  for (const BlockCopy& c : copies) {
    const cuda::KType dst = ktype(op, c.dst.tensor), src = ktype(op, c.src.tensor);
    const cuda::BlockCopyArgs args{c.dst.data(), c.src.data(), c.dst.row_stride(), c.src.row_stride(),
                                   c.dst.rows(),  c.dst.cols(), c.scale};
    if (!cuda::block_copy_batches(args, dst, src)) {
      cuda_ops::copy_block(c.dst, c.src, c.scale);
      continue;
    }
    if (!batch.empty() && (dst != batch_type || batch.size() == cuda::kMaxBlockCopies)) flush();
    batch_type = dst;
    batch.push_back(args);
  }
  flush();
}

void fill_zero(TensorView x) { cuda::fill_zero(x.data, x.nbytes(), cuda::stream()); }

double sum_of_squares(const TensorView& x) {
  constexpr const char* op = "sum_of_squares";
  // fp64 partials per chunk on the GPU, summed there in a fixed order; only the total comes back.
  if (x.numel() == 0) return 0.0;
  Tensor workspace = Tensor::empty(Shape{cuda::sum_of_squares_workspace(x.numel())}, DType::F64, Device::CUDA);
  cuda::sum_of_squares(x.data, ktype(op, x), x.numel(), workspace.data<double>(), cuda::stream());
  double total = 0.0;
  copy_bytes(&total, Device::CPU, workspace.data<double>(), Device::CUDA, sizeof(double));
  return total;
}

}  // namespace fsdpq::cuda_ops
