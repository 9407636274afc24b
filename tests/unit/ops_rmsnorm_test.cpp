#include "ops/rmsnorm.h"
#include "ops_test_support.h"

#include <gtest/gtest.h>

#include <cmath>

namespace fsdpq {
namespace {

using test::random_tensor;
using test::to_doubles;

constexpr float kEps = 1e-5f;

// y = w * x / sqrt(mean(x²) + eps), all in double.
std::vector<double> naive_rmsnorm(const TensorView& x, const TensorView& w) {
  const int64_t C = w.numel(), rows = x.numel() / C;
  std::vector<double> y(static_cast<size_t>(x.numel()));
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += std::pow(load_f32(x, r * C + c), 2);
    const double inv = 1.0 / std::sqrt(ss / C + kEps);
    for (int64_t c = 0; c < C; ++c)
      y[static_cast<size_t>(r * C + c)] = load_f32(w, c) * load_f32(x, r * C + c) * inv;
  }
  return y;
}

TEST(OpsRmsNorm, ForwardF32MatchesNaiveFormula) {
  const int64_t C = 37;
  Tensor x = random_tensor(Shape{2, 3, C}, DType::F32, 11, -2.0f, 2.0f);
  Tensor w = random_tensor(Shape{C}, DType::F32, 12, 0.5f, 1.5f);
  Tensor y = Tensor::empty(x.shape(), DType::F32);
  Tensor rstd = Tensor::empty(Shape{6}, DType::F32);
  rmsnorm_forward(y, rstd, x, w, kEps);
  // fp32 math against double: a few fp32 ulps on values of order 1.
  EXPECT_LE(test::max_abs_diff(to_doubles(y), naive_rmsnorm(x, w)), 2e-6 * 4);
  for (int64_t r = 0; r < 6; ++r) {
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += std::pow(load_f32(x.view(), r * C + c), 2);
    EXPECT_NEAR(rstd.data<float>()[r], 1.0 / std::sqrt(ss / C + kEps), 1e-6 * rstd.data<float>()[r]);
  }
}

TEST(OpsRmsNorm, ForwardBf16RoundsTheNormalizedValueBeforeTheWeight) {
  // HF: y = weight * n.to(bf16), n = x * rsqrt(mean(x²) + eps): two roundings to bf16.
  const int64_t C = 64, rows = 5;
  Tensor x = random_tensor(Shape{rows, C}, DType::BF16, 13, -3.0f, 3.0f);
  Tensor w = random_tensor(Shape{C}, DType::BF16, 14, 0.5f, 1.5f);
  Tensor y = Tensor::empty(x.shape(), DType::BF16);
  Tensor rstd = Tensor::empty(Shape{rows}, DType::F32);
  rmsnorm_forward(y, rstd, x, w, kEps);
  int exact = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t c = 0; c < C; ++c) ss += std::pow(load_f32(x.view(), r * C + c), 2);
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / C + kEps));
    for (int64_t c = 0; c < C; ++c) {
      const float n = round_bf16(load_f32(x.view(), r * C + c) * inv);
      const float want = round_bf16(load_f32(w.view(), c) * n);
      const float got = load_f32(y.view(), r * C + c);
      // rstd may differ from the double reference in its last fp32 bit, which can move n across a
      // bf16 rounding boundary: allow one bf16 ulp per rounding, and expect nearly all exact.
      EXPECT_TRUE(test::within_bf16_ulps(got, want, 2.0)) << got << " vs " << want;
      exact += got == want;
    }
  }
  EXPECT_GE(exact, rows * C * 95 / 100);
}

