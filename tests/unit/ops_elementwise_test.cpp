#include "ops/elementwise.h"
#include "ops_test_support.h"

#include <gtest/gtest.h>

namespace fsdpq {
namespace {

using test::random_tensor;
using test::to_doubles;

TEST(OpsElementwise, ResidualAddRoundsOnceAndMayAlias) {
  Tensor a = random_tensor(Shape{3, 41}, DType::BF16, 101);
  Tensor b = random_tensor(Shape{3, 41}, DType::BF16, 102);
  Tensor out = Tensor::empty(a.shape(), DType::BF16);
  residual_add(out, a, b);
  for (int64_t i = 0; i < a.numel(); ++i)
    EXPECT_EQ(load_f32(out.view(), i), round_bf16(load_f32(a.view(), i) + load_f32(b.view(), i)));
  residual_add(a, a, b);  // in place
  EXPECT_EQ(to_doubles(a), to_doubles(out));
}

TEST(OpsElementwise, ScaleAccumulateAddScaledConvert) {
  Tensor x = random_tensor(Shape{50}, DType::BF16, 103);
  const std::vector<double> x0 = to_doubles(x);

  Tensor acc = random_tensor(Shape{50}, DType::F32, 104);
  const std::vector<double> acc0 = to_doubles(acc);
  accumulate(acc, x);
  for (size_t i = 0; i < 50; ++i) EXPECT_EQ(acc.data<float>()[i], static_cast<float>(acc0[i]) + static_cast<float>(x0[i]));

  Tensor y = random_tensor(Shape{50}, DType::BF16, 105);
  const std::vector<double> y0 = to_doubles(y);
  add_scaled(y, x, 0.25f);
  for (size_t i = 0; i < 50; ++i)
    EXPECT_EQ(load_f32(y.view(), static_cast<int64_t>(i)),
              round_bf16(static_cast<float>(y0[i]) + 0.25f * static_cast<float>(x0[i])));

  scale_in_place(x, 3.0f);
  for (size_t i = 0; i < 50; ++i)
    EXPECT_EQ(load_f32(x.view(), static_cast<int64_t>(i)), round_bf16(static_cast<float>(x0[i]) * 3.0f));

  Tensor f = random_tensor(Shape{50}, DType::F32, 106);
  Tensor h = Tensor::empty(Shape{50}, DType::BF16);
  copy_convert(h, f);
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(load_f32(h.view(), i), round_bf16(f.data<float>()[i]));

  double want = 0.0;
  for (int64_t i = 0; i < 50; ++i) want += static_cast<double>(f.data<float>()[i]) * f.data<float>()[i];
  EXPECT_NEAR(sum_of_squares(f), want, 1e-12 * want);

  fill_zero(f);
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(f.data<float>()[i], 0.0f);
}

TEST(OpsElementwise, MismatchedSizesAreALogicError) {
  Tensor a = random_tensor(Shape{4}, DType::F32, 107), b = random_tensor(Shape{5}, DType::F32, 108);
  EXPECT_THROW(residual_add(a, a, b), std::logic_error);
  Tensor bf = random_tensor(Shape{4}, DType::BF16, 109);
  EXPECT_THROW(accumulate(bf, a), std::logic_error);  // the accumulator must be F32
}

}  // namespace
}  // namespace fsdpq
