// Choosing the next token from a model's logits, as transformers' generate does with
// do_sample=True, TemperatureLogitsWarper and TopPLogitsWarper (top_k off): temperature 0 is greedy.
// The random draw comes from a counter-based generator keyed by (seed, step), so the same seed
// gives the same text on every machine, whatever ran before.
#pragma once
#include <cstdint>
#include <vector>

namespace fsdpq {

struct SamplingOptions {
  double temperature = 0.7;  // 0: greedy (argmax)
  double top_p = 0.9;        // nucleus: in (0, 1]; 1 keeps every token
  uint64_t seed = 0;
};

// Checks the options; errors name the flags (--temperature, --top_p).
void validate_sampling_options(const SamplingOptions& options);

// The token for decoding step `step` (0 for the first new token). Greedy takes the lowest index
// among equal maxima. Logits must be finite or -inf, with at least one finite.
int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& options, uint64_t step);

// The distribution sample_token draws from (exposed for tests): softmax(logits / T) in double,
// with TopPLogitsWarper's filter — sort ascending, drop tokens whose cumulative probability is
// <= 1 - top_p, always keep the most likely — renormalised; zeros where filtered out.
// Greedy (T = 0) gives a one-hot vector.
std::vector<double> sampling_distribution(const std::vector<float>& logits, const SamplingOptions& options);

// The uniform draw in [0, 1) for (seed, step): 53 bits of Threefry-2x32-20(key = seed, counter = step).
double sampling_uniform(uint64_t seed, uint64_t step);

}  // namespace fsdpq
