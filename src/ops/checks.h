// Argument checks shared by the ops. A failed check is a programming error (two ops wired with
// mismatched shapes), so it throws std::logic_error naming the op, the argument and the shapes.
#pragma once
#include "backend/tensor.h"

#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace fsdpq {

// The view lives on the CPU, holds F32, BF16 or F16, and has data (unless it is empty).
void check_cpu_float(const char* op, const char* name, const TensorView& view);
// The same on any device: for the checks an op makes before it picks its implementation.
void check_float(const char* op, const char* name, const TensorView& view);

// The view lives on the CPU, holds `expected` and has data (unless it is empty).
void check_cpu_dtype(const char* op, const char* name, const TensorView& view, DType expected);
// The same on any device: for the checks an op makes before it picks its implementation.
void check_dtype(const char* op, const char* name, const TensorView& view, DType expected);
void check_shape(const char* op, const char* name, const TensorView& view, const Shape& expected);
void check_numel(const char* op, const char* name, const TensorView& view, int64_t expected);
// Any other condition; the message (formatted only on failure) names the op and the sizes.
template <class... Args>
void check_that(bool condition, fmt::format_string<Args...> message, Args&&... args) {
  if (!condition) throw std::logic_error(fmt::format(message, std::forward<Args>(args)...));
}

}  // namespace fsdpq
