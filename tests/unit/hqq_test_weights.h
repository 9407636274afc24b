// Weights that exercise every branch of HQQ's solver (quant/hqq.h), for comparing two
// implementations of it: bf16 values (what a model file holds) whose groups are ordinary (normal
// with heavy tails), constant, narrower than hqq's 1e-4 floor, all positive, large, or tiny enough
// that the solver's float16 arithmetic meets subnormals, in an order set by the seed.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "quant/hqq.h"
#include "util/bf16.h"

namespace fsdpq::test {

inline std::vector<float> hqq_test_weights(int64_t groups, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::student_t_distribution<float> tails(3.0f);
  std::uniform_int_distribution<int> kind(0, 9);
  std::vector<float> w(static_cast<size_t>(groups * kHqqGroupSize));
  for (int64_t g = 0; g < groups; ++g) {
    const int k = g == 0 ? 1 : kind(rng);  // group 0 is always constant
    const float offset = normal(rng);
    for (int64_t j = 0; j < kHqqGroupSize; ++j) {
      float v = 0.0f;
      switch (k) {
        case 1: v = 0.0f; break;                                          // constant
        case 2: v = offset + 1e-6f * normal(rng); break;                  // range below 1e-4
        case 3: v = std::fabs(normal(rng)) + 0.01f; break;                // all positive
        case 4: v = 40.0f * normal(rng); break;                           // large
        case 5: v = 1e-4f * normal(rng); break;                           // float16 subnormals
        case 6: v = 0.01f * tails(rng); break;                            // heavy tails
        default: v = normal(rng); break;                                  // ordinary
      }
      w[static_cast<size_t>(g * kHqqGroupSize + j)] = bf16_to_float(float_to_bf16(v));
    }
  }
  return w;
}

}  // namespace fsdpq::test
