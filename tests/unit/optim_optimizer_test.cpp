// Each optimizer against arithmetic written out by hand (in double) for two steps on a
// two-element vector. The implementation works in fp32 like torch, so the tolerance is 2e-6
// relative.
#include "optim/optimizer.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "util/bf16.h"
#include "util/dtype.h"

#include "util/error.h"

namespace fsdpq {
namespace {

constexpr double kRel = 2e-6;

void expect_close(const std::vector<float>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], kRel * std::fabs(want[i]) + 1e-9) << "element " << i;
}

const std::vector<float> kGrad1 = {0.5f, -1.0f};
const std::vector<float> kGrad2 = {0.25f, 0.5f};

TEST(OptimAdamW, TwoStepsByHand) {
  // fsdp_qlora's AdamW: lr 0.1 here, betas (0.9, 0.95), eps 1e-5, weight decay 0.1.
  ShardOptimizer opt(optimizer_config("adamw", 0.1, 0.1), 2);
  std::vector<float> p = {1.0f, -2.0f};

  // Step 1. Decay: p *= 1 - 0.1 * 0.1 = 0.99 -> [0.99, -1.98].
  // m = 0.1 g = [0.05, -0.1]; v = 0.05 g^2 = [0.0125, 0.05].
  // bc1 = 1 - 0.9 = 0.1, bc2 = 1 - 0.95 = 0.05; step size = lr / bc1 = 1.
  // denom = sqrt(v) / sqrt(bc2) + eps = [0.5, 1] + 1e-5.
  // p -= 1 * m / denom -> [0.99 - 0.05 / 0.50001, -1.98 + 0.1 / 1.00001].
  opt.step(p.data(), kGrad1.data(), 0.1);
  expect_close(p, {0.99 - 0.05 / 0.50001, -1.98 + 0.1 / 1.00001});
  EXPECT_NEAR(p[0], 0.890002, 1e-6);  // ~ lr * sign(g) away from the decayed value
  EXPECT_EQ(opt.step_count(), 1);

  // Step 2. Decay again: p *= 0.99.
  // m = 0.9 m + 0.1 g = [0.045 + 0.025, -0.09 + 0.05] = [0.07, -0.04].
  // v = 0.95 v + 0.05 g^2 = [0.011875 + 0.003125, 0.0475 + 0.0125] = [0.015, 0.06].
  // bc1 = 1 - 0.81 = 0.19, bc2 = 1 - 0.9025 = 0.0975; step size = 0.1 / 0.19.
  const double p1[2] = {0.99 - 0.05 / 0.50001, -1.98 + 0.1 / 1.00001};
  const double m2[2] = {0.07, -0.04}, v2[2] = {0.015, 0.06};
  std::vector<double> want(2);
  for (int i = 0; i < 2; ++i) {
    const double denom = std::sqrt(v2[i]) / std::sqrt(0.0975) + 1e-5;
    want[i] = p1[i] * 0.99 - (0.1 / 0.19) * m2[i] / denom;
  }
  opt.step(p.data(), kGrad2.data(), 0.1);
  expect_close(p, want);

  auto state = opt.state_buffers();
  ASSERT_EQ(state.size(), 2u);
  EXPECT_EQ(state[0].name, "exp_avg");
  EXPECT_EQ(state[1].name, "exp_avg_sq");
  EXPECT_NEAR(state[0].data[0], 0.07, 1e-8);
  EXPECT_NEAR(state[1].data[1], 0.06, 1e-8);
}

TEST(OptimAdam, TwoStepsByHand) {
  // torch.optim.Adam(lr=0.1): betas (0.9, 0.999), eps 1e-8, no weight decay.
  ShardOptimizer opt(optimizer_config("adam", 0.1, 0.1), 2);  // wd ignored for adam
  EXPECT_EQ(opt.config().weight_decay, 0.0);
  std::vector<float> p = {1.0f, -2.0f};
  // Step 1: m = 0.1 g, v = 0.001 g^2, bc1 = 0.1, bc2 = 0.001 -> m / bc1 = g, sqrt(v / bc2) = |g|:
  // p -= 0.1 * g / (|g| + 1e-8) -> [0.9, -1.9] (up to 1e-8 relative).
  opt.step(p.data(), kGrad1.data(), 0.1);
  expect_close(p, {1.0 - 0.1 * 0.5 / (0.5 + 1e-8), -2.0 + 0.1 * 1.0 / (1.0 + 1e-8)});
  // Step 2: m = [0.9*0.05 + 0.1*0.25, 0.9*-0.1 + 0.1*0.5] = [0.07, -0.04];
  // v = [0.999*0.00025 + 0.001*0.0625, 0.999*0.001 + 0.001*0.25] = [0.00031225, 0.001249];
  // bc1 = 0.19, bc2 = 1 - 0.999^2 = 0.001999.
  const double m2[2] = {0.07, -0.04}, v2[2] = {0.00031225, 0.001249};
  const double p1[2] = {1.0 - 0.1 * 0.5 / (0.5 + 1e-8), -2.0 + 0.1 / (1.0 + 1e-8)};
  std::vector<double> want(2);
  for (int i = 0; i < 2; ++i)
    want[i] = p1[i] - (0.1 / 0.19) * m2[i] / (std::sqrt(v2[i]) / std::sqrt(0.001999) + 1e-8);
  opt.step(p.data(), kGrad2.data(), 0.1);
  expect_close(p, want);
}

