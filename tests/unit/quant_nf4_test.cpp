// NF4 known answers (worked out by hand from bitsandbytes' code table and decision thresholds),
// round-trip bounds, double quantization and block ranges. The byte-for-byte check against real
// bitsandbytes output is quant_nf4_reference_test.cpp.
#include "quant/nf4.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>
#include <vector>

#include "quant/dynamic_code.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

constexpr uint16_t kBf16NegZero = 0x8000;

// Normal weights like a Llama projection (std 0.02) with a few outliers, as bf16.
std::vector<uint16_t> random_bf16_weights(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint16_t> w(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float v = normal(rng);
    if (i % 997 == 13) v *= 12.0f;
    w[static_cast<size_t>(i)] = float_to_bf16(v);
  }
  return w;
}

uint8_t nibble(const std::vector<uint8_t>& packed, int64_t i) {
  const uint8_t byte = packed[static_cast<size_t>(i / 2)];
  return i % 2 == 0 ? byte >> 4 : byte & 0x0f;
}

double largest_gap(const float* code, int n) {
  double gap = 0.0;
  for (int k = 0; k + 1 < n; ++k) gap = std::max(gap, double(code[k + 1]) - double(code[k]));
  return gap;
}

TEST(Nf4Format, ThresholdsAreTheMidpointsOfTheCode) {
  const auto& code = nf4_code();
  const auto& thresholds = nf4_thresholds();
  EXPECT_EQ(code[0], -1.0f);
  EXPECT_EQ(code[7], 0.0f);
  EXPECT_EQ(code[15], 1.0f);
  for (int k = 0; k < 15; ++k) {
    EXPECT_LT(code[k], code[k + 1]);
    // The kernel's constants are the midpoints written as decimal float literals. Where the
    // exact midpoint falls halfway between two floats (k = 0, 8, 12, 14) the literal's last digit
    // picks the neighbour, so allow half an ulp rather than requiring the double-rounded value.
    const double midpoint = (double(code[k]) + double(code[k + 1])) / 2.0;
    const double half_ulp =
        (double(std::nextafter(thresholds[k], 2.0f)) - double(thresholds[k])) / 2.0;
    EXPECT_LE(std::fabs(double(thresholds[k]) - midpoint), half_ulp) << "threshold " << k;
  }
}

TEST(Nf4Format, ValueRoundingHandComputed) {
  // x at a code value -> that code.
  for (int k = 0; k < 16; ++k) EXPECT_EQ(nf4_quantize_value(nf4_code()[k]), k);
  // Between code values: the nearer one. 0.5 lies between 0.4407 (12) and 0.5626 (13), whose
  // midpoint 0.50166 is above 0.5 -> 12. 0.25: between 0.2461 (10) and 0.3379 (11), midpoint
  // 0.2920 -> 10. 0.125: midpoint of 0.0796 and 0.1609 is 0.1203 < 0.125 -> 9. -0.5: midpoint of
  // -0.5251 and -0.3949 is -0.4600 > -0.5 -> 2. -0.05: midpoint of -0.0911 and 0 is -0.0455 -> 6.
  // 0.04 > 0.03979 (midpoint of 0 and 0.0796) -> 8; 0.03 -> 7.
  EXPECT_EQ(nf4_quantize_value(0.5f), 12);
  EXPECT_EQ(nf4_quantize_value(0.25f), 10);
  EXPECT_EQ(nf4_quantize_value(0.125f), 9);
  EXPECT_EQ(nf4_quantize_value(-0.5f), 2);
  EXPECT_EQ(nf4_quantize_value(-0.05f), 6);
  EXPECT_EQ(nf4_quantize_value(0.04f), 8);
  EXPECT_EQ(nf4_quantize_value(0.03f), 7);
  EXPECT_EQ(nf4_quantize_value(-0.0f), 7);
  // Beyond +-1 (possible after the fp32 reciprocal rounds): the end codes.
  EXPECT_EQ(nf4_quantize_value(1.5f), 15);
  EXPECT_EQ(nf4_quantize_value(-1.5f), 0);
  // NaN (a zero block: 0 * (1/0)) -> every `x > t` is false -> code 0.
  EXPECT_EQ(nf4_quantize_value(std::nanf("")), 0);
}

TEST(Nf4Format, TiesAtThresholdsTakeTheLowerCode) {
  for (int k = 0; k < 15; ++k) {
    const float t = nf4_thresholds()[k];
    EXPECT_EQ(nf4_quantize_value(t), k) << "exactly on threshold " << k;
    EXPECT_EQ(nf4_quantize_value(std::nextafter(t, 2.0f)), k + 1) << "just above threshold " << k;
  }
}

