// fsdp_qlora's schedules at hand-picked steps (LambdaLR: step k runs at base_lr * lambda(k)).
#include "optim/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "util/error.h"

namespace fsdpq {
namespace {

TEST(ScheduleSteps, TrainingAndWarmupStepCounts) {
  // 1 epoch of 52 batches with gradient accumulation 4 -> 52 // 4 = 13 steps, warm-up int(1.3) = 1.
  EXPECT_EQ(num_training_steps(1, 52, 4), 13);
  EXPECT_EQ(num_training_steps(3, 10, 4), 7);  // 30 // 4
  EXPECT_EQ(num_warmup_steps(13), 1);
  EXPECT_EQ(num_warmup_steps(100), 10);
  EXPECT_EQ(num_warmup_steps(9), 0);
  EXPECT_EQ(num_warmup_steps(70), 7);  // 70 * 0.1 = 7.000000000000001 in double
}

TEST(ScheduleLinear, WarmupThenLinearToZero) {
  const LrSchedule s(LrScheduleKind::linear, 1e-4, 100);  // warm-up 10
  EXPECT_EQ(s.warmup_steps(), 10);
  EXPECT_EQ(s.lr_at(0), 0.0);                 // the very first step runs at lr 0
  EXPECT_DOUBLE_EQ(s.lr_at(5), 0.5e-4);       // 5 / 10
  EXPECT_DOUBLE_EQ(s.lr_at(10), 1e-4);        // end of warm-up: (100 - 10) / 90
  EXPECT_DOUBLE_EQ(s.lr_at(55), 0.5e-4);      // (100 - 55) / 90
  EXPECT_DOUBLE_EQ(s.lr_at(99), 1e-4 / 90);   // last step: 1 / 90
  EXPECT_EQ(s.lr_at(100), 0.0);               // the end
  EXPECT_EQ(s.lr_at(120), 0.0);               // clamped at 0 past the end
}

TEST(ScheduleCosine, WarmupThenOneCycleToMinFraction) {
  const LrSchedule s(LrScheduleKind::cosine, 2e-4, 100, 0.1);
  EXPECT_EQ(s.lr_at(0), 0.0);
  EXPECT_DOUBLE_EQ(s.lr_at(3), 2e-4 * 0.3);
  // Progress 0 at the end of warm-up: (cos 0 + 1) * 0.5 * 0.9 + 0.1 = 1.
  EXPECT_DOUBLE_EQ(s.lr_at(10), 2e-4);
  // Mid-cosine, progress 45/90 = 0.5: (cos(pi/2) + 1) * 0.45 + 0.1 = 0.55.
  EXPECT_NEAR(s.lr_at(55), 2e-4 * 0.55, 1e-18);
  // Last step, progress 89/90: 0.45 * (1 + cos(89 pi / 90)) + 0.1 = 0.1 + 0.45 (1 - cos(pi/90)).
  EXPECT_NEAR(s.lambda_at(99), 0.1 + 0.45 * (1 - std::cos(std::numbers::pi / 90)), 1e-15);
  EXPECT_NEAR(s.lambda_at(99), 0.1002741, 1e-7);
  EXPECT_NEAR(s.lr_at(100), 2e-4 * 0.1, 1e-18);  // the floor, min_lr_fraction
}

TEST(ScheduleCosine, NoWarmupWhenFewSteps) {
  const LrSchedule s(LrScheduleKind::cosine, 1e-3, 5);  // int(0.5) = 0 warm-up steps
  EXPECT_EQ(s.warmup_steps(), 0);
  EXPECT_DOUBLE_EQ(s.lr_at(0), 1e-3);  // progress 0
  EXPECT_NEAR(s.lambda_at(5), 0.1, 1e-15);
}

TEST(ScheduleConstant, AlwaysBase) {
  const LrSchedule s(LrScheduleKind::constant, 1e-5, 100);
  for (int64_t step : {0, 1, 10, 99, 1000}) EXPECT_EQ(s.lr_at(step), 1e-5);
}

TEST(ScheduleParse, NamesAndErrors) {
  EXPECT_EQ(parse_lr_schedule("cosine"), LrScheduleKind::cosine);
  EXPECT_EQ(lr_schedule_name(LrScheduleKind::linear), "linear");
  EXPECT_THROW(parse_lr_schedule("step"), UserError);
}

}  // namespace
}  // namespace fsdpq