TEST(OptimSgd, TwoStepsByHand) {
  ShardOptimizer opt(optimizer_config("sgd", 0.1, 0.1), 2);
  EXPECT_TRUE(opt.state_buffers().empty());
  std::vector<float> p = {1.0f, -2.0f};
  opt.step(p.data(), kGrad1.data(), 0.1);  // p - 0.1 g = [0.95, -1.9]
  expect_close(p, {0.95, -1.9});
  opt.step(p.data(), kGrad2.data(), 0.1);  // [0.95 - 0.025, -1.9 - 0.05]
  expect_close(p, {0.925, -1.95});
}

TEST(OptimAdadelta, TwoStepsByHand) {
  // torch.optim.Adadelta(lr=1.0): rho 0.9, eps 1e-6.
  ShardOptimizer opt(optimizer_config("adadelta", 1.0, 0.0), 2);
  std::vector<float> p = {1.0f, -2.0f};
  const double g1[2] = {0.5, -1.0}, g2[2] = {0.25, 0.5};
  double sq[2] = {0, 0}, acc[2] = {0, 0}, want[2] = {1.0, -2.0};
  // Per step: sq = 0.9 sq + 0.1 g^2; delta = sqrt(acc + eps) / sqrt(sq + eps) * g;
  // acc = 0.9 acc + 0.1 delta^2; p -= lr * delta. Step 1: delta = 1e-3 / sqrt(0.1 g^2 + 1e-6) * g.
  for (const double* g : {g1, g2}) {
    for (int i = 0; i < 2; ++i) {
      sq[i] = 0.9 * sq[i] + 0.1 * g[i] * g[i];
      const double delta = std::sqrt(acc[i] + 1e-6) / std::sqrt(sq[i] + 1e-6) * g[i];
      acc[i] = 0.9 * acc[i] + 0.1 * delta * delta;
      want[i] -= 1.0 * delta;
    }
    opt.step(p.data(), g == g1 ? kGrad1.data() : kGrad2.data(), 1.0);
    expect_close(p, {want[0], want[1]});
  }
  // First step moved element 0 by 1e-3 / sqrt(0.025001) * 0.5 = 0.0031622144
  EXPECT_NEAR(1.0 - 0.5 * 1e-3 / std::sqrt(0.025001), 0.9968377856, 1e-9);
  EXPECT_EQ(opt.state_buffers()[0].name, "square_avg");
  EXPECT_EQ(opt.state_buffers()[1].name, "acc_delta");
}

TEST(OptimConfig, FsdpQloraNamesAndDefaults) {
  const OptimizerConfig adamw = optimizer_config("adamw", 1e-5, 0.1);
  EXPECT_EQ(adamw.kind, OptimizerKind::adamw);
  EXPECT_EQ(adamw.beta2, 0.95);
  EXPECT_EQ(adamw.eps, 1e-5);
  EXPECT_EQ(adamw.weight_decay, 0.1);
  EXPECT_EQ(optimizer_config("fused_adamw", 1e-5, 0.1).kind, OptimizerKind::adamw);
  const OptimizerConfig adam = optimizer_config("fused_adam", 1e-5, 0.1);
  EXPECT_EQ(adam.kind, OptimizerKind::adam);
  EXPECT_EQ(adam.beta2, 0.999);
  EXPECT_EQ(adam.eps, 1e-8);
  EXPECT_EQ(optimizer_config("adadelta", 1.0, 0.1).eps, 1e-6);
  EXPECT_THROW(optimizer_config("lion", 1e-5, 0.1), UserError);
}

TEST(OptimShards, ShardedStepsEqualOneWholeStep) {
  // Two ranks stepping their halves with optimizer_step equals one step over the whole buffer.
  const OptimizerConfig c = optimizer_config("adamw", 1e-3, 0.1);
  const int n = 10;
  std::vector<float> whole(n), sharded(n), grad(n);
  for (int i = 0; i < n; ++i) {
    whole[i] = sharded[i] = 0.1f * (i - 4.5f);
    grad[i] = 0.03f * ((i * 7) % 5 - 2.0f) + 0.001f;
  }
  ShardOptimizer opt(c, n);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  for (int step = 1; step <= 3; ++step) {
    opt.step(whole.data(), grad.data(), 1e-3);
    for (int begin : {0, 6}) {
      const int count = begin == 0 ? 6 : 4;
      float* state[2] = {m.data() + begin, v.data() + begin};
      optimizer_step(c, 1e-3, step, sharded.data() + begin, grad.data() + begin, state, count);
    }
  }
  EXPECT_EQ(whole, sharded);
}

