#include "quant/dynamic_code.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace fsdpq {
namespace {

// torch.linspace(start, end, steps, dtype=float32) on the CPU (RangeFactoriesKernel.cpp): the
// step is computed in fp32, the first half counts up from `start`, the second half down from
// `end`, so both ends are exact. torch's x86 build contracts `start + step * i` into a fused
// multiply-add (one rounding); with two roundings 42 of the 256 code values come out one ulp off
// (checked against bitsandbytes 0.50.2 / torch 2.11, see docs/nf4.md).
std::vector<float> linspace_f32(float start, float end, int64_t steps) {
  const float step = (end - start) / static_cast<float>(steps - 1);
  const int64_t halfway = steps / 2;
  std::vector<float> values(static_cast<size_t>(steps));
  for (int64_t i = 0; i < steps; ++i)
    values[static_cast<size_t>(i)] =
        i < halfway ? std::fma(step, static_cast<float>(i), start)
                    : std::fma(-step, static_cast<float>(steps - i - 1), end);
  return values;
}

std::array<float, 256> make_dynamic_code_signed() {
  // Exponent level i (0..6) contributes 2^i fraction values: the means of neighbouring points of
  // linspace(0.1, 1, 2^i + 1), scaled by 10^(i-6). Python multiplies the fp32 tensor by a Python
  // float, which torch rounds to fp32 first; these literals are those powers of ten.
  constexpr double kPowersOfTen[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::vector<float> values;
  values.reserve(256);
  for (int i = 0; i < 7; ++i) {
    const std::vector<float> bounds = linspace_f32(0.1f, 1.0f, (int64_t{1} << i) + 1);
    const float scale = static_cast<float>(kPowersOfTen[i]);
    for (size_t k = 0; k + 1 < bounds.size(); ++k) {
      const float mean = (bounds[k] + bounds[k + 1]) / 2.0f;
      values.push_back(scale * mean);
      values.push_back(-(scale * mean));
    }
  }
  values.push_back(0.0f);
  values.push_back(1.0f);
  if (values.size() != 256) throw std::logic_error("dynamic code must have 256 entries");
  std::sort(values.begin(), values.end());
  std::array<float, 256> code{};
  std::copy(values.begin(), values.end(), code.begin());
  return code;
}

// bitsandbytes' CUDA library is built with --use_fast_math: fp32 subnormals flush to zero.
inline float flush_subnormal(float x) { return std::fabs(x) < FLT_MIN ? std::copysign(0.0f, x) : x; }

}  // namespace

const std::array<float, 256>& dynamic_code_signed() {
  static const std::array<float, 256> code = make_dynamic_code_signed();
  return code;
}

uint8_t dynamic_code_quantize(const std::array<float, 256>& code, float x) {
  // Binary descent over the 127 odd indices (an implicit search tree rooted at 127); it ends on an
  // even index p with code[p-1] < x <= code[p+1], so the nearest value is one of those three.
  int p = 127;
  for (int step = 64; step > 0; step >>= 1) p += x > code[p] ? step : -step;
  if (x > code[p]) {
    const float midpoint = (code[p + 1] + code[p]) * 0.5f;
    return static_cast<uint8_t>(x > midpoint ? p + 1 : p);
  }
  const int lower = p == 0 ? 0 : p - 1;
  const float midpoint = (code[lower] + code[p]) * 0.5f;
  return static_cast<uint8_t>(x < midpoint ? lower : p);
}

void dynamic8_quantize_blockwise(const float* x, int64_t n, int64_t blocksize, uint8_t* q,
                                 float* absmax) {
  if (blocksize <= 0) throw std::logic_error("dynamic8_quantize_blockwise: blocksize must be > 0");
  const std::array<float, 256>& code = dynamic_code_signed();
  const int64_t blocks = (n + blocksize - 1) / blocksize;
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * blocksize;
    const int64_t valid = std::min(blocksize, n - begin);
    // On the GPU a short block's zero padding takes part in the max reduction (it only matters
    // when every real value is NaN, which fmax skips).
    float amax = valid < blocksize ? 0.0f : -FLT_MAX;
    for (int64_t i = 0; i < valid; ++i)
      amax = std::fmax(amax, std::fabs(flush_subnormal(x[begin + i])));
    absmax[b] = amax;
    const float inv = flush_subnormal(1.0f / amax);  // bitsandbytes multiplies by the reciprocal
    for (int64_t i = 0; i < valid; ++i)
      q[begin + i] = dynamic_code_quantize(code, flush_subnormal(x[begin + i]) * inv);
  }
}

void dynamic8_dequantize_blockwise(const uint8_t* q, const float* absmax, int64_t n,
                                   int64_t blocksize, float* out) {
  if (blocksize <= 0)
    throw std::logic_error("dynamic8_dequantize_blockwise: blocksize must be > 0");
  const std::array<float, 256>& code = dynamic_code_signed();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    out[i] = flush_subnormal(code[q[i]] * flush_subnormal(absmax[i / blocksize]));
}

}  // namespace fsdpq