TEST(Nf4Quantize, KnownBlockNibbleOrderAndAbsmax) {
  // One block of 64 fp32 values whose absmax is 1, so the scaled value is the value itself.
  std::vector<float> w(64, 0.0f);
  const float values[] = {1.0f, 0.0f, -1.0f, 0.5f, 0.25f, 0.125f, -0.5f, -0.05f};
  const uint8_t codes[] = {15, 7, 0, 12, 10, 9, 2, 6};
  for (int i = 0; i < 8; ++i) w[i] = values[i];
  const Nf4Tensor t = nf4_quantize(w.data(), 64, {64}, false);
  ASSERT_EQ(t.packed.size(), 32u);
  ASSERT_EQ(t.absmax.size(), 1u);
  EXPECT_EQ(t.absmax[0], 1.0f);
  // Element 2j in the high nibble: (15, 7) -> 0xF7, (0, 12) -> 0x0C, (10, 9) -> 0xA9, (2, 6) -> 0x26.
  EXPECT_EQ(t.packed[0], 0xF7);
  EXPECT_EQ(t.packed[1], 0x0C);
  EXPECT_EQ(t.packed[2], 0xA9);
  EXPECT_EQ(t.packed[3], 0x26);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(nibble(t.packed, i), codes[i]);
  for (int i = 8; i < 64; ++i) EXPECT_EQ(nibble(t.packed, i), 7);  // zeros -> code 7
  EXPECT_FALSE(t.double_quant);
  EXPECT_EQ(t.storage_bytes(), 32 + 4);
}

TEST(Nf4Quantize, ScaledBlockFromBf16) {
  // absmax 2 (held by a negative value): x = v * 0.5. -2 -> -1 (0), 1 -> 0.5 (12),
  // -1 -> -0.5 (2), 0.5 -> 0.25 (10), 1.5 -> 0.75: between 0.7230 and 1 (midpoint 0.8615) -> 14.
  std::vector<uint16_t> w(64, float_to_bf16(0.0f));
  const float values[] = {-2.0f, 1.0f, -1.0f, 0.5f, 1.5f};
  const uint8_t codes[] = {0, 12, 2, 10, 14};
  for (int i = 0; i < 5; ++i) w[i] = float_to_bf16(values[i]);
  const Nf4Tensor t = nf4_quantize(w.data(), 64, {8, 8}, false);
  EXPECT_EQ(t.absmax[0], 2.0f);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(nibble(t.packed, i), codes[i]) << i;
  // Dequantized: code * 2, rounded to bf16. code[14] * 2 = 1.4459136724472046 -> bf16 1.4453125.
  std::vector<uint16_t> out(64);
  nf4_dequantize(t, out.data());
  EXPECT_EQ(bf16_to_float(out[0]), -2.0f);
  EXPECT_EQ(bf16_to_float(out[4]), 1.4453125f);
  EXPECT_EQ(out[1], float_to_bf16(nf4_code()[12] * 2.0f));
}

TEST(Nf4Quantize, ZeroBlockGivesCodeZeroAndNegativeZero) {
  // absmax 0 -> reciprocal inf -> 0 * inf = NaN -> code 0 (-1.0), so every byte is 0x00 and the
  // dequantized value is -1 * 0 = -0 (bitsandbytes produces the same).
  std::vector<uint16_t> w(128, float_to_bf16(0.0f));
  for (int i = 64; i < 128; ++i) w[i] = float_to_bf16(0.01f * (i - 90));
  const Nf4Tensor t = nf4_quantize(w.data(), 128, {128}, false);
  EXPECT_EQ(t.absmax[0], 0.0f);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(t.packed[j], 0x00);
  std::vector<uint16_t> out(128);
  nf4_dequantize(t, out.data());
  for (int i = 0; i < 64; ++i) EXPECT_EQ(out[i], kBf16NegZero);
  std::vector<float> out32(128);
  nf4_dequantize(t, out32.data());
  EXPECT_TRUE(std::signbit(out32[0]) && out32[0] == 0.0f);
}

TEST(Nf4Quantize, TailBlockIsShortAndPaddedWithZero) {
  // 64 + 5 values: the second block has 5; the last byte holds element 68 (high) and a padding
  // zero, quantized as any other zero: code 7 (low nibble).
  std::vector<float> w(69, 0.1f);
  const float tail[] = {0.5f, -0.25f, 1.0f, 0.0f, -1.0f};
  for (int i = 0; i < 5; ++i) w[64 + i] = tail[i];
  const Nf4Tensor t = nf4_quantize(w.data(), 69, {69}, false);
  ASSERT_EQ(t.packed.size(), 35u);  // (69 + 1) / 2
  ASSERT_EQ(t.absmax.size(), 2u);
  EXPECT_EQ(t.absmax[1], 1.0f);  // max over the 5 real values only
  // (0.5 -> 12, -0.25 -> between -0.2844 and -0.1848, midpoint -0.2346 -> 4), (1 -> 15, 0 -> 7),
  // (-1 -> 0, padding -> 7).
  EXPECT_EQ(t.packed[32], 0xC4);
  EXPECT_EQ(t.packed[33], 0xF7);
  EXPECT_EQ(t.packed[34], 0x07);
  std::vector<float> out(69);
  nf4_dequantize(t, out.data());
  EXPECT_EQ(out[66], 1.0f);
  EXPECT_EQ(out[68], -1.0f);

  // An all-zero odd tail: the padding is 0 * inf = NaN too -> the whole byte is 0x00.
  std::vector<float> z(65, 0.3f);
  z[64] = 0.0f;
  const Nf4Tensor tz = nf4_quantize(z.data(), 65, {65}, false);
  EXPECT_EQ(tz.packed[32], 0x00);
}