// The fused step (CPU offload's worker) against the separate passes it replaces: scale the
// gradient, step, zero the gradient, store the compute copy. Bit for bit, every optimizer and
// compute dtype, over random values large enough to take the multi-threaded loop.
TEST(OptimFusedStep, EqualsSeparatePassesBitForBit) {
  const int64_t n = 200003, compute_n = n - 37;  // the compute copy covers a prefix (padding after)
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const char* name : {"adamw", "adam", "sgd", "adadelta"}) {
    for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
      for (float scale : {1.0f, 0.37f}) {
        SCOPED_TRACE(fmt::format("{} {} scale {}", name, dtype_name(dtype), scale));
        const OptimizerConfig c = optimizer_config(name, 1e-2, 0.1);
        ShardOptimizer separate(c, n), fused(c, n);
        std::vector<float> p0(n), g0(n);
        for (int64_t i = 0; i < n; ++i) p0[i] = normal(rng), g0[i] = normal(rng) * 0.1f;
        std::vector<float> p_sep = p0, p_fused = p0;
        const size_t element = dtype_size(dtype);
        std::vector<uint8_t> want(static_cast<size_t>(compute_n) * element), got(want.size(), 0xAB);
        for (int step = 0; step < 3; ++step) {
          std::vector<float> g_sep = g0, g_fused = g0;
          for (float& g : g_sep) g *= scale;
          separate.step(p_sep.data(), g_sep.data(), 1e-2);
          std::fill(g_sep.begin(), g_sep.end(), 0.0f);
          for (int64_t i = 0; i < compute_n; ++i) {
            if (dtype == DType::F32) std::memcpy(want.data() + i * 4, &p_sep[i], 4);
            const uint16_t h = dtype == DType::BF16 ? float_to_bf16(p_sep[i]) : float_to_f16(p_sep[i]);
            if (dtype != DType::F32) std::memcpy(want.data() + i * 2, &h, 2);
          }
          StepFusion fusion;
          fusion.grad_scale = scale;
          fusion.zero_grad = true;
          fusion.compute = got.data();
          fusion.compute_dtype = dtype;
          fusion.compute_numel = compute_n;
          fused.step(p_fused.data(), g_fused.data(), 1e-2, fusion);
          ASSERT_EQ(0, std::memcmp(p_sep.data(), p_fused.data(), n * sizeof(float)));
          ASSERT_EQ(g_sep, g_fused);
          ASSERT_EQ(want, got);
          for (int64_t i = 0; i < n; ++i) g0[i] = normal(rng) * 0.1f;
        }
        auto a = separate.state_buffers(), b = fused.state_buffers();
        for (size_t k = 0; k < a.size(); ++k)
          EXPECT_EQ(0, std::memcmp(a[k].data.data(), b[k].data.data(), a[k].data.size_bytes()));
      }
    }
  }
  // Without a compute copy or zeroing, only the scaled step.
  const OptimizerConfig c = optimizer_config("adamw", 1e-2, 0.1);
  ShardOptimizer plain(c, 4), fused(c, 4);
  std::vector<float> p1 = {1, 2, 3, 4}, p2 = p1, g = {0.5f, -0.25f, 1.0f, 2.0f}, g_scaled = g;
  for (float& x : g_scaled) x *= 0.5f;
  plain.step(p1.data(), g_scaled.data(), 1e-2);
  StepFusion half;
  half.grad_scale = 0.5f;
  fused.step(p2.data(), g.data(), 1e-2, half);
  EXPECT_EQ(p1, p2);
  EXPECT_EQ(g, (std::vector<float>{0.5f, -0.25f, 1.0f, 2.0f}));  // not zeroed: not asked
  StepFusion bad;
  bad.compute_numel = 5;  // past the shard
  std::vector<float> out(5);
  bad.compute = out.data();
  EXPECT_THROW(fused.step(p2.data(), g.data(), 1e-2, bad), std::logic_error);
}

TEST(OptimState, JsonRoundTripAndValidation) {
  ShardOptimizer opt(optimizer_config("adamw", 1e-3, 0.1), 4);
  std::vector<float> p(4, 1.0f), g(4, 0.5f);
  opt.step(p.data(), g.data(), 1e-3);
  opt.step(p.data(), g.data(), 1e-3);
  const nlohmann::json saved = opt.state_json();
  EXPECT_EQ(saved.at("step"), 2);
  ShardOptimizer restored(optimizer_config("adamw", 1e-3, 0.1), 4);
  restored.load_state_json(saved);
  EXPECT_EQ(restored.step_count(), 2);
  ShardOptimizer other_size(optimizer_config("adamw", 1e-3, 0.1), 5);
  EXPECT_THROW(other_size.load_state_json(saved), UserError);
  ShardOptimizer other_kind(optimizer_config("sgd", 1e-3, 0.1), 4);
  EXPECT_THROW(other_kind.load_state_json(saved), UserError);
}

}  // namespace
}  // namespace fsdpq
