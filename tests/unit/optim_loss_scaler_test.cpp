// Dynamic loss scaling with torch.amp.GradScaler's defaults.
#include "optim/loss_scaler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "util/error.h"

namespace fsdpq {
namespace {

TEST(LossScaler, DefaultsAndUnscale) {
  DynamicLossScaler s;
  EXPECT_EQ(s.scale(), 65536.0f);
  EXPECT_EQ(s.inv_scale(), 1.0f / 65536.0f);
  std::vector<float> g = {65536.0f, -131072.0f, 32768.0f};
  EXPECT_FALSE(s.unscale(g.data(), 3));
  EXPECT_EQ(g, (std::vector<float>{1.0f, -2.0f, 0.5f}));
}

TEST(LossScaler, OverflowSkipsTheStepAndHalvesTheScale) {
  DynamicLossScaler s;
  std::vector<float> g = {1.0f, std::numeric_limits<float>::infinity()};
  const bool found_inf = s.unscale(g.data(), 2);
  EXPECT_TRUE(found_inf);
  EXPECT_FALSE(s.update(found_inf));  // skip
  EXPECT_EQ(s.scale(), 32768.0f);
  EXPECT_EQ(s.growth_tracker(), 0);
  EXPECT_TRUE(s.update(false));  // clean step: applied
  EXPECT_EQ(s.growth_tracker(), 1);
}

TEST(LossScaler, NanIsDetected) {
  std::vector<float> g = {0.5f, std::nanf(""), 2.0f};
  EXPECT_TRUE(DynamicLossScaler::has_nonfinite(g.data(), 3));
  DynamicLossScaler s;
  EXPECT_TRUE(s.unscale(g.data(), 3));
  std::vector<float> clean = {0.5f, -2.0f};
  EXPECT_FALSE(DynamicLossScaler::has_nonfinite(clean.data(), 2));
}

TEST(LossScaler, GrowsAfterTheInterval) {
  DynamicLossScaler s({1024.0f, 2.0f, 0.5f, 3});
  EXPECT_TRUE(s.update(false));
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.scale(), 1024.0f);
  EXPECT_EQ(s.growth_tracker(), 2);
  EXPECT_TRUE(s.update(false));  // third clean step in a row: grow, reset the tracker
  EXPECT_EQ(s.scale(), 2048.0f);
  EXPECT_EQ(s.growth_tracker(), 0);
  // An overflow resets the count.
  s.update(false);
  s.update(true);
  EXPECT_EQ(s.scale(), 1024.0f);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 1024.0f);
  s.update(false);
  EXPECT_EQ(s.scale(), 2048.0f);
  // The default interval is 2000 steps.
  DynamicLossScaler d;
  for (int i = 0; i < 1999; ++i) d.update(false);
  EXPECT_EQ(d.scale(), 65536.0f);
  d.update(false);
  EXPECT_EQ(d.scale(), 131072.0f);
}

TEST(LossScaler, StateRoundTrip) {
  DynamicLossScaler s;
  s.update(true);
  s.update(false);
  DynamicLossScaler restored;
  restored.load_state_json(s.state_json());
  EXPECT_EQ(restored.scale(), 32768.0f);
  EXPECT_EQ(restored.growth_tracker(), 1);
  EXPECT_THROW(restored.load_state_json({{"scale", -1.0}, {"growth_tracker", 0}}), UserError);
}

}  // namespace
}  // namespace fsdpq
