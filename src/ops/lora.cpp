#include "ops/lora.h"

#include "ops/checks.h"
#include "ops/parallel.h"
#include "ops/matmul.h"
#include "ops/storage.h"
#include "util/error.h"

#ifdef FSDPQ_WITH_CUDA
#include "kernels/lora_dropout.cuh"
#include "ops/cuda_dispatch.h"
#endif

#include <cmath>

namespace fsdpq {

namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

inline uint64_t mix64(uint64_t z) {  // splitmix64's finalizer: a bijection with full avalanche
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline uint32_t drop_threshold(float probability) {
  return static_cast<uint32_t>(std::llround(static_cast<double>(probability) * 16777216.0));
}

inline bool keeps(uint64_t mixed_key, uint64_t index, uint32_t threshold) {
  return static_cast<uint32_t>(mix64(mixed_key + (index + 1) * kGolden) >> 40) >= threshold;
}

bool dropout_active(const LoraParams& params) { return params.training && params.dropout > 0.0f; }

// dst = x * keep / (1 - p), rounded to dst's dtype (x's), as the adapter sees its input.
void apply_dropout(TensorView dst, const TensorView& x, const LoraParams& params) {
  const uint64_t mixed_key = mix64(params.dropout_key);
  const uint32_t threshold = drop_threshold(params.dropout);
  const float keep_scale = 1.0f / (1.0f - params.dropout);
  const int64_t n = x.numel();
  if (runs_on_cuda("lora_dropout", {dst, x})) {
#ifdef FSDPQ_WITH_CUDA
    cuda::lora_dropout_apply(ktype("lora_dropout", x), dst.data, x.data, n, mixed_key, threshold, keep_scale,
                             cuda::stream());
#endif
    return;
  }
  with_storage(x.dtype, "lora_dropout", [&](auto tag) {
    using S = decltype(tag);
    const S* in = x.as<const S>();
    S* out = dst.as<S>();
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i)
      out[i] = keeps(mixed_key, static_cast<uint64_t>(i), threshold) ? from_f32<S>(to_f32(in[i]) * keep_scale)
                                                                      : from_f32<S>(0.0f);
  });
}

// The adapter input dropout(x), or x itself when dropout is off (no copy, bit-exact).
struct AdapterInput {
  Tensor storage;
  TensorView view;
};

AdapterInput adapter_input(const TensorView& x, const LoraParams& params) {
  AdapterInput input;
  if (!dropout_active(params)) {
    input.view = x;
    return input;
  }
  input.storage = Tensor::empty(x.shape, x.dtype, x.device);
  input.view = input.storage.view();
  apply_dropout(input.view, x, params);
  return input;
}

struct LoraDims {
  int64_t rows, in, out, rank;
};

LoraDims check_lora(const char* op, const TensorView& x, const TensorView& xa, const TensorView& A,
                    const TensorView& B, const LoraParams& params) {
  check_float(op, "x", x);
  check_float(op, "xa", xa);
  check_float(op, "A", A);
  check_float(op, "B", B);
  runs_on_cuda(op, {x, xa, A, B});  // all on one device (the linear ops do the work)
  check_that(A.shape.rank == 2 && B.shape.rank == 2 && x.shape.rank >= 1,
             "{}: A {} and B {} must be matrices and x {} at least a vector", op, A.shape.to_string(),
             B.shape.to_string(), x.shape.to_string());
  LoraDims d{x.shape.rows(), A.shape[1], B.shape[0], A.shape[0]};
  check_that(x.shape.last() == d.in && B.shape[1] == d.rank,
             "{}: x {}, A {} [r, in] and B {} [out, r] do not fit together", op, x.shape.to_string(),
             A.shape.to_string(), B.shape.to_string());
  check_shape(op, "xa", xa, Shape{d.rows, d.rank});
  if (!(params.dropout >= 0.0f && params.dropout < 1.0f))
    fail("lora_dropout must be in [0, 1), got {}", params.dropout);
  return d;
}

}  // namespace

float lora_scaling(const LoraParams& params, int64_t rank) { return params.alpha / static_cast<float>(rank); }

