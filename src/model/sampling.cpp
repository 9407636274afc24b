#include "model/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "model/init_model.h"
#include "util/error.h"

namespace fsdpq {
namespace {

void check_logits(const std::vector<float>& logits) {
  if (logits.empty()) fail("sampling: the model returned no logits");
  bool any_finite = false;
  for (float v : logits) {
    if (std::isnan(v) || v == INFINITY) fail("sampling: the model's logits are not finite (NaN or +inf)");
    any_finite = any_finite || std::isfinite(v);
  }
  if (!any_finite) fail("sampling: every logit is -inf; no token can be chosen");
}

int32_t argmax(const std::vector<float>& logits) {
  // std::max_element returns the first of equal maxima: the lowest index, as torch.argmax does.
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace

void validate_sampling_options(const SamplingOptions& options) {
  if (!(options.temperature >= 0) || !std::isfinite(options.temperature))
    fail("--temperature {}: must be a number >= 0 (0 = greedy decoding)", options.temperature);
  if (!(options.top_p > 0 && options.top_p <= 1))
    fail("--top_p {}: must be in (0, 1] (1 keeps every token)", options.top_p);
}

double sampling_uniform(uint64_t seed, uint64_t step) {
  uint32_t x0 = static_cast<uint32_t>(step), x1 = static_cast<uint32_t>(step >> 32);
  threefry2x32_20(static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), x0, x1);
  const uint64_t bits = (static_cast<uint64_t>(x0 >> 5) << 26) | (x1 >> 6);  // 27 + 26 = 53 bits
  return static_cast<double>(bits) * 0x1.0p-53;
}

std::vector<double> sampling_distribution(const std::vector<float>& logits, const SamplingOptions& options) {
  validate_sampling_options(options);
  check_logits(logits);
  const size_t n = logits.size();
  std::vector<double> p(n, 0.0);
  if (options.temperature == 0) {
    p[static_cast<size_t>(argmax(logits))] = 1.0;
    return p;
  }
  const double max = *std::max_element(logits.begin(), logits.end());
  double total = 0;
  for (size_t i = 0; i < n; ++i) {
    p[i] = std::exp((static_cast<double>(logits[i]) - max) / options.temperature);
    total += p[i];
  }
  for (double& v : p) v /= total;
  if (options.top_p >= 1) return p;  // transformers adds no TopPLogitsWarper for top_p = 1

  // Most likely first; equal probabilities by index, so the filter is deterministic.
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  // TopPLogitsWarper accumulates from the least likely and removes while the sum is <= 1 - top_p;
  // the most likely token always stays (min_tokens_to_keep = 1).
  const double threshold = 1.0 - options.top_p;
  double ascending = 0;
  double kept = 0;
  for (size_t k = n; k-- > 0;) {
    const size_t token = static_cast<size_t>(order[k]);
    ascending += p[token];
    if (k > 0 && ascending <= threshold)
      p[token] = 0;
    else
      kept += p[token];
  }
  for (double& v : p) v /= kept;
  return p;
}

int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& options, uint64_t step) {
  validate_sampling_options(options);
  check_logits(logits);
  if (options.temperature == 0) return argmax(logits);
  const std::vector<double> p = sampling_distribution(logits, options);
  // Inverse CDF over the token ids in index order.
  const double u = sampling_uniform(options.seed, step);
  double cumulative = 0;
  int32_t last = -1;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] == 0) continue;
    cumulative += p[i];
    last = static_cast<int32_t>(i);
    if (u < cumulative) return last;
  }
  return last;  // u fell in the rounding gap above the final cumulative sum
}

}  // namespace fsdpq
