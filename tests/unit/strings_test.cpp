#include "util/bf16.h"
#include "util/strings.h"

#include <gtest/gtest.h>

namespace fsdpq {

TEST(Strings, StrictNumberParsing) {
  EXPECT_EQ(parse_int("42"), 42);
  EXPECT_EQ(parse_int(" -7 "), -7);
  EXPECT_FALSE(parse_int("4x"));
  EXPECT_FALSE(parse_int("1.5"));
  EXPECT_FALSE(parse_int(""));
  EXPECT_DOUBLE_EQ(*parse_double("1e-5"), 1e-5);
  EXPECT_FALSE(parse_double("nan"));
  EXPECT_FALSE(parse_double("1e-5x"));
  EXPECT_EQ(parse_bool("Yes"), true);
  EXPECT_EQ(parse_bool("0"), false);
  EXPECT_FALSE(parse_bool("maybe"));
}

TEST(Strings, DidYouMean) {
  std::vector<std::string> keys = {"batch_size", "context_length", "num_epochs", "lora_rank"};
  EXPECT_EQ(closest_match("batch_sise", keys), "batch_size");
  EXPECT_EQ(closest_match("epochs", keys), "num_epochs");
  EXPECT_EQ(closest_match("zzzzzz", keys), "");
}

TEST(Strings, Utf8Validation) {
  EXPECT_TRUE(is_valid_utf8("plain ascii"));
  EXPECT_TRUE(is_valid_utf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("bad \xc3"));             // truncated
  EXPECT_FALSE(is_valid_utf8("bad \xc0\xaf"));         // overlong
  EXPECT_FALSE(is_valid_utf8("bad \xed\xa0\x80"));     // surrogate
  EXPECT_FALSE(is_valid_utf8("bad \xff"));
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(float_to_bf16(bits_float(0x3f808000u)), 0x3f80);
  // 1 + 3*2^-8 is halfway too: rounds up to the even mantissa 0x3f82.
  EXPECT_EQ(float_to_bf16(bits_float(0x3f818000u)), 0x3f82);
  EXPECT_EQ(float_to_bf16(bits_float(0x3f808001u)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_float(float_to_bf16(-2.5f)), -2.5f);
}

TEST(F16, ConvertsWithSubnormalsAndOverflow) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16(70000.0f), 0x7c00);
  EXPECT_EQ(float_to_f16(5.9604645e-8f), 0x0001);  // smallest subnormal
  for (uint32_t h = 0; h < 0x7c00; h += 7) EXPECT_EQ(float_to_f16(f16_to_float(static_cast<uint16_t>(h))), h);
}

}  // namespace fsdpq
