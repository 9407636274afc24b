// bitsandbytes' signed 8-bit dynamic code (create_dynamic_map(signed=True)) and its blockwise
// quantization, used by NF4 double quantization.
#include "quant/dynamic_code.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace fsdpq {
namespace {

TEST(Nf4DynamicCode, TableShapeAndEndpoints) {
  const auto& code = dynamic_code_signed();
  ASSERT_EQ(code.size(), 256u);
  EXPECT_TRUE(std::is_sorted(code.begin(), code.end()));
  for (int i = 0; i < 255; ++i) EXPECT_LT(code[i], code[i + 1]) << "duplicate at " << i;
  EXPECT_EQ(code[127], 0.0f);  // 127 negatives, then 0
  EXPECT_EQ(code[255], 1.0f);  // the appended 1.0
  for (int i = 0; i < 127; ++i) EXPECT_EQ(code[i], -code[254 - i]) << i;  // symmetric but for 1.0
}

TEST(Nf4DynamicCode, ExactEntriesFromTheFormula) {
  const auto& code = dynamic_code_signed();
  // Level i = 0: linspace(0.1, 1, 2) = [0.1f, 1], one mean (0.1f + 1) / 2, times fp32(1e-6).
  const float mean0 = (0.1f + 1.0f) / 2.0f;
  EXPECT_EQ(code[128], static_cast<float>(1e-6) * mean0);
  EXPECT_NEAR(code[128], 5.5e-7, 1e-13);
  // Level i = 6 (scale 1): linspace(0.1, 1, 65). step = (1 - 0.1f) / 64 where 1 - 0.1f rounds to
  // 15099494 * 2^-24; the last two points are 1 - step (counted down from the end, rounded to
  // 16541286 * 2^-24) and 1; their mean (16541286 + 2^24) / 2 * 2^-24 = 16659251 * 2^-24.
  EXPECT_EQ(code[254], 16659251.0f / 16777216.0f);
  EXPECT_EQ(code[0], -16659251.0f / 16777216.0f);
  // Level 6's first mean is 0.1 + 0.9 / 128 up to fp32 rounding, level 5's last 0.1 * (1 - 0.9/64).
  EXPECT_NEAR(code[191], 0.1 + 0.9 / 128, 1e-7);
  EXPECT_NEAR(code[190], 0.1 * (1 - 0.9 / 64), 1e-8);
}

TEST(Nf4DynamicCode, QuantizeHandCases) {
  const auto& code = dynamic_code_signed();
  EXPECT_EQ(dynamic_code_quantize(code, 0.0f), 127);
  EXPECT_EQ(dynamic_code_quantize(code, 1.0f), 255);
  EXPECT_EQ(dynamic_code_quantize(code, -1.0f), 0);  // beyond code[0] = -0.99297
  EXPECT_EQ(dynamic_code_quantize(code, 2.0f), 255);
  EXPECT_EQ(dynamic_code_quantize(code, -2.0f), 0);
  EXPECT_EQ(dynamic_code_quantize(code, std::nanf("")), 0);  // every `x > code` is false
  for (int k = 0; k < 256; ++k) EXPECT_EQ(dynamic_code_quantize(code, code[k]), k) << k;
  // A value exactly at the fp32 midpoint of two neighbours keeps the descent's leaf, which is
  // always the even index of the pair.
  for (int k = 0; k < 255; ++k) {
    const float midpoint = (code[k] + code[k + 1]) * 0.5f;
    if (midpoint == code[k] || midpoint == code[k + 1]) continue;
    EXPECT_EQ(dynamic_code_quantize(code, midpoint), k % 2 == 0 ? k : k + 1) << k;
  }
}

TEST(Nf4DynamicCode, QuantizeIsNearest) {
  const auto& code = dynamic_code_signed();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int trial = 0; trial < 20000; ++trial) {
    // Spread over many magnitudes, where the code is dense near zero.
    const float x = uniform(rng) * std::pow(10.0f, -static_cast<float>(trial % 7));
    const int q = dynamic_code_quantize(code, x);
    const double err = std::fabs(double(x) - code[q]);
    for (int k = std::max(0, q - 1); k <= std::min(255, q + 1); ++k)
      ASSERT_LE(err, std::fabs(double(x) - code[k]) * (1 + 1e-6) + 1e-12) << x;
  }
}

TEST(Nf4DynamicCode, BlockwiseRoundTrip) {
  const int64_t n = 600;  // blocks of 256: 256, 256, 88
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 0.01f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  std::vector<uint8_t> q(n);
  std::vector<float> absmax(3), out(n);
  dynamic8_quantize_blockwise(x.data(), n, 256, q.data(), absmax.data());
  dynamic8_dequantize_blockwise(q.data(), absmax.data(), n, 256, out.data());
  const auto& code = dynamic_code_signed();
  double gap = 0.0;
  for (int k = 0; k < 255; ++k) gap = std::max(gap, double(code[k + 1]) - code[k]);
  for (int b = 0; b < 3; ++b) {
    float largest = 0.0f;
    for (int64_t i = b * 256; i < std::min<int64_t>(n, (b + 1) * 256); ++i)
      largest = std::max(largest, std::fabs(x[i]));
    EXPECT_EQ(absmax[b], largest);
  }
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_NEAR(out[i], x[i], absmax[i / 256] * gap / 2 * (1 + 1e-5)) << i;
    EXPECT_EQ(out[i], code[q[i]] * absmax[i / 256]);
  }
}

}  // namespace
}  // namespace fsdpq
