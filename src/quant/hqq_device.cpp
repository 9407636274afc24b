#include "quant/hqq_device.h"

#include <fmt/format.h>

#include <stdexcept>

#ifdef FSDPQ_WITH_CUDA
#include "backend/cuda_backend.h"
#include "kernels/hqq.cuh"
#endif

namespace fsdpq {

#ifdef FSDPQ_WITH_CUDA

void hqq_dequantize(const HqqDeviceSegments& weight, const MatrixView& out) {
  if (out.device() != Device::CUDA)
    throw std::logic_error(fmt::format("hqq_dequantize: out is {}; expected a CUDA tensor", out.tensor.describe()));
  if (out.dtype() != DType::F32 && out.dtype() != weight.meta)
    throw std::logic_error(
        fmt::format("hqq_dequantize: out is {}; expected F32 or {}", out.tensor.describe(), dtype_name(weight.meta)));
  const int64_t numel = weight.packing.groups * kHqqGroupSize;
  if (out.numel() != numel || out.first_column < 0 || out.first_column + out.cols() > out.row_stride())
    throw std::logic_error(fmt::format("hqq_dequantize: out ({} columns [{}, {})) has {} elements; the weight has {}",
                                       out.tensor.describe(), out.first_column, out.first_column + out.cols(),
                                       out.numel(), numel));
  if (numel == 0) return;
  if (weight.codes == nullptr || weight.zeros == nullptr || weight.scales == nullptr)
    throw std::logic_error("hqq_dequantize: the weight's segments are not on the GPU");
  const HqqPacking& p = weight.packing;
  const cuda::HqqLayout layout{p.n_bits, p.groups, p.rows, p.word_bytes, p.slices};
  const auto ktype = [](DType d) {
    return d == DType::F32 ? cuda::KType::F32 : d == DType::BF16 ? cuda::KType::BF16 : cuda::KType::F16;
  };
  cuda::hqq_dequantize(weight.codes, weight.zeros, weight.scales, ktype(weight.meta), layout, out.data(),
                       ktype(out.dtype()), cuda::RowPitch{out.cols(), out.row_stride()}, cuda::stream());
}

#else  // built without CUDA

void hqq_dequantize(const HqqDeviceSegments&, const MatrixView&) {
  throw std::logic_error("hqq_dequantize: a device HQQ weight, but this fsdpq was built without CUDA");
}

#endif

}  // namespace fsdpq
