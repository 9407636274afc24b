// Shared helpers of the op tests (tests/unit/ops_*_test.cpp): seeded random tensors, reading
// tensors back as doubles, error norms, and central finite differences.
#pragma once
#include "backend/tensor.h"
#include "ops/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

namespace fsdpq::test {

// Uniform values in [lo, hi), stored (and so rounded) in the tensor's dtype. Non-zero by design.
inline void fill_uniform(TensorView view, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < view.numel(); ++i) {
    float v = dist(rng);
    if (v == 0.0f) v = hi * 0.5f;
    store_f32(view, i, v);
  }
}

inline Tensor random_tensor(Shape shape, DType dtype, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape, dtype);
  fill_uniform(t.view(), seed, lo, hi);
  return t;
}

inline std::vector<double> to_doubles(const TensorView& view) {
  std::vector<double> out(static_cast<size_t>(view.numel()));
  for (int64_t i = 0; i < view.numel(); ++i) out[static_cast<size_t>(i)] = load_f32(view, i);
  return out;
}

inline std::vector<double> random_weights(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  std::vector<double> w(static_cast<size_t>(n));
  for (double& v : w) v = dist(rng);
  return w;
}

// A scalar loss sum_i w_i * y_i, in double: its gradient with respect to y is w.
inline double weighted_sum(const TensorView& y, const std::vector<double>& w) {
  double sum = 0.0;
  for (int64_t i = 0; i < y.numel(); ++i) sum += w[static_cast<size_t>(i)] * load_f32(y, i);
  return sum;
}

// ||got - want||_2 / ||want||_2 (the norm of want floored at `floor`).
inline double relative_error(const std::vector<double>& got, const std::vector<double>& want, double floor = 1e-12) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), floor);
}

inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

// d loss / d param[i] by central differences, for every element of an F32 tensor. The step is
// the difference actually stored (param ± h rounded to fp32), which keeps the quotient honest.
inline std::vector<double> numerical_gradient(TensorView param, const std::function<double()>& loss, float h) {
  float* p = param.as<float>();
  std::vector<double> grad(static_cast<size_t>(param.numel()));
  for (int64_t i = 0; i < param.numel(); ++i) {
    const float saved = p[i];
    const float plus = saved + h, minus = saved - h;
    p[i] = plus;
    const double loss_plus = loss();
    p[i] = minus;
    const double loss_minus = loss();
    p[i] = saved;
    grad[static_cast<size_t>(i)] = (loss_plus - loss_minus) / (static_cast<double>(plus) - static_cast<double>(minus));
  }
  return grad;
}

// |a - b| within `ulps` units in the last place of bf16 (2^-7 relative to the larger magnitude).
inline bool within_bf16_ulps(double a, double b, double ulps = 1.0) {
  return std::abs(a - b) <= ulps * std::ldexp(std::max(std::abs(a), std::abs(b)), -7) + 1e-30;
}

// The product kept_fraction_of_a_sub_ulp_addend measures: out (+)= x·Wᵀ, the accumulating linear op.
struct LinearMultiply {
  void operator()(TensorView out, const TensorView& x, const TensorView& W, bool accumulate) const {
    linear_forward(out, x, W, accumulate);
  }
};

// Its shape: x, W in [0.5, 1), so every sum lies in [K / 4, K); `addend` a quarter to an eighth
// of bf16's spacing there (K 512: sums in [128, 512), spacing 1, then 2).
struct SubUlpCase {
  int64_t M = 96, N = 160, K = 512;
  float addend = 0.25f;
};

// How much of a tiny addend an accumulating bf16 product keeps, on average: out = C + x·Wᵀ with C
// filled with the case's addend. Rounding the exact sum once keeps the addend on average (an
// element moves up one step with probability addend / spacing), so the mean of out − x·Wᵀ (the
// product alone, rounded) is ≈ the addend: returns that mean over the addend, ≈ 1. Rounding the
// product to bf16 before adding C (PyTorch's `y + lora(x)` in bf16) loses it: 0. LoRA's early
// updates are such addends (B ~ lr after the first step): the layer adds the adapter's product to
// the base GEMM's through C (model/llama_layer.cpp), so this decides whether they count. `place`
// moves a host tensor to the device under test, `host` reads one back, `multiply(out, x, W,
// accumulate)` is the product under test.
template <class Place, class Host, class Multiply = LinearMultiply>
double kept_fraction_of_a_sub_ulp_addend(Place place, Host host, Multiply multiply = {}, const SubUlpCase& c = {}) {
  const Tensor x = place(random_tensor(Shape{c.M, c.K}, DType::BF16, 71, 0.5f, 1.0f).view());
  const Tensor W = place(random_tensor(Shape{c.N, c.K}, DType::BF16, 72, 0.5f, 1.0f).view());
  Tensor filled = Tensor::empty(Shape{c.M, c.N}, DType::BF16);
  TensorView filled_view = filled.view();
  for (int64_t i = 0; i < filled_view.numel(); ++i) store_f32(filled_view, i, c.addend);
  Tensor summed = place(filled.view()), alone = place(filled.view());
  multiply(alone.view(), x.view(), W.view(), false);
  multiply(summed.view(), x.view(), W.view(), true);
  const std::vector<double> a = host(alone.view()), s = host(summed.view());
  double moved = 0.0;
  for (size_t i = 0; i < a.size(); ++i) moved += s[i] - a[i];
  return moved / static_cast<double>(a.size()) / c.addend;
}

}  // namespace fsdpq::test
