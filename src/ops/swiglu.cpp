#include "ops/swiglu.h"

#include "ops/checks.h"
#include "ops/cuda_ops.h"
#include "ops/dispatch.h"
#include "ops/parallel.h"
#include "ops/storage.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace fsdpq {

namespace {
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float silu(float x) { return x / (1.0f + std::exp(-x)); }  // PyTorch's formula
}  // namespace

void swiglu_forward(TensorView h, const TensorView& gate, const TensorView& up) {
  constexpr const char* op = "swiglu_forward";
  check_float(op, "gate", gate);
  check_float(op, "up", up);
  check_float(op, "h", h);
  check_shape(op, "up", up, gate.shape);
  check_shape(op, "h", h, gate.shape);
  if (runs_on_cuda(op, {h, gate, up}))
    if constexpr (kWithCuda) return cuda_ops::swiglu_forward(h, gate, up);
  const int64_t n = gate.numel();
  with_storages({gate.dtype, up.dtype, h.dtype}, op, [&](auto g_tag, auto u_tag, auto h_tag) {
    using GT = decltype(g_tag);
    using UT = decltype(u_tag);
    using HT = decltype(h_tag);
    const GT* g = gate.as<const GT>();
    const UT* u = up.as<const UT>();
    HT* out = h.as<HT>();
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float x = to_f32(g[i]);
      out[i] = from_f32<HT>(silu(x) * to_f32(u[i]));
    }
  });
}

void swiglu_backward(TensorView dgate, TensorView dup, const TensorView& dh, const TensorView& gate,
                     const TensorView& up) {
  constexpr const char* op = "swiglu_backward";
  check_float(op, "gate", gate);
  check_float(op, "up", up);
  check_float(op, "dh", dh);
  check_float(op, "dgate", dgate);
  check_float(op, "dup", dup);
  check_shape(op, "up", up, gate.shape);
  check_shape(op, "dh", dh, gate.shape);
  check_shape(op, "dgate", dgate, gate.shape);
  check_shape(op, "dup", dup, gate.shape);
  check_that(dgate.dtype == dh.dtype && dup.dtype == dh.dtype, "{}: dh, dgate and dup must share a dtype, got {}, {}, {}",
             op, dtype_name(dh.dtype), dtype_name(dgate.dtype), dtype_name(dup.dtype));
  check_that(gate.dtype == up.dtype, "{}: gate and up must share a dtype, got {} and {}", op,
             dtype_name(gate.dtype), dtype_name(up.dtype));
  if (runs_on_cuda(op, {dgate, dup, dh, gate, up}))
    if constexpr (kWithCuda) return cuda_ops::swiglu_backward(dgate, dup, dh, gate, up);
  // Elementwise with mixed dtypes: each operand's dtype is fixed for the whole call, so the
  // activations (gate, up) and the gradients (dh, dgate, dup) are dispatched as two groups.
  const int64_t n = gate.numel();
  with_storages({gate.dtype, dh.dtype}, op, [&](auto a_tag, auto d_tag) {
    using AT = decltype(a_tag);
    using DT = decltype(d_tag);
    const AT* g = gate.as<const AT>();
    const AT* u = up.as<const AT>();
    const DT* dy = dh.as<const DT>();
    DT* dg = dgate.as<DT>();
    DT* du = dup.as<DT>();
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float x = to_f32(g[i]), y = to_f32(u[i]), grad = to_f32(dy[i]);
      const float s = sigmoid(x);
      const float dsilu = s * (1.0f + x * (1.0f - s));
      dg[i] = from_f32<DT>(grad * y * dsilu);
      du[i] = from_f32<DT>(grad * silu(x));
    }
  });
}

}  // namespace fsdpq
