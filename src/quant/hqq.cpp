#include "quant/hqq.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "kernels/hqq_solver.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

// The shrinkage exponent lp_norm - 1 as torch's pow gets it: the Python float -0.3 cast to the
// tensor's dtype (to float16 on the half path: -0.300048828125).
constexpr float kShrinkExponentFloat = -0.3f;

// |x|^(lp_norm - 1) for every non-negative float16 x, as torch computes it on a half tensor:
// powf in fp32, rounded to half. The half solver meets only half inputs, so a table is exact. Kept
// as floats, indexed by the half's bits (half_bits_of).
const std::array<float, 0x7c01>& half_shrink_powers() {
  static const std::array<float, 0x7c01> table = [] {
    std::array<float, 0x7c01> t{};
    const float exponent = round_f16(kShrinkExponentFloat);
    for (uint32_t h = 0; h < t.size(); ++h)  // every finite non-negative half, and +inf
      t[h] = f16_to_float(float_to_f16(std::pow(f16_to_float(static_cast<uint16_t>(h)), exponent)));
    return t;
  }();
  return table;
}

// The half bits of a non-negative float that is a half value (or inf / NaN: 0x7c00, the table's
// last entry, as min(float_to_f16(a), 0x7c00) gives): float_to_f16 without its rounding.
inline uint32_t half_bits_of(float a) {
  const uint32_t bits = float_bits(a);
  if (bits < 0x38800000u) return static_cast<uint32_t>(a * 16777216.0f);  // subnormal half: a / 2^-24
  return std::min<uint32_t>((bits - 0x38000000u) >> 13, 0x7c00u);
}

// std::nearbyint under the default rounding mode (to nearest, ties to even), without the libm
// call in the solver's inner loop: adding and subtracting 1.5 · 2^23 leaves an integer for
// |v| < 2^22; larger values take nearbyint itself.
float nearest_even(float v) {
  if (!(std::fabs(v) < 4194304.0f)) return std::nearbyint(v);
  return std::copysign((v + 12582912.0f) - 12582912.0f, v);
}

// The solver's arithmetic on the CPU (kernels/hqq_solver.h): every operation computed in fp32 and
// rounded to the working precision, as torch's elementwise kernels do for float16 (in fp32 the
// rounding is the operation's own).
struct HostArithmetic {
  bool half;
  const float* powers = half ? half_shrink_powers().data() : nullptr;
  float round(float x) const { return half ? round_f16(x) : x; }
  float shrink_power(float a) const {
    if (!half) return std::pow(a, kShrinkExponentFloat);
    return powers[half_bits_of(a)];
  }
  float nearest_even(float v) const { return fsdpq::nearest_even(v); }
};

float max_code(int n_bits) { return static_cast<float>((1 << n_bits) - 1); }

static_assert(hqq_math::kGroupSize == kHqqGroupSize && hqq_math::kSolverIterations == kHqqSolverIterations);

}  // namespace

std::span<const float> hqq_half_shrink_powers() { return half_shrink_powers(); }

bool hqq_supported_bits(int n_bits) {
  return n_bits == 1 || n_bits == 2 || n_bits == 3 || n_bits == 4 || n_bits == 8;
}

HqqPacking HqqPacking::of(int n_bits, int64_t numel) {
  if (!hqq_supported_bits(n_bits))
    throw std::invalid_argument(fmt::format("hqq packs 1, 2, 3, 4 or 8 bits, not {}", n_bits));
  if (numel % kHqqGroupSize != 0)
    throw std::invalid_argument(
        fmt::format("hqq quantises groups of {} values; {} values are not a whole number of groups", kHqqGroupSize, numel));
  HqqPacking p;
  p.n_bits = n_bits;
  p.groups = numel / kHqqGroupSize;
  if (n_bits == 3) {
    p.slices = 10;
    p.rows = (p.groups + 9) / 10;
    p.word_bytes = 4;
    return p;
  }
  p.slices = 8 / n_bits;
  if (p.groups % p.slices != 0)
    throw std::invalid_argument(fmt::format("hqq packs {} bits from {} groups at a time; {} values make {} groups",
                                            n_bits, p.slices, numel, p.groups));
  p.rows = p.groups / p.slices;
  return p;
}

uint32_t HqqPacking::code(const uint8_t* packed, int64_t g, int64_t j) const {
  const int64_t slice = g / rows, row = g % rows;
  const uint8_t* word = packed + (row * kHqqGroupSize + j) * word_bytes;
  uint32_t w = word[0];
  if (word_bytes == 4) w |= uint32_t{word[1]} << 8 | uint32_t{word[2]} << 16 | uint32_t{word[3]} << 24;
  return (w >> shift(static_cast<int>(slice))) & ((1u << n_bits) - 1u);
}