TEST(Nf4Quantize, SubnormalOnlyBlockIsTreatedAsZero) {
  // The CUDA build uses --use_fast_math (flush to zero): a block of subnormal values has absmax 0.
  std::vector<uint16_t> w(64);
  for (int i = 0; i < 64; ++i) w[i] = static_cast<uint16_t>((i % 2 ? 0x8000 : 0) | (1 + i));
  const Nf4Tensor t = nf4_quantize(w.data(), 64, {64}, false);
  EXPECT_EQ(t.absmax[0], 0.0f);
  EXPECT_EQ(t.packed[0], 0x00);
}

TEST(Nf4Quantize, RoundTripErrorWithinHalfTheLargestCodeGap) {
  const int64_t n = 64 * 500 + 33;
  const std::vector<uint16_t> w = random_bf16_weights(n, 1234);
  const Nf4Tensor t = nf4_quantize(w.data(), n, {n}, false);
  std::vector<uint16_t> deq(static_cast<size_t>(n));
  std::vector<float> deq32(static_cast<size_t>(n));
  nf4_dequantize(t, deq.data());
  nf4_dequantize(t, deq32.data());
  const double half_gap = largest_gap(nf4_code().data(), 16) / 2.0;  // (1 - 0.72296) / 2
  for (int64_t i = 0; i < n; ++i) {
    const double absmax = t.absmax[static_cast<size_t>(i / 64)];
    const double original = bf16_to_float(w[static_cast<size_t>(i)]);
    // fp32 product: nearest code times absmax, up to one fp32 rounding.
    ASSERT_LE(std::fabs(original - deq32[static_cast<size_t>(i)]), absmax * half_gap * (1 + 1e-6))
        << "element " << i;
    // bf16 output: the same value rounded to nearest even.
    ASSERT_EQ(deq[static_cast<size_t>(i)], float_to_bf16(deq32[static_cast<size_t>(i)]));
  }
}

TEST(Nf4DoubleQuant, LayoutOffsetAndDecodeErrorBound) {
  const int64_t n = 64 * 700 + 10;  // 701 blocks -> 3 groups of 256 (the last one short)
  const std::vector<uint16_t> w = random_bf16_weights(n, 99);
  const Nf4Tensor plain = nf4_quantize(w.data(), n, {n}, false);
  const Nf4Tensor dq = nf4_quantize(w.data(), n, {n}, true);
  ASSERT_TRUE(dq.double_quant);
  EXPECT_TRUE(dq.absmax.empty());
  ASSERT_EQ(dq.absmax_q.size(), 701u);
  ASSERT_EQ(dq.absmax_scale.size(), 3u);
  EXPECT_EQ(dq.packed, plain.packed);  // the 4-bit codes do not depend on compress_statistics

  double mean = 0.0;
  for (float a : plain.absmax) mean += a;
  mean /= 701.0;
  EXPECT_NEAR(dq.absmax_offset, mean, 1e-6 * mean);

  // Each group's scale is the largest |absmax - offset| in it.
  for (int g = 0; g < 3; ++g) {
    float largest = 0.0f;
    for (int b = g * 256; b < std::min(701, (g + 1) * 256); ++b)
      largest = std::max(largest, std::fabs(plain.absmax[b] - dq.absmax_offset));
    EXPECT_EQ(dq.absmax_scale[g], largest);
  }

  // Decoded absmax within half the dynamic code's largest gap (times the group scale) of the
  // true one, plus fp32 rounding of the two decode steps.
  const auto& code8 = dynamic_code_signed();
  const double half_gap = largest_gap(code8.data(), 256) / 2.0;
  const std::vector<float> decoded = nf4_absmax(dq);
  for (int b = 0; b < 701; ++b) {
    const double tolerance =
        dq.absmax_scale[b / 256] * half_gap * (1 + 1e-6) + 4 * FLT_EPSILON * dq.absmax_offset;
    ASSERT_NEAR(decoded[b], plain.absmax[b], tolerance) << "block " << b;
    ASSERT_EQ(decoded[b], code8[dq.absmax_q[b]] * dq.absmax_scale[b / 256] + dq.absmax_offset);
  }

  // Dequantization uses the decoded absmax.
  std::vector<float> out(static_cast<size_t>(n));
  nf4_dequantize(dq, out.data());
  for (int64_t i = 0; i < n; i += 37)
    EXPECT_EQ(out[i], nf4_code()[nibble(dq.packed, i)] * decoded[i / 64]);

  // 4 bits per value + 1 byte per 64 values + 4 bytes per 16384 values: ~4.127 bits per value.
  const int64_t big = int64_t{4096} * 4096;
  const double bits_per_value =
      (big / 2 + nf4_num_blocks(big) + 4.0 * nf4_num_blocks(big) / 256 + 4) * 8.0 / big;
  EXPECT_NEAR(bits_per_value, 4.127, 0.001);
}

