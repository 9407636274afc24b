#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace fsdpq {

namespace {

// The fixed chunking both sums share: chunk c's sum in double, in element order, then the chunks'
// sums in order. `element(i)` yields element i's value (and may write it first).
constexpr int64_t kChunk = int64_t{1} << 16;

template <class Element>
double chunked_sq_sum(int64_t n, Element element) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
    double sum = 0.0;
    for (int64_t i = c * kChunk; i < end; ++i) {
      const double g = element(i);
      sum += g * g;
    }
    partial[static_cast<size_t>(c)] = sum;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

double grad_sq_sum(const float* grad, int64_t n) {
  return chunked_sq_sum(n, [grad](int64_t i) { return grad[i]; });
}

double accumulate_and_sq_sum(float* grad, const float* addend, float scale, int64_t n, float unscale,
                             bool* found_nonfinite) {
  if (!found_nonfinite)
    return chunked_sq_sum(n, [grad, addend, scale](int64_t i) {
      grad[i] += addend[i] * scale;
      return grad[i];
    });
  // One flag per chunk (each chunk is one thread's), or-ed afterwards.
  std::vector<uint8_t> nonfinite(static_cast<size_t>((n + kChunk - 1) / kChunk), 0);
  const double sum = chunked_sq_sum(n, [&](int64_t i) {
    const float g = grad[i] + addend[i] * scale;
    if (!std::isfinite(g)) nonfinite[static_cast<size_t>(i / kChunk)] = 1;
    grad[i] = g * unscale;
    return grad[i];
  });
  *found_nonfinite = std::any_of(nonfinite.begin(), nonfinite.end(), [](uint8_t f) { return f != 0; });
  return sum;
}

double grad_sq_sum(std::span<const GradBuffer> grads) {
  double total = 0.0;
  for (const GradBuffer& g : grads) total += grad_sq_sum(g.data, g.numel);
  return total;
}

double clip_coefficient(double total_norm, double max_norm) {
  return std::min(1.0, max_norm / (total_norm + 1e-6));
}

ClipResult clip_grads_to_norm(std::span<const GradBuffer> grads, double total_norm,
                              double max_norm) {
  ClipResult result;
  result.total_norm = total_norm;
  const double coef = clip_coefficient(total_norm, max_norm);
  // NaN compares false: a NaN norm leaves the gradients as they are (already NaN).
  if (!(coef < 1.0)) return result;
  result.coefficient = coef;
  result.clipped = true;
  const float factor = static_cast<float>(coef);
  for (const GradBuffer& g : grads) {
    float* data = g.data;
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < g.numel; ++i) data[i] *= factor;
  }
  return result;
}

ClipResult clip_grad_norm(std::span<const GradBuffer> grads, double max_norm) {
  return clip_grads_to_norm(grads, std::sqrt(grad_sq_sum(grads)), max_norm);
}

}  // namespace fsdpq
