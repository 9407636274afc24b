// bfloat16 and float16 conversions on the host, bit-identical to the GPU's conversions
// (__float2bfloat16 / __float2half: round to nearest, ties to even; NaN stays NaN).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

namespace fsdpq {

using bf16_bits = uint16_t;

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline bf16_bits float_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // round to nearest even
  // A select, not a branch, so that loops storing bf16 vectorise.
  return static_cast<bf16_bits>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
inline float bf16_to_float(bf16_bits b) { return bits_float(static_cast<uint32_t>(b) << 16); }
// Rounds a float to the nearest bf16 value, kept as float (what "compute in fp32, store bf16" does).
inline float round_bf16(float f) { return bf16_to_float(float_to_bf16(f)); }

// IEEE half precision, round to nearest even, with subnormals.
inline uint16_t float_to_f16(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow → inf
  if (abs < 0x38800000u) {  // subnormal or zero in half
    float a = bits_float(abs);
    // 2^-24 is the half subnormal unit: round a / 2^-24 to nearest even.
    float scaled = a * 16777216.0f;
    float r = std::nearbyint(scaled);  // default rounding mode: to nearest even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xfffu + mant_odd;
  abs -= 0x38000000u;  // rebias exponent 127 → 15
  return static_cast<uint16_t>(sign | (abs >> 13));
}
inline float f16_to_float(uint16_t h) {
  uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(mant) * 5.9604644775390625e-08f;  // mant · 2^-24, exact
    return sign ? -v : v;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// f16_to_float(float_to_f16(x)) without leaving float (a solver's inner loop, quant/hqq.cpp): the
// same value for every float but NaN payloads (checked for all 2^32 inputs when it was written).
// Normal halves: the float rounded to 10 mantissa bits, ties to even, inf past 65504; below
// 2^-14: the nearest multiple of 2^-24, ties to even.
inline float round_f16(float x) {
  const uint32_t bits = float_bits(x), abs = bits & 0x7fffffffu;
  if (abs >= 0x38800000u) {
    if (abs >= 0x7f800000u) return x;  // inf and NaN stay
    const uint32_t rounded = (abs + 0xfffu + ((abs >> 13) & 1u)) & ~0x1fffu;
    return bits_float((bits & 0x80000000u) | (rounded >= 0x47800000u ? 0x7f800000u : rounded));
  }
  const float units = bits_float(abs) * 16777216.0f;              // |x| / 2^-24, exact, < 2^10
  const float whole = (units + 12582912.0f) - 12582912.0f;        // + 1.5 · 2^23: to nearest even
  return std::copysign(whole * 5.9604644775390625e-08f, x);
}

}  // namespace fsdpq