TEST(Nf4Ranges, RangeQuantizeEqualsWholeTensor) {
  const int64_t n = 64 * 600 + 17;  // 601 blocks, odd tail
  const std::vector<uint16_t> w = random_bf16_weights(n, 7);
  const Nf4Tensor whole = nf4_quantize(w.data(), n, {n}, false);
  std::vector<uint8_t> packed(whole.packed.size(), 0xEE);
  std::vector<float> absmax(whole.absmax.size(), -1.0f);
  // Three shards of unequal size; the last one runs past the end and is cut there.
  const int64_t cuts[][2] = {{0, 100}, {100, 256}, {356, 300}};
  for (const auto& cut : cuts) {
    const int64_t first = cut[0];
    nf4_quantize_blocks(w.data() + first * 64, n, first, cut[1], packed.data() + first * 32,
                        absmax.data() + first);
  }
  EXPECT_EQ(packed, whole.packed);
  EXPECT_EQ(absmax, whole.absmax);

  std::vector<uint16_t> out_whole(static_cast<size_t>(n)), out_ranges(static_cast<size_t>(n));
  nf4_dequantize(whole, out_whole.data());
  for (const auto& cut : cuts)
    nf4_dequantize_blocks(packed.data() + cut[0] * 32, absmax.data() + cut[0], n, cut[0], cut[1],
                          out_ranges.data() + cut[0] * 64);
  EXPECT_EQ(out_ranges, out_whole);

  // Double quantization per group of 256 blocks, with the tensor-wide offset from partial sums.
  const Nf4Tensor dq = nf4_quantize(w.data(), n, {n}, true);
  const double sum = nf4_absmax_partial_sum(absmax.data(), 256) +
                     nf4_absmax_partial_sum(absmax.data() + 256, 601 - 256);
  const float offset = nf4_absmax_offset(sum, 601);
  EXPECT_EQ(offset, dq.absmax_offset);
  std::vector<uint8_t> q(601);
  std::vector<float> scale(3);
  nf4_double_quantize_absmax(absmax.data(), 601, 0, 512, offset, q.data(), scale.data());
  nf4_double_quantize_absmax(absmax.data() + 512, 601, 512, 256, offset, q.data() + 512,
                             scale.data() + 2);
  EXPECT_EQ(q, dq.absmax_q);
  EXPECT_EQ(scale, dq.absmax_scale);
  EXPECT_THROW(nf4_double_quantize_absmax(absmax.data(), 601, 100, 10, offset, q.data(),
                                          scale.data()),
               std::logic_error);
}

TEST(Nf4Ranges, RejectsBadShapesAndRanges) {
  std::vector<float> w(10, 1.0f);
  EXPECT_THROW(nf4_quantize(w.data(), 10, {3, 3}, false), std::logic_error);
  EXPECT_NO_THROW(nf4_quantize(w.data(), 10, {}, false));
  std::vector<uint8_t> packed(5);
  std::vector<float> absmax(1);
  EXPECT_THROW(nf4_quantize_blocks(w.data(), 10, 1, 1, packed.data(), absmax.data()),
               std::logic_error);
}

TEST(Nf4Quantize, Fp32AndBf16InputsAgreeOnBf16Values) {
  const int64_t n = 64 * 40;
  const std::vector<uint16_t> w = random_bf16_weights(n, 5);
  std::vector<float> w32(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) w32[i] = bf16_to_float(w[i]);
  const Nf4Tensor a = nf4_quantize(w.data(), n, {40, 64}, true);
  const Nf4Tensor b = nf4_quantize(w32.data(), n, {40, 64}, true);
  EXPECT_EQ(a.packed, b.packed);
  EXPECT_EQ(a.absmax_q, b.absmax_q);
  EXPECT_EQ(a.absmax_scale, b.absmax_scale);
  EXPECT_EQ(a.absmax_offset, b.absmax_offset);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{40, 64}));
}

}  // namespace
}  // namespace fsdpq
