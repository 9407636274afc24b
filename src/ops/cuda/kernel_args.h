// What the ops' CUDA implementations (src/ops/cuda/, CUDA builds only) need to call a kernel: the
// kernel conventions, the compute stream, and the mapping of a tensor's dtype to a kernel storage
// type.
#pragma once
#include <fmt/format.h>

#include <stdexcept>

#include "backend/cuda_backend.h"
#include "kernels/kernel_types.cuh"

namespace fsdpq {

inline cuda::KType ktype(const char* op, const TensorView& view) {
  switch (view.dtype) {
    case DType::F32: return cuda::KType::F32;
    case DType::BF16: return cuda::KType::BF16;
    case DType::F16: return cuda::KType::F16;
    default: break;
  }
  throw std::logic_error(fmt::format("{}: {} has no CUDA kernel storage type", op, view.describe()));
}

}  // namespace fsdpq
