#include "optim/clip.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace fsdpq {

namespace {

// The fixed order every sum of squares here shares, whatever the thread count: chunks of 64K
// elements; within a chunk, element i goes to lane (i - chunk start) % kLanes (each lane a double
// sum in element order), the lanes are added pairwise in a fixed tree, then the chunks' sums in
// order. The lanes are independent additions, so the loop runs at the core's add throughput and
// vectorises, where one running sum waits for each add in turn (about 3x slower on the offload
// worker's accumulation, bench/host_update.cpp).
constexpr int64_t kChunk = int64_t{1} << 16;
constexpr int kLanes = 8;

// Sum of squares of element(i) over [begin, end) in the lane order above. `element(i)` yields
// element i's value (and may write it first).
template <class Element>
double lane_sq_sum(int64_t begin, int64_t end, Element&& element) {
  double lane[kLanes] = {};
  int64_t i = begin;
  // No `omp simd`: element() may or into a flag, which only the compiler can prove safe to vectorise.
  for (; i + kLanes <= end; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const double g = element(i + l);
      lane[l] += g * g;
    }
  }
  for (int l = 0; i < end; ++i, ++l) {
    const double g = element(i);
    lane[l] += g * g;
  }
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

// The chunks' sums, `chunk_sum(begin, end, chunk index)` each, added in chunk order.
template <class ChunkSum>
double chunked_sum(int64_t n, ChunkSum chunk_sum) {
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c)
    partial[static_cast<size_t>(c)] = chunk_sum(c * kChunk, std::min(n, (c + 1) * kChunk), c);
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

double grad_sq_sum(const float* grad, int64_t n) {
  return chunked_sum(n, [grad](int64_t begin, int64_t end, int64_t) {
    return lane_sq_sum(begin, end, [grad](int64_t i) { return grad[i]; });
  });
}

double accumulate_and_sq_sum(float* grad, const float* addend, float scale, int64_t n, float unscale,
                             bool* found_nonfinite) {
  if (!found_nonfinite)
    return chunked_sum(n, [=](int64_t begin, int64_t end, int64_t) {
      return lane_sq_sum(begin, end, [=](int64_t i) {
        const float g = grad[i] + addend[i] * scale;
        grad[i] = g;
        return g;
      });
    });
  // One flag per chunk (each chunk is one thread's), or-ed afterwards.
  std::vector<uint8_t> nonfinite(static_cast<size_t>((n + kChunk - 1) / kChunk), 0);
  const double sum = chunked_sum(n, [&](int64_t begin, int64_t end, int64_t c) {
    bool bad = false;
    const double s = lane_sq_sum(begin, end, [&](int64_t i) {
      const float g = grad[i] + addend[i] * scale;
      bad |= !std::isfinite(g);
      grad[i] = g * unscale;
      return grad[i];
    });
    nonfinite[static_cast<size_t>(c)] = bad;
    return s;
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
