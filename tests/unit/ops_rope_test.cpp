#include "backend/cuda_backend.h"
#include "ops/rope.h"
#include "ops_test_support.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

namespace fsdpq {
namespace {

using test::random_tensor;
using test::to_doubles;

TEST(OpsRope, DefaultInverseFrequencies) {
  const RopeTable table = make_rope_table(128, 16, 10000.0);
  ASSERT_EQ(table.inv_freq.size(), 64u);
  for (int i = 0; i < 64; ++i) {
    const double want = 1.0 / std::pow(10000.0, 2.0 * i / 128.0);
    EXPECT_NEAR(table.inv_freq[static_cast<size_t>(i)], want, 2e-6 * want) << i;
  }
  EXPECT_EQ(table.inv_freq[0], 1.0f);
}

TEST(OpsRope, Llama3ScalingMatchesHandComputedValues) {
  // Llama 3.1: theta 500000, factor 8, low_freq_factor 1, high_freq_factor 4, original context 8192.
  // Values computed by hand (in double) from transformers' _compute_llama3_parameters:
  // wavelen = 2π/f; wavelen < 2048 keeps f, wavelen > 8192 gives f/8, and in between
  // s = (8192/wavelen - 1) / 3 blends (1 - s)·f/8 + s·f.
  RopeScalingParams llama3;
  llama3.type = RopeScalingParams::Type::Llama3;
  const RopeTable table = make_rope_table(128, 16, 500000.0, llama3);
  struct Expected {
    int index;
    double value;
  };
  for (Expected e : {Expected{0, 1.0},                       // high frequency: unchanged
                     Expected{20, 0.016560440080994446},     // high frequency: unchanged
                     Expected{28, 0.0032114459947525913},    // wavelen 1956 < 2048: unchanged
                     Expected{30, 0.0013718935677611381},    // wavelen 2948: blended
                     Expected{31, 0.0008567514129196321},    // wavelen 3619: blended
                     Expected{40, 3.428102195952591e-05},    // wavelen 22911 > 8192: divided by 8
                     Expected{63, 3.068925988914511e-07}}) { // divided by 8
    EXPECT_NEAR(table.inv_freq[static_cast<size_t>(e.index)], e.value, 1e-5 * e.value) << e.index;
  }
  // Every index against the formula evaluated in double.
  for (int i = 0; i < 64; ++i) {
    const double f = 1.0 / std::pow(500000.0, 2.0 * i / 128.0);
    const double wavelen = 2 * std::numbers::pi / f;
    double want = f;
    if (wavelen > 8192.0) want = f / 8.0;
    if (wavelen >= 2048.0 && wavelen <= 8192.0) {
      const double s = (8192.0 / wavelen - 1.0) / 3.0;
      want = (1 - s) * f / 8.0 + s * f;
    }
    EXPECT_NEAR(table.inv_freq[static_cast<size_t>(i)], want, 1e-5 * want) << i;
  }
}

TEST(OpsRope, TablesHoldTheHalfSplitLayout) {
  const int64_t D = 8, P = 40;
  const RopeTable table = make_rope_table(D, P, 10000.0);
  const float* cos_table = table.cos.data<float>();
  const float* sin_table = table.sin.data<float>();
  for (int64_t p = 0; p < P; ++p)
    for (int64_t i = 0; i < D / 2; ++i) {
      const double angle = static_cast<double>(p) * table.inv_freq[static_cast<size_t>(i)];
      EXPECT_EQ(cos_table[p * D + i], cos_table[p * D + i + D / 2]);
      EXPECT_EQ(sin_table[p * D + i], sin_table[p * D + i + D / 2]);
      EXPECT_NEAR(cos_table[p * D + i], std::cos(angle), 1e-6 * (1 + std::abs(angle)));
      EXPECT_NEAR(sin_table[p * D + i], std::sin(angle), 1e-6 * (1 + std::abs(angle)));
    }
}

TEST(OpsRope, ForwardIsAPerPairRotation) {
  const int64_t B = 2, T = 5, heads = 3, D = 8, offset = 3;
  const RopeTable table = make_rope_table(D, 16, 10000.0);
  Tensor x = random_tensor(Shape{B, T, heads, D}, DType::F32, 31);
  const std::vector<double> before = to_doubles(x);
  rope_forward(x, table, offset);
  const std::vector<double> after = to_doubles(x);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < D / 2; ++i) {
          const size_t base = static_cast<size_t>(((b * T + t) * heads + h) * D);
          const double angle = static_cast<double>(offset + t) * table.inv_freq[static_cast<size_t>(i)];
          const double x1 = before[base + i], x2 = before[base + i + D / 2];
          EXPECT_NEAR(after[base + i], x1 * std::cos(angle) - x2 * std::sin(angle), 2e-6);
          EXPECT_NEAR(after[base + i + D / 2], x2 * std::cos(angle) + x1 * std::sin(angle), 2e-6);
        }
}

TEST(OpsRope, Bf16IsTheFp32ResultRoundedOnce) {
  const RopeTable table = make_rope_table(16, 8, 10000.0);
  Tensor x16 = random_tensor(Shape{1, 8, 2, 16}, DType::BF16, 32);
  Tensor x32 = Tensor::empty(x16.shape(), DType::F32);
  for (int64_t i = 0; i < x16.numel(); ++i) x32.data<float>()[i] = load_f32(x16.view(), i);
  rope_forward(x16, table);
  rope_forward(x32, table);
  for (int64_t i = 0; i < x16.numel(); ++i) EXPECT_EQ(load_f32(x16.view(), i), round_bf16(x32.data<float>()[i]));
}

TEST(OpsRope, BackwardMatchesFiniteDifferencesAndInvertsTheForward) {
  const int64_t D = 8;
  const RopeTable table = make_rope_table(D, 32, 10000.0);
  Tensor x = random_tensor(Shape{2, 4, 2, D}, DType::F32, 33);
  Tensor y = Tensor::empty(x.shape(), DType::F32);
  const std::vector<double> w = test::random_weights(x.numel(), 34);
  auto loss = [&] {
    std::copy(x.data<float>(), x.data<float>() + x.numel(), y.data<float>());
    rope_forward(y, table, 5);
    return test::weighted_sum(y, w);
  };
  const std::vector<double> numeric = test::numerical_gradient(x, loss, 1e-2f);
  Tensor dx = Tensor::empty(x.shape(), DType::F32);
  for (int64_t i = 0; i < x.numel(); ++i) dx.data<float>()[i] = static_cast<float>(w[static_cast<size_t>(i)]);
  rope_backward(dx, table, 5);
  EXPECT_LE(test::relative_error(to_doubles(dx), numeric), 1e-4);

  // A rotation's transpose is its inverse.
  std::copy(x.data<float>(), x.data<float>() + x.numel(), y.data<float>());
  rope_forward(y, table, 5);
  rope_backward(y, table, 5);
  EXPECT_LE(test::max_abs_diff(to_doubles(y), to_doubles(x)), 1e-6);
}

TEST(OpsRope, PositionsBeyondTheTableAreALogicError) {
  const RopeTable table = make_rope_table(8, 4, 10000.0);
  Tensor x = random_tensor(Shape{1, 3, 1, 8}, DType::F32, 35);
  EXPECT_NO_THROW(rope_forward(x, table, 1));
  EXPECT_THROW(rope_forward(x, table, 2), std::logic_error);
  Tensor wrong_dim = random_tensor(Shape{1, 3, 1, 6}, DType::F32, 36);
  EXPECT_THROW(rope_forward(wrong_dim, table), std::logic_error);
}

// Packed rows: per-token positions restart at 0 with each example.
TEST(OpsRope, PerTokenPositionsRotateEachTokenAtItsOwnPosition) {
  const int64_t B = 2, T = 6, heads = 3, D = 16;
  const RopeTable table = make_rope_table(D, 8, 10000.0);
  Tensor x = random_tensor(Shape{B, T, heads, D}, DType::BF16, 37);
  Tensor positions = Tensor::empty(Shape{B, T}, DType::I32);
  const int32_t given[B * T] = {0, 1, 2, 0, 1, 0, /* row 1: */ 0, 1, 2, 3, 4, 5};
  std::copy(given, given + B * T, positions.data<int32_t>());
  Tensor packed = copy_to(x, Device::CPU);
  rope_forward(packed, table, 1, positions);
  const int64_t width = heads * D;
  for (int64_t token = 0; token < B * T; ++token) {
    // The token alone, at offset 1 + its position: the same bits.
    Tensor alone = Tensor::empty(Shape{1, 1, heads, D}, DType::BF16);
    std::copy_n(x.data<uint16_t>() + token * width, width, alone.data<uint16_t>());
    rope_forward(alone, table, 1 + given[token]);
    for (int64_t i = 0; i < width; ++i)
      EXPECT_EQ(packed.data<uint16_t>()[token * width + i], alone.data<uint16_t>()[i]) << "token " << token;
  }
  // Row 1's positions are 0..T-1: what the op does without positions.
  Tensor plain = copy_to(x, Device::CPU);
  rope_forward(plain, table, 1);
  for (int64_t i = T * width; i < 2 * T * width; ++i) EXPECT_EQ(packed.data<uint16_t>()[i], plain.data<uint16_t>()[i]);
  // The backward undoes the forward at the same positions.
  Tensor y = random_tensor(Shape{B, T, heads, D}, DType::F32, 38), back = copy_to(y, Device::CPU);
  rope_forward(back, table, 0, positions);
  rope_backward(back, table, 0, positions);
  EXPECT_LE(test::max_abs_diff(to_doubles(back), to_doubles(y)), 1e-6);
}

TEST(OpsRope, BadPerTokenPositionsAreLogicErrors) {
  const RopeTable table = make_rope_table(8, 4, 10000.0);
  Tensor x = random_tensor(Shape{1, 3, 1, 8}, DType::F32, 39);
  Tensor positions = Tensor::empty(Shape{1, 3}, DType::I32);
  const int32_t ok[] = {0, 1, 3}, beyond[] = {0, 1, 4}, negative[] = {0, -1, 0};
  std::copy(ok, ok + 3, positions.data<int32_t>());
  EXPECT_NO_THROW(rope_forward(x, table, 0, positions));
  EXPECT_THROW(rope_forward(x, table, 1, positions), std::logic_error);  // 1 + 3 is past the table
  std::copy(beyond, beyond + 3, positions.data<int32_t>());
  EXPECT_THROW(rope_forward(x, table, 0, positions), std::logic_error);
  std::copy(negative, negative + 3, positions.data<int32_t>());
  EXPECT_THROW(rope_backward(x, table, 0, positions), std::logic_error);
  EXPECT_THROW(rope_forward(x, table, 0, Tensor::empty(Shape{1, 2}, DType::I32)), std::logic_error);
}

}  // namespace
}  // namespace fsdpq
