#include "quant/nf4_device.h"

#include <fmt/format.h>

#include <stdexcept>

#ifdef FSDPQ_WITH_CUDA
#include "backend/cuda_backend.h"
#include "kernels/nf4.cuh"
#include "quant/dynamic_code.h"
#endif

namespace fsdpq {

#ifdef FSDPQ_WITH_CUDA

namespace {

Tensor upload_bytes(const void* data, int64_t count, DType dtype) {
  Tensor t = Tensor::empty(Shape{count}, dtype, Device::CUDA);
  copy_bytes(t.view().data, Device::CUDA, data, Device::CPU, t.nbytes());
  return t;
}

}  // namespace

Nf4Device upload_nf4(const Nf4Tensor& tensor) {
  const int64_t blocks = tensor.num_blocks();
  const int64_t groups = (blocks + kNf4AbsmaxBlockSize - 1) / kNf4AbsmaxBlockSize;
  const bool sizes_ok =
      tensor.numel >= 0 && static_cast<int64_t>(tensor.packed.size()) == nf4_packed_bytes(tensor.numel) &&
      (tensor.double_quant ? static_cast<int64_t>(tensor.absmax_q.size()) == blocks &&
                                 static_cast<int64_t>(tensor.absmax_scale.size()) == groups
                           : static_cast<int64_t>(tensor.absmax.size()) == blocks);
  if (!sizes_ok)
    throw std::logic_error(fmt::format("upload_nf4: buffer sizes do not match numel {}", tensor.numel));
  Nf4Device d;
  d.numel = tensor.numel;
  d.shape = tensor.shape;
  d.double_quant = tensor.double_quant;
  d.absmax_offset = tensor.absmax_offset;
  d.packed = upload_bytes(tensor.packed.data(), static_cast<int64_t>(tensor.packed.size()), DType::U8);
  if (tensor.double_quant) {
    d.absmax_q = upload_bytes(tensor.absmax_q.data(), blocks, DType::U8);
    d.absmax_scale = upload_bytes(tensor.absmax_scale.data(), groups, DType::F32);
  } else {
    d.absmax = upload_bytes(tensor.absmax.data(), blocks, DType::F32);
  }
  return d;
}

void nf4_dequantize(const Nf4Device& weight, TensorView out) {
  if (out.device != Device::CUDA)
    throw std::logic_error(fmt::format("nf4_dequantize: out is {}; expected a CUDA tensor", out.describe()));
  if (out.dtype != DType::F32 && out.dtype != DType::BF16 && out.dtype != DType::F16)
    throw std::logic_error(fmt::format("nf4_dequantize: out is {}; expected F32, BF16 or F16", out.describe()));
  if (out.numel() != weight.numel)
    throw std::logic_error(
        fmt::format("nf4_dequantize: out {} has {} elements; the weight has {}", out.describe(), out.numel(), weight.numel));
  if (weight.numel == 0) return;
  if (!weight.packed.defined() || (weight.double_quant ? !weight.absmax_q.defined() || !weight.absmax_scale.defined()
                                                       : !weight.absmax.defined()))
    throw std::logic_error("nf4_dequantize: the Nf4Device was not uploaded (use upload_nf4)");
  const cuda::KType type = out.dtype == DType::F32    ? cuda::KType::F32
                           : out.dtype == DType::BF16 ? cuda::KType::BF16
                                                      : cuda::KType::F16;
  cuda::nf4_dequantize(weight.packed.data<uint8_t>(), weight.double_quant ? nullptr : weight.absmax.data<float>(),
                       weight.double_quant ? weight.absmax_q.data<uint8_t>() : nullptr,
                       weight.double_quant ? weight.absmax_scale.data<float>() : nullptr, weight.absmax_offset,
                       nf4_code().data(), dynamic_code_signed().data(), weight.numel, out.data, type, cuda::stream());
}

void nf4_dequantize(const Nf4DeviceSegments& weight, TensorView out) {
  if (out.device != Device::CUDA)
    throw std::logic_error(fmt::format("nf4_dequantize: out is {}; expected a CUDA tensor", out.describe()));
  if (out.dtype != DType::F32 && out.dtype != DType::BF16 && out.dtype != DType::F16)
    throw std::logic_error(fmt::format("nf4_dequantize: out is {}; expected F32, BF16 or F16", out.describe()));
  if (out.numel() != weight.numel)
    throw std::logic_error(
        fmt::format("nf4_dequantize: out {} has {} elements; the weight has {}", out.describe(), out.numel(), weight.numel));
  if (weight.numel == 0) return;
  if (weight.packed == nullptr || (weight.absmax == nullptr && (weight.absmax_q == nullptr || weight.absmax_scale == nullptr)))
    throw std::logic_error("nf4_dequantize: the weight's segments are not on the GPU");
  const cuda::KType type = out.dtype == DType::F32    ? cuda::KType::F32
                           : out.dtype == DType::BF16 ? cuda::KType::BF16
                                                      : cuda::KType::F16;
  cuda::nf4_dequantize(weight.packed, weight.absmax, weight.absmax ? nullptr : weight.absmax_q,
                       weight.absmax ? nullptr : weight.absmax_scale, weight.absmax_offset, nf4_code().data(),
                       dynamic_code_signed().data(), weight.numel, out.data, type, cuda::stream());
}

#else  // built without CUDA

Nf4Device upload_nf4(const Nf4Tensor&) {
  throw std::logic_error("upload_nf4: this fsdpq was built without CUDA");
}

void nf4_dequantize(const Nf4Device&, TensorView) {
  throw std::logic_error("nf4_dequantize: a device NF4 weight, but this fsdpq was built without CUDA");
}

#endif

}  // namespace fsdpq