TEST(OpsRmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t C = 16, rows = 6;
  Tensor x = random_tensor(Shape{2, 3, C}, DType::F32, 15, -2.0f, 2.0f);
  Tensor w = random_tensor(Shape{C}, DType::F32, 16, 0.5f, 1.5f);
  Tensor y = Tensor::empty(x.shape(), DType::F32);
  Tensor rstd = Tensor::empty(Shape{rows}, DType::F32);
  const std::vector<double> dy_values = test::random_weights(rows * C, 17);
  auto loss = [&] {
    rmsnorm_forward(y, rstd, x, w, kEps);
    return test::weighted_sum(y, dy_values);
  };
  const std::vector<double> numeric_dx = test::numerical_gradient(x, loss, 1e-2f);
  const std::vector<double> numeric_dw = test::numerical_gradient(w, loss, 1e-2f);

  rmsnorm_forward(y, rstd, x, w, kEps);
  Tensor dy = Tensor::empty(x.shape(), DType::F32);
  for (int64_t i = 0; i < rows * C; ++i) dy.data<float>()[i] = static_cast<float>(dy_values[static_cast<size_t>(i)]);
  Tensor dx = Tensor::empty(x.shape(), DType::F32);
  Tensor dw = random_tensor(Shape{C}, DType::F32, 18);  // accumulated onto
  const std::vector<double> dw_before = to_doubles(dw);
  rmsnorm_backward(dx, dw, dy, x, w, rstd);
  std::vector<double> dw_added = to_doubles(dw);
  for (size_t c = 0; c < dw_added.size(); ++c) dw_added[c] -= dw_before[c];

  EXPECT_LE(test::relative_error(to_doubles(dx), numeric_dx), 1e-3);
  EXPECT_LE(test::relative_error(dw_added, numeric_dw), 1e-3);
}

TEST(OpsRmsNorm, BackwardAllowsDxToAliasDy) {
  const int64_t C = 80, rows = 3;  // C spans two column blocks of the dweight pass
  Tensor x = random_tensor(Shape{rows, C}, DType::BF16, 19);
  Tensor w = random_tensor(Shape{C}, DType::BF16, 20);
  Tensor y = Tensor::empty(x.shape(), DType::BF16);
  Tensor rstd = Tensor::empty(Shape{rows}, DType::F32);
  rmsnorm_forward(y, rstd, x, w, kEps);
  Tensor dy = random_tensor(x.shape(), DType::BF16, 21);
  Tensor dy_copy = random_tensor(x.shape(), DType::BF16, 21);
  Tensor dx = Tensor::empty(x.shape(), DType::BF16);
  Tensor dw1 = Tensor::zeros(Shape{C}, DType::F32), dw2 = Tensor::zeros(Shape{C}, DType::F32);
  rmsnorm_backward(dx, dw1, dy, x, w, rstd);
  rmsnorm_backward(dy_copy, dw2, dy_copy, x, w, rstd);
  EXPECT_EQ(to_doubles(dx), to_doubles(dy_copy));
  EXPECT_EQ(to_doubles(dw1), to_doubles(dw2));
}

// A frozen weight (dweight without data) gets no dweight pass; dx is the same bits.
TEST(OpsRmsNorm, BackwardWithoutDweightGivesTheSameDx) {
  const int64_t C = 80, rows = 5;
  Tensor x = random_tensor(Shape{rows, C}, DType::BF16, 22);
  Tensor w = random_tensor(Shape{C}, DType::BF16, 23);
  Tensor y = Tensor::empty(x.shape(), DType::BF16), rstd = Tensor::empty(Shape{rows}, DType::F32);
  rmsnorm_forward(y, rstd, x, w, kEps);
  Tensor dy = random_tensor(x.shape(), DType::F32, 24);
  Tensor dx = Tensor::empty(x.shape(), DType::F32), dx_frozen = Tensor::empty(x.shape(), DType::F32);
  Tensor dw = Tensor::zeros(Shape{C}, DType::F32);
  rmsnorm_backward(dx, dw, dy, x, w, rstd);
  rmsnorm_backward(dx_frozen, TensorView{}, dy, x, w, rstd);
  EXPECT_EQ(to_doubles(dx_frozen), to_doubles(dx));
}

}  // namespace
}  // namespace fsdpq
