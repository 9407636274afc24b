// HQQ's per-group computation (quant/hqq.h, docs/hqq.md), stated once for the CPU
// (src/quant/hqq.cpp) and the GPU (kernels/hqq_solve.cu): a group's starting scale and zero point,
// and the proximal updates of its zero point. The two devices differ only in how they do the
// solver's arithmetic — an `Arithmetic` gives round(x) (to the working precision), shrink_power(a)
// (|e|^(p-1) as torch gets it) and nearest_even(v) (torch.round) — and each implementation
// computes those exactly alike, so both devices produce the same bits (tests/gpu/hqq_gpu_test.cpp).
// Every operation is written so that no compiler can fuse it into an FMA: each product is rounded
// (or compared) before anything is added to it. Plain C++17, for host and device code.
#pragma once
#include <cmath>
#include <cstdint>

#include "kernels/host_device.h"

namespace fsdpq::hqq_math {

inline constexpr int kGroupSize = 64;
inline constexpr int kSolverIterations = 20;

// std::min, std::max and std::clamp as the standard defines them (NaN handling included), callable
// from device code.
FSDPQ_HOST_DEVICE_INLINE float min_of(float a, float b) { return b < a ? b : a; }
FSDPQ_HOST_DEVICE_INLINE float max_of(float a, float b) { return a < b ? b : a; }
FSDPQ_HOST_DEVICE_INLINE float clamp_to(float v, float lo, float hi) { return v < lo ? lo : hi < v ? hi : v; }

FSDPQ_HOST_DEVICE_INLINE float max_code(int n_bits) { return static_cast<float>((1 << n_bits) - 1); }

struct Start {
  float scale, zero;
};

// Quantizer.quantize before the solver: scale = (2^n - 1) / (max - min) (1 where max - min <= 1e-4,
// at most 2e4), zero = -min * scale, rounded for 4 bits (round_zero). torch computes the division as
// denom.reciprocal() * (2^n - 1): two roundings.
template <class Arithmetic>
FSDPQ_HOST_DEVICE_INLINE Start group_start(const float* values, int n_bits, const Arithmetic& a) {
  float lo = values[0], hi = values[0];
  for (int j = 1; j < kGroupSize; ++j) {
    lo = min_of(lo, values[j]);
    hi = max_of(hi, values[j]);
  }
  const float denom = hi - lo;
  float scale = (1.0f / denom) * max_code(n_bits);
  if (fabsf(denom) <= 1e-4f) scale = 1.0f;  // hqq: avoid small denominators
  scale = min_of(scale, 2e4f);              // hqq: clamp to avoid half-precision problems
  Start start{scale, -lo * scale};
  if (n_bits == 4) start.zero = a.nearest_even(start.zero);
  return start;
}

// `updates` proximal updates of the zero point (hqq's optimize_weights_proximal_legacy: lp-norm 0.7,
// beta 10 growing by 1.01 per update); returns the scale and zero point in the working precision.
// If `errors` is given, errors[i] += the group's sum of |W_f - W_r| before update i.
template <class Arithmetic>
FSDPQ_HOST_DEVICE_INLINE Start solve_group(const float* values, Start start, int n_bits, int updates,
                                           const Arithmetic& a, double* errors) {
  const float top = max_code(n_bits);
  float w[kGroupSize];
  for (int j = 0; j < kGroupSize; ++j) w[j] = a.round(values[j]);
  const float scale = a.round(start.scale);
  float zero = a.round(start.zero);
  double beta = 10.0;
  for (int i = 0; i < updates; ++i) {
    const auto inv_beta = static_cast<float>(1.0 / beta);  // a Python float, fp32 in the kernel
    double error_sum = 0.0, zero_sum = 0.0;
    for (int j = 0; j < kGroupSize; ++j) {
      const float q = clamp_to(a.nearest_even(a.round(a.round(w[j] * scale) + zero)), 0.0f, top);
      const float dequantized = a.round(a.round(q - zero) / scale);
      const float error = a.round(w[j] - dequantized);
      const float magnitude = fabsf(error);
      error_sum += magnitude;
      // shrink_lp_op: sign(e) * max(|e| - |e|^(p-1) / beta, 0)
      const float shrunk = max_of(a.round(magnitude - a.round(inv_beta * a.shrink_power(magnitude))), 0.0f);
      const float sparse_error = error > 0.0f ? shrunk : error < 0.0f ? -shrunk : 0.0f;
      zero_sum += a.round(q - a.round(a.round(w[j] - sparse_error) * scale));
    }
    // The mean of 64 terms: their float sum (exact here for the half solver's terms) over 64.
    zero = a.round(static_cast<float>(zero_sum) * (1.0f / kGroupSize));
    if (errors) errors[i] += error_sum;
    beta *= 1.01;
  }
  return {scale, zero};
}

}  // namespace fsdpq::hqq_math