bool lora_dropout_keeps(uint64_t key, uint64_t index, float probability) {
  return keeps(mix64(key), index, drop_threshold(probability));
}

void lora_forward(TensorView y, TensorView xa, const TensorView& x, const TensorView& A, const TensorView& B,
                  const LoraParams& params) {
  constexpr const char* op = "lora_forward";
  const LoraDims d = check_lora(op, x, xa, A, B, params);
  check_float(op, "y", y);
  check_that(y.shape.rows() == d.rows && y.shape.last() == d.out, "{}: y {} does not match x {} and B {}", op,
             y.shape.to_string(), x.shape.to_string(), B.shape.to_string());
  const AdapterInput input = adapter_input(x, params);
  linear_forward(xa, input.view, A);
  linear_forward(y, xa, B, /*accumulate=*/true, lora_scaling(params, d.rank));
}

void lora_backward(TensorView dx, TensorView dA, TensorView dB, const TensorView& dy, const TensorView& x,
                   const TensorView& xa, const TensorView& A, const TensorView& B, const LoraParams& params) {
  constexpr const char* op = "lora_backward";
  const LoraDims d = check_lora(op, x, xa, A, B, params);
  check_float(op, "dy", dy);
  check_that(dA.dtype == DType::F32 && dB.dtype == DType::F32, "{}: dA {} and dB {} must be F32", op, dA.describe(),
             dB.describe());
  runs_on_cuda(op, {dx, dA, dB, dy, x});  // every operand on one device
  check_shape(op, "dA", dA, A.shape);
  check_shape(op, "dB", dB, B.shape);
  check_that(dy.shape.rows() == d.rows && dy.shape.last() == d.out, "{}: dy {} does not match x {} and B {}", op,
             dy.shape.to_string(), x.shape.to_string(), B.shape.to_string());
  const float scaling = lora_scaling(params, d.rank);

  // dB += scaling · dyᵀ · xa
  linear_backward_weight(dB, dy, xa, /*accumulate=*/true, scaling);
  // d(xa) = scaling · dy · B, kept in fp32
  Tensor dxa = Tensor::empty(Shape{d.rows, d.rank}, DType::F32, x.device);
  linear_backward_input(dxa, dy, B, /*accumulate=*/false, scaling);
  // dA += d(xa)ᵀ · dropout(x): the mask is regenerated from the key
  {
    const AdapterInput input = adapter_input(x, params);
    linear_backward_weight(dA, dxa, input.view, /*accumulate=*/true);
  }
  if (dx.data == nullptr) return;
  check_float(op, "dx", dx);
  check_that(dx.shape.rows() == d.rows && dx.shape.last() == d.in, "{}: dx {} does not match x {}", op,
             dx.shape.to_string(), x.shape.to_string());
  if (!dropout_active(params)) {
    linear_backward_input(dx, dxa, A, /*accumulate=*/true);
    return;
  }
  // dx += mask / (1 - p) ⊙ (d(xa) · A)
  Tensor dx_dropped = Tensor::empty(Shape{d.rows, d.in}, DType::F32, x.device);
  linear_backward_input(dx_dropped, dxa, A);
  const uint64_t mixed_key = mix64(params.dropout_key);
  const uint32_t threshold = drop_threshold(params.dropout);
  const float keep_scale = 1.0f / (1.0f - params.dropout);
  const float* g = dx_dropped.data<float>();
  const int64_t n = dx.numel();
  if (runs_on_cuda(op, {dx, dx_dropped})) {
#ifdef FSDPQ_WITH_CUDA
    cuda::lora_dropout_accumulate(ktype(op, dx), dx.data, dx_dropped.data<float>(), n, mixed_key, threshold,
                                  keep_scale, cuda::stream());
#endif
    return;
  }
  with_storage(dx.dtype, op, [&](auto tag) {
    using S = decltype(tag);
    S* out = dx.as<S>();
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
    for (int64_t i = 0; i < n; ++i)
      if (keeps(mixed_key, static_cast<uint64_t>(i), threshold))
        out[i] = from_f32<S>(to_f32(out[i]) + keep_scale * g[i]);
  });
}

}  // namespace fsdpq
