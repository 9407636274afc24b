// Global-norm clipping as torch.nn.utils.clip_grad_norm_.
#include "optim/clip.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "optim/loss_scaler.h"

namespace fsdpq {
namespace {

TEST(ClipNorm, GlobalNormOverBuffers) {
  std::vector<float> a = {3.0f, 4.0f}, b = {12.0f};
  const GradBuffer grads[] = {{a.data(), 2}, {b.data(), 1}};
  EXPECT_EQ(grad_sq_sum(grads), 169.0);  // 9 + 16 + 144
  // A sharded caller: partial sums from two "ranks", all-reduced, give the same total.
  EXPECT_EQ(grad_sq_sum(a.data(), 2) + grad_sq_sum(b.data(), 1), 169.0);
}

TEST(ClipNorm, ClipsToMaxNorm) {
  std::vector<float> a = {3.0f, 4.0f}, b = {12.0f};
  const GradBuffer grads[] = {{a.data(), 2}, {b.data(), 1}};
  const ClipResult r = clip_grad_norm(grads, 1.3);
  EXPECT_EQ(r.total_norm, 13.0);
  EXPECT_TRUE(r.clipped);
  EXPECT_DOUBLE_EQ(r.coefficient, 1.3 / (13.0 + 1e-6));  // max_norm / (norm + 1e-6)
  EXPECT_NEAR(a[0], 0.3, 1e-6);
  EXPECT_NEAR(a[1], 0.4, 1e-6);
  EXPECT_NEAR(b[0], 1.2, 1e-6);
  const GradBuffer after[] = {{a.data(), 2}, {b.data(), 1}};
  EXPECT_NEAR(std::sqrt(grad_sq_sum(after)), 1.3, 1e-6);
}

TEST(ClipNorm, NoClipBelowMax) {
  std::vector<float> a = {3.0f, 4.0f};
  const GradBuffer grads[] = {{a.data(), 2}};
  const ClipResult r = clip_grad_norm(grads, 20.0);
  EXPECT_FALSE(r.clipped);
  EXPECT_EQ(r.coefficient, 1.0);
  EXPECT_EQ(a, (std::vector<float>{3.0f, 4.0f}));
  // Exactly at the max the coefficient is just below 1 (the 1e-6): torch multiplies, so do we.
  EXPECT_LT(clip_coefficient(5.0, 5.0), 1.0);
  EXPECT_EQ(clip_coefficient(5.0, 6.0), 1.0);
}

TEST(ClipNorm, LargeBufferIsDeterministic) {
  std::vector<float> g(300000);
  for (size_t i = 0; i < g.size(); ++i) g[i] = 0.001f * static_cast<float>((i * 37) % 101) - 0.05f;
  double expected = 0.0;
  for (float v : g) expected += double(v) * v;
  EXPECT_NEAR(grad_sq_sum(g.data(), static_cast<int64_t>(g.size())), expected, 1e-9 * expected);
  EXPECT_EQ(grad_sq_sum(g.data(), 300000), grad_sq_sum(g.data(), 300000));
}

// The offload worker's fused pass: the same accumulated values and the same sum, bit for bit, as
// accumulating and then measuring (several chunks, so the chunked order matters).
TEST(ClipNorm, AccumulateAndSqSumEqualsTwoPasses) {
  const int64_t n = 300001;
  std::vector<float> base(n), addend(n);
  for (int64_t i = 0; i < n; ++i) {
    base[i] = 0.001f * static_cast<float>((i * 37) % 101) - 0.05f;
    addend[i] = 0.01f * static_cast<float>((i * 53) % 89) - 0.4f;
  }
  std::vector<float> two = base, one = base;
  for (int64_t i = 0; i < n; ++i) two[i] += addend[i] * 0.5f;
  const double want = grad_sq_sum(two.data(), n);
  EXPECT_EQ(accumulate_and_sq_sum(one.data(), addend.data(), 0.5f, n), want);
  EXPECT_EQ(one, two);

  // fp16 loss scaling: the same as accumulating, DynamicLossScaler::unscale, then measuring; an
  // overflow anywhere (here in the third chunk) is reported.
  LossScalerConfig config;
  config.init_scale = 1024.0f;
  const DynamicLossScaler scaler(config);
  for (const bool overflow : {false, true}) {
    SCOPED_TRACE(overflow ? "with an inf" : "finite");
    std::vector<float> add = addend;
    if (overflow) add[150000] = std::numeric_limits<float>::infinity();
    std::vector<float> sep = base, fused = base;
    for (int64_t i = 0; i < n; ++i) sep[i] += add[i] * 0.5f;
    const bool sep_found = scaler.unscale(sep.data(), n);
    const double sep_sum = grad_sq_sum(sep.data(), n);
    bool found = !overflow;  // overwritten
    const double sum = accumulate_and_sq_sum(fused.data(), add.data(), 0.5f, n, scaler.inv_scale(), &found);
    EXPECT_EQ(found, overflow);
    EXPECT_EQ(sep_found, overflow);
    EXPECT_EQ(0, std::memcmp(sep.data(), fused.data(), n * sizeof(float)));
    if (!overflow) EXPECT_EQ(sum, sep_sum);
    if (overflow) EXPECT_TRUE(std::isinf(sum));
  }
}

}  // namespace
}  // namespace fsdpq
