// PEFT's LoRA init: A ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), B = 0, deterministic per name.
#include "optim/lora_init.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace fsdpq {
namespace {

TEST(LoraInit, BoundIsOneOverSqrtFanIn) {
  EXPECT_EQ(lora_a_bound(4096), 1.0 / 64.0);
  EXPECT_EQ(lora_a_bound(16), 0.25);
  // kaiming_uniform(a = sqrt(5)): sqrt(3) * sqrt(2 / (1 + 5)) / sqrt(fan_in).
  EXPECT_NEAR(lora_a_bound(11008), std::sqrt(3.0) * std::sqrt(2.0 / 6.0) / std::sqrt(11008.0),
              1e-15);
}

TEST(LoraInit, ValuesWithinBoundAndUniform) {
  const int64_t rank = 64, fan_in = 4096;
  std::vector<float> a(rank * fan_in);
  lora_init_a(a.data(), rank, fan_in, 42, "base_model.model.model.layers.0.self_attn.q_proj");
  const double bound = 1.0 / 64.0;
  double sum = 0.0, sq = 0.0;
  float lo = 1.0f, hi = -1.0f;
  for (float v : a) {
    ASSERT_LE(std::fabs(v), bound);
    sum += v;
    sq += double(v) * v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  const double n = static_cast<double>(a.size());
  // U(-b, b): mean 0, variance b^2 / 3. With 262144 samples the standard error of the mean is
  // b / sqrt(3 n) ~ 1.8e-5; allow 5 of them. The variance is within 1%.
  EXPECT_NEAR(sum / n, 0.0, 5 * bound / std::sqrt(3 * n));
  EXPECT_NEAR(sq / n, bound * bound / 3, 0.01 * bound * bound / 3);
  EXPECT_LT(lo, -0.999 * bound);
  EXPECT_GT(hi, 0.999 * bound);
}

TEST(LoraInit, DeterministicPerSeedAndName) {
  std::vector<float> a(8 * 256), b(8 * 256), c(8 * 256), d(8 * 256);
  lora_init_a(a.data(), 8, 256, 42, "layers.3.mlp.up_proj");
  lora_init_a(b.data(), 8, 256, 42, "layers.3.mlp.up_proj");
  lora_init_a(c.data(), 8, 256, 42, "layers.3.mlp.down_proj");
  lora_init_a(d.data(), 8, 256, 43, "layers.3.mlp.up_proj");
  EXPECT_EQ(a, b);  // every rank gets the same adapter without communicating
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  // A shard initialises only its slice, equal to the same slice of the whole.
  std::vector<float> slice(300);
  lora_init_a_range(slice.data(), 1000, 300, 256, 42, "layers.3.mlp.up_proj");
  EXPECT_TRUE(std::equal(slice.begin(), slice.end(), a.begin() + 1000));
}

TEST(LoraInit, BIsZero) {
  std::vector<float> b(1000, 3.0f);
  lora_init_b(b.data(), 1000);
  for (float v : b) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace fsdpq
