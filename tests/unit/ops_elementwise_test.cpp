#include "ops/elementwise.h"
#include "ops_test_support.h"

#include <fmt/format.h>
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

// copy_block between column blocks of wider matrices: every element of the block scaled and rounded
// once into its place, every element outside it untouched.
TEST(OpsElementwise, CopyBlockWritesOnlyItsColumns) {
  for (DType dst_type : {DType::F32, DType::BF16, DType::F16})
    for (float scale : {1.0f, 0.375f}) {
      SCOPED_TRACE(fmt::format("{} scale {}", dtype_name(dst_type), scale));
      const Tensor src = random_tensor(Shape{7, 13}, DType::BF16, 110);
      Tensor dst = random_tensor(Shape{7, 20}, dst_type, 111);
      const std::vector<double> before = to_doubles(dst);
      copy_block(MatrixView(dst.view(), 5, 9), MatrixView(src.view(), 3, 9), scale);
      for (int64_t r = 0; r < 7; ++r)
        for (int64_t c = 0; c < 20; ++c) {
          const int64_t at = r * 20 + c;
          float want = static_cast<float>(before[static_cast<size_t>(at)]);
          if (c >= 5 && c < 14) {
            Tensor one = Tensor::empty(Shape{1}, dst_type);
            TensorView rounded = one.view();
            store_f32(rounded, 0, load_f32(src.view(), r * 13 + c - 5 + 3) * scale);
            want = load_f32(rounded, 0);
          }
          EXPECT_EQ(load_f32(dst.view(), at), want) << "row " << r << " column " << c;
        }
    }
  Tensor a = random_tensor(Shape{4, 8}, DType::F32, 112), b = random_tensor(Shape{4, 8}, DType::F32, 113);
  EXPECT_THROW(copy_block(MatrixView(a.view(), 4, 5), MatrixView(b.view(), 0, 5)), std::logic_error);  // past the end
  EXPECT_THROW(copy_block(MatrixView(a.view(), 0, 3), MatrixView(b.view(), 0, 4)), std::logic_error);  // sizes differ
}

// copy_blocks gives copy_block's bits, block by block, whatever the types and scales.
TEST(OpsElementwise, CopyBlocksEqualsCopyBlockOneByOne) {
  const Tensor src16 = random_tensor(Shape{6, 24}, DType::BF16, 114), src32 = random_tensor(Shape{6, 10}, DType::F32, 115);
  Tensor want = random_tensor(Shape{6, 40}, DType::BF16, 116), want32 = random_tensor(Shape{6, 12}, DType::F32, 117);
  Tensor got = random_tensor(Shape{6, 40}, DType::BF16, 116), got32 = random_tensor(Shape{6, 12}, DType::F32, 117);
  const auto blocks = [&](Tensor& dst, Tensor& dst32) {
    return std::vector<BlockCopy>{{MatrixView(dst.view(), 0, 8), MatrixView(src16.view(), 16, 8)},
                                  {MatrixView(dst.view(), 8, 16), MatrixView(src16.view(), 0, 16), 0.375f},
                                  {MatrixView(dst32.view(), 2, 10), src32, 1.5f},
                                  {MatrixView(dst.view(), 30, 10), src32}};
  };
  for (const BlockCopy& c : blocks(want, want32)) copy_block(c.dst, c.src, c.scale);
  copy_blocks(blocks(got, got32));
  EXPECT_EQ(to_doubles(got), to_doubles(want));
  EXPECT_EQ(to_doubles(got32), to_doubles(want32));
  const std::vector<BlockCopy> wrong{{MatrixView(got.view(), 0, 8), MatrixView(src16.view(), 0, 9)}};
  EXPECT_THROW(copy_blocks(wrong), std::logic_error);  // sizes differ
}

TEST(OpsElementwise, MismatchedSizesAreALogicError) {
  Tensor a = random_tensor(Shape{4}, DType::F32, 107), b = random_tensor(Shape{5}, DType::F32, 108);
  EXPECT_THROW(residual_add(a, a, b), std::logic_error);
  Tensor bf = random_tensor(Shape{4}, DType::BF16, 109);
  EXPECT_THROW(accumulate(bf, a), std::logic_error);  // the accumulator must be F32
}

}  // namespace
}  // namespace fsdpq
