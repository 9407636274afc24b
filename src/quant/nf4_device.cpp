#include "quant/nf4_device.h"

#include <fmt/format.h>

#include <stdexcept>

#ifdef FSDPQ_WITH_CUDA
#include "backend/cuda_backend.h"
#include "kernels/nf4.cuh"
#include "quant/dynamic_code.h"
#include "quant/nf4.h"
#endif

namespace fsdpq {

#ifdef FSDPQ_WITH_CUDA

void nf4_dequantize(const Nf4DeviceSegments& weight, const MatrixView& out) {
  if (out.device() != Device::CUDA)
    throw std::logic_error(fmt::format("nf4_dequantize: out is {}; expected a CUDA tensor", out.tensor.describe()));
  if (out.dtype() != DType::F32 && out.dtype() != DType::BF16 && out.dtype() != DType::F16)
    throw std::logic_error(fmt::format("nf4_dequantize: out is {}; expected F32, BF16 or F16", out.tensor.describe()));
  if (out.numel() != weight.numel || out.first_column < 0 || out.first_column + out.cols() > out.row_stride())
    throw std::logic_error(fmt::format("nf4_dequantize: out ({} columns [{}, {})) has {} elements; the weight has {}",
                                       out.tensor.describe(), out.first_column, out.first_column + out.cols(),
                                       out.numel(), weight.numel));
  if (weight.numel == 0) return;
  if (weight.packed == nullptr || (weight.absmax == nullptr && (weight.absmax_q == nullptr || weight.absmax_scale == nullptr)))
    throw std::logic_error("nf4_dequantize: the weight's segments are not on the GPU");
  const cuda::KType type = out.dtype() == DType::F32    ? cuda::KType::F32
                           : out.dtype() == DType::BF16 ? cuda::KType::BF16
                                                        : cuda::KType::F16;
  cuda::nf4_dequantize(weight.packed, weight.absmax, weight.absmax ? nullptr : weight.absmax_q,
                       weight.absmax ? nullptr : weight.absmax_scale, weight.absmax_offset, nf4_code().data(),
                       dynamic_code_signed().data(), weight.numel, out.data(), type,
                       cuda::RowPitch{out.cols(), out.row_stride()}, cuda::stream());
}

#else  // built without CUDA

void nf4_dequantize(const Nf4DeviceSegments&, const MatrixView&) {
  throw std::logic_error("nf4_dequantize: a device NF4 weight, but this fsdpq was built without CUDA");
}

#endif

}  // namespace fsdpq
