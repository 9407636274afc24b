#include "ops/checks.h"

#include <fmt/format.h>

#include <stdexcept>

namespace fsdpq {

namespace {
void check_cpu(const char* op, const char* name, const TensorView& view) {
  if (view.device != Device::CPU)
    throw std::logic_error(fmt::format("{}: {} is {}, but this is the CPU implementation", op, name, view.describe()));
  if (view.data == nullptr && view.numel() > 0)
    throw std::logic_error(fmt::format("{}: {} ({}) has no data", op, name, view.describe()));
}
}  // namespace

void check_cpu_float(const char* op, const char* name, const TensorView& view) {
  check_cpu(op, name, view);
  if (view.dtype != DType::F32 && view.dtype != DType::BF16 && view.dtype != DType::F16)
    throw std::logic_error(fmt::format("{}: {} is {}; expected F32, BF16 or F16", op, name, view.describe()));
}

void check_float(const char* op, const char* name, const TensorView& view) {
  if (view.data == nullptr && view.numel() > 0)
    throw std::logic_error(fmt::format("{}: {} ({}) has no data", op, name, view.describe()));
  if (view.dtype != DType::F32 && view.dtype != DType::BF16 && view.dtype != DType::F16)
    throw std::logic_error(fmt::format("{}: {} is {}; expected F32, BF16 or F16", op, name, view.describe()));
}

void check_cpu_dtype(const char* op, const char* name, const TensorView& view, DType expected) {
  check_cpu(op, name, view);
  check_dtype(op, name, view, expected);
}

void check_dtype(const char* op, const char* name, const TensorView& view, DType expected) {
  if (view.data == nullptr && view.numel() > 0)
    throw std::logic_error(fmt::format("{}: {} ({}) has no data", op, name, view.describe()));
  if (view.dtype != expected)
    throw std::logic_error(
        fmt::format("{}: {} is {}; expected {}", op, name, view.describe(), dtype_name(expected)));
}

void check_shape(const char* op, const char* name, const TensorView& view, const Shape& expected) {
  if (!(view.shape == expected))
    throw std::logic_error(fmt::format("{}: {} has shape {}; expected {}", op, name, view.shape.to_string(),
                                       expected.to_string()));
}

void check_numel(const char* op, const char* name, const TensorView& view, int64_t expected) {
  if (view.numel() != expected)
    throw std::logic_error(fmt::format("{}: {} has shape {} ({} elements); expected {} elements", op, name,
                                       view.shape.to_string(), view.numel(), expected));
}

}  // namespace fsdpq