HqqGroupStart hqq_group_start(const float* values, int n_bits) {
  const hqq_math::Start start = hqq_math::group_start(values, n_bits, HostArithmetic{false});
  return {start.scale, start.zero};
}

HqqGroup hqq_solve_group(const float* values, const HqqGroupStart& start, int n_bits, int updates,
                         HqqSolverPrecision precision, double* errors) {
  const hqq_math::Start solved = hqq_math::solve_group(values, {start.scale, start.zero}, n_bits, updates,
                                                       HostArithmetic{precision == HqqSolverPrecision::kHalf}, errors);
  return {solved.scale, solved.zero};
}

int hqq_zero_updates(std::span<const double> error_sums, int64_t numel, HqqSolverPrecision precision) {
  if (error_sums.size() != static_cast<size_t>(kHqqSolverIterations))
    throw std::logic_error(fmt::format("hqq_zero_updates: {} error sums, expected {}", error_sums.size(), kHqqSolverIterations));
  if (numel <= 0) return kHqqSolverIterations;
  // torch's mean: on the GPU the fp32 sum times fp32(1 / n), rounded to half; on the CPU the
  // fp32 sum divided by n.
  const float inverse = 1.0f / static_cast<float>(numel);
  float best = std::numeric_limits<float>::infinity();
  for (int i = 0; i < kHqqSolverIterations; ++i) {
    const auto sum = static_cast<float>(error_sums[static_cast<size_t>(i)]);
    const float mean = precision == HqqSolverPrecision::kHalf ? round_f16(sum * inverse) : sum / static_cast<float>(numel);
    if (!(mean < best)) return i + 1;  // the update of this iteration was already made
    best = mean;
  }
  return kHqqSolverIterations;
}

// nearest_even, not std::nearbyint: the same rounding without a libm call per value (this runs
// for every value of the model at start-up).
void hqq_group_codes(const float* values, const HqqGroup& group, int n_bits, uint8_t* codes) {
  const float top = max_code(n_bits);
  for (int64_t j = 0; j < kHqqGroupSize; ++j)
    codes[j] = static_cast<uint8_t>(std::clamp(nearest_even(values[j] * group.scale + group.zero), 0.0f, top));
}

uint16_t hqq_meta_bits(float value, DType meta) {
  if (meta == DType::BF16) return float_to_bf16(value);
  if (meta == DType::F16) return float_to_f16(value);
  throw std::logic_error(fmt::format("hqq: zero points and scales are BF16 or F16, not {}", dtype_name(meta)));
}

float hqq_meta_value(uint16_t bits, DType meta) {
  return meta == DType::BF16 ? bf16_to_float(bits) : f16_to_float(bits);
}

HqqGroup hqq_stored(const HqqGroup& group, HqqSolverPrecision precision, DType meta) {
  const HostArithmetic r{precision == HqqSolverPrecision::kHalf};
  const auto keep = [meta](float v) { return hqq_meta_value(hqq_meta_bits(v, meta), meta); };
  return {keep(r.round(1.0f / group.scale)), keep(group.zero)};
}

void hqq_dequantize_groups(const HqqPacking& packing, const uint8_t* packed, const uint16_t* zeros,
                           const uint16_t* scales, DType meta, int64_t first, int64_t count, DType out_dtype, void* out) {
  if (meta != DType::BF16 && meta != DType::F16)
    throw std::logic_error(fmt::format("hqq: zero points and scales are BF16 or F16, not {}", dtype_name(meta)));
  if (out_dtype != DType::F32 && out_dtype != meta)
    throw std::logic_error(fmt::format("hqq: a weight with {} zero points dequantises to {} or F32, not {}",
                                       dtype_name(meta), dtype_name(meta), dtype_name(out_dtype)));
  const auto keep = [meta](float v) { return hqq_meta_value(hqq_meta_bits(v, meta), meta); };
#pragma omp parallel for schedule(static)
  for (int64_t k = 0; k < count; ++k) {
    const int64_t g = first + k;
    const float zero = hqq_meta_value(zeros[g], meta), scale = hqq_meta_value(scales[g], meta);
    for (int64_t j = 0; j < kHqqGroupSize; ++j) {
      const float value = keep(keep(static_cast<float>(packing.code(packed, g, j)) - zero) * scale);
      const int64_t at = k * kHqqGroupSize + j;
      if (out_dtype == DType::F32)
        static_cast<float*>(out)[at] = value;
      else
        static_cast<uint16_t*>(out)[at] = hqq_meta_bits(value, meta);
    }
  }
}

}  // namespace fsdpq
