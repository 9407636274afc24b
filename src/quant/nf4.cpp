#include "quant/nf4.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <stdexcept>
#include <string>

#include "quant/dynamic_code.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

// bitsandbytes' NF4 table (functional.get_4bit_type("nf4")): fp32 values.
constexpr std::array<float, 16> kNf4Code = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

// The constants of dQuantizeNF4's decision tree (csrc/kernels.cu), sorted. Each is the midpoint
// of two neighbouring codes, computed in double and rounded to fp32 by the CUDA compiler; the
// unit tests check that relation.
constexpr std::array<float, 15> kNf4Thresholds = {
    -0.8480964004993439f,  -0.6106329262256622f,  -0.4599952697753906f,
    -0.33967943489551544f, -0.23460740596055984f, -0.13791173323988914f,
    -0.045525018125772476f, 0.03979014977812767f,  0.1202552504837513f,
    0.2035212516784668f,   0.2920137718319893f,   0.3893125355243683f,
    0.5016634166240692f,   0.6427869200706482f,   0.8614784181118011f,
};

// Every comparison of the decision tree is `x > threshold`, so the leaf it reaches is the count
// of thresholds below x. Counting has no branches and vectorizes.
inline uint8_t nf4_code_of(float x) {
  int code = 0;
  for (float threshold : kNf4Thresholds) code += x > threshold ? 1 : 0;
  return static_cast<uint8_t>(code);
}

// bitsandbytes' CUDA library is built with --use_fast_math, so its fp32 arithmetic flushes
// subnormal inputs and results to (signed) zero. Only blocks of tiny values notice.
inline float flush_subnormal(float x) { return std::fabs(x) < FLT_MIN ? x * 0.0f : x; }

struct BlockRange {
  int64_t first_value = 0;  // index of the range's first value in the tensor
  int64_t values = 0;       // values in the range, cut at the tensor's end
};

BlockRange block_range(int64_t numel, int64_t first_block, int64_t num_blocks) {
  if (numel < 0 || first_block < 0 || num_blocks < 0)
    throw std::logic_error("nf4 block range: negative size or offset");
  const int64_t total = nf4_num_blocks(numel);
  if (num_blocks > 0 && first_block >= total)
    throw std::logic_error("nf4 block range starts at block " + std::to_string(first_block) +
                           " of a tensor with " + std::to_string(total) + " blocks");
  const int64_t last_block = std::min(first_block + num_blocks, total);
  BlockRange range;
  range.first_value = first_block * kNf4BlockSize;
  range.values = std::max<int64_t>(0, std::min(last_block * kNf4BlockSize, numel) - range.first_value);
  return range;
}

// Quantizes `n` values whose first one starts a block (so the last block is the only short one).
template <class ToFloat>
void quantize_values(ToFloat value_at, int64_t n, uint8_t* packed, float* absmax) {
  const int64_t blocks = nf4_num_blocks(n);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kNf4BlockSize;
    const int64_t valid = std::min(kNf4BlockSize, n - begin);
    float values[kNf4BlockSize];
    if (valid == kNf4BlockSize) {
      for (int64_t i = 0; i < kNf4BlockSize; ++i) values[i] = flush_subnormal(value_at(begin + i));
    } else {
      for (int64_t i = 0; i < kNf4BlockSize; ++i)
        values[i] = i < valid ? flush_subnormal(value_at(begin + i)) : 0.0f;
    }
    // The GPU reduction of a short block also sees its zero padding; that only matters when
    // every real value is NaN. `a > amax ? a : amax` skips NaN as the GPU's fmaxf does.
    float amax = valid < kNf4BlockSize ? 0.0f : -FLT_MAX;
    for (int64_t i = 0; i < valid; ++i) {
      const float a = std::fabs(values[i]);
      amax = a > amax ? a : amax;
    }
    absmax[b] = amax;
    // bitsandbytes multiplies by the reciprocal (not a division). A zero block gives inf, and
    // 0 * inf = NaN then takes code 0, exactly as on the GPU. The GPU's reciprocal is MUFU.RCP,
    // one ulp off the correctly rounded one for some inputs; see docs/nf4.md for what that can
    // change (nothing, in 75 million values compared).
    const float inv = flush_subnormal(1.0f / amax);
    // Threshold-major counting: each pass is one vector compare over the block.
    float scaled[kNf4BlockSize];
    for (int64_t i = 0; i < kNf4BlockSize; ++i) scaled[i] = values[i] * inv;
    int32_t codes[kNf4BlockSize] = {};
    for (float threshold : kNf4Thresholds)
      for (int64_t i = 0; i < kNf4BlockSize; ++i) codes[i] += scaled[i] > threshold ? 1 : 0;
    // An odd last value shares its byte with a padding zero, quantized like any other value.
    const int64_t bytes = (valid + 1) / 2;
    uint8_t* out = packed + begin / 2;
    for (int64_t j = 0; j < bytes; ++j)
      out[j] = static_cast<uint8_t>(codes[2 * j] << 4 | codes[2 * j + 1]);
  }
}

// Dequantizes `n` values whose first one starts a block. `convert` turns the fp32 product into
// the output type; it is applied to the block's 16 possible products only.
template <class Out, class Convert>
void dequantize_values(const uint8_t* packed, const float* absmax, int64_t n, Out* out,
                       Convert convert) {
  const int64_t blocks = nf4_num_blocks(n);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kNf4BlockSize;
    const int64_t valid = std::min(kNf4BlockSize, n - begin);
    Out table[16];
    const float scale = flush_subnormal(absmax[b]);
    for (int k = 0; k < 16; ++k)
      table[k] = convert(flush_subnormal(kNf4Code[static_cast<size_t>(k)] * scale));
    const uint8_t* in = packed + begin / 2;
    Out* dst = out + begin;
    const int64_t pairs = valid / 2;
    for (int64_t j = 0; j < pairs; ++j) {
      dst[2 * j] = table[in[j] >> 4];
      dst[2 * j + 1] = table[in[j] & 0x0f];
    }
    if (valid % 2 != 0) dst[valid - 1] = table[in[pairs] >> 4];
  }
}

std::vector<int64_t> checked_shape(std::vector<int64_t> shape, int64_t numel) {
  if (numel < 0) throw std::logic_error("nf4_quantize: negative numel");
  if (shape.empty()) return {numel};
  int64_t product = 1;
  for (int64_t d : shape) {
    if (d < 0) throw std::logic_error("nf4_quantize: negative dimension");
    product *= d;
  }
  if (product != numel)
    throw std::logic_error("nf4_quantize: shape has " + std::to_string(product) +
                           " elements, numel is " + std::to_string(numel));
  return shape;
}

template <class Source>
Nf4Tensor quantize_tensor(const Source* src, int64_t numel, std::vector<int64_t> shape,
                          bool double_quant) {
  Nf4Tensor t;
  t.shape = checked_shape(std::move(shape), numel);
  t.numel = numel;
  t.double_quant = double_quant;
  const int64_t blocks = nf4_num_blocks(numel);
  t.packed.resize(static_cast<size_t>(nf4_packed_bytes(numel)));
  t.absmax.resize(static_cast<size_t>(blocks));
  if (blocks > 0) nf4_quantize_blocks(src, numel, 0, blocks, t.packed.data(), t.absmax.data());
  if (double_quant) {
    t.absmax_offset =
        blocks > 0 ? nf4_absmax_offset(nf4_absmax_partial_sum(t.absmax.data(), blocks), blocks)
                   : 0.0f;
    t.absmax_q.resize(static_cast<size_t>(blocks));
    t.absmax_scale.resize(
        static_cast<size_t>((blocks + kNf4AbsmaxBlockSize - 1) / kNf4AbsmaxBlockSize));
    nf4_double_quantize_absmax(t.absmax.data(), blocks, 0, blocks, t.absmax_offset,
                               t.absmax_q.data(), t.absmax_scale.data());
    t.absmax.clear();
    t.absmax.shrink_to_fit();
  }
  return t;
}

void check_consistent(const Nf4Tensor& t) {
  const auto blocks = static_cast<size_t>(t.num_blocks());
  const bool stats_ok = t.double_quant ? t.absmax_q.size() == blocks &&
                                             t.absmax_scale.size() ==
                                                 (blocks + kNf4AbsmaxBlockSize - 1) /
                                                     kNf4AbsmaxBlockSize
                                       : t.absmax.size() == blocks;
  if (t.packed.size() != static_cast<size_t>(nf4_packed_bytes(t.numel)) || !stats_ok)
    throw std::logic_error("Nf4Tensor: buffer sizes do not match numel");
}

}  // namespace

const std::array<float, 16>& nf4_code() { return kNf4Code; }
const std::array<float, 15>& nf4_thresholds() { return kNf4Thresholds; }
uint8_t nf4_quantize_value(float x) { return nf4_code_of(x); }

int64_t nf4_num_blocks(int64_t numel) { return (numel + kNf4BlockSize - 1) / kNf4BlockSize; }
int64_t nf4_packed_bytes(int64_t numel) { return (numel + 1) / 2; }

int64_t Nf4Tensor::num_blocks() const { return nf4_num_blocks(numel); }

int64_t Nf4Tensor::storage_bytes() const {
  return static_cast<int64_t>(packed.size() + absmax.size() * sizeof(float) + absmax_q.size() +
                              absmax_scale.size() * sizeof(float) +
                              (double_quant ? sizeof(float) : 0));
}

void nf4_quantize_blocks(const uint16_t* src, int64_t numel, int64_t first_block,
                         int64_t num_blocks, uint8_t* packed, float* absmax) {
  const BlockRange range = block_range(numel, first_block, num_blocks);
  quantize_values([src](int64_t i) { return bf16_to_float(src[i]); }, range.values, packed,
                  absmax);
}

void nf4_quantize_blocks(const float* src, int64_t numel, int64_t first_block,
                         int64_t num_blocks, uint8_t* packed, float* absmax) {
  const BlockRange range = block_range(numel, first_block, num_blocks);
  quantize_values([src](int64_t i) { return src[i]; }, range.values, packed, absmax);
}

void nf4_dequantize_blocks(const uint8_t* packed, const float* absmax, int64_t numel,
                           int64_t first_block, int64_t num_blocks, uint16_t* out) {
  const BlockRange range = block_range(numel, first_block, num_blocks);
  dequantize_values(packed, absmax, range.values, out, [](float w) { return float_to_bf16(w); });
}

void nf4_dequantize_blocks(const uint8_t* packed, const float* absmax, int64_t numel,
                           int64_t first_block, int64_t num_blocks, float* out) {
  const BlockRange range = block_range(numel, first_block, num_blocks);
  dequantize_values(packed, absmax, range.values, out, [](float w) { return w; });
}

Nf4Tensor nf4_quantize(const uint16_t* bf16, int64_t numel, std::vector<int64_t> shape,
                       bool double_quant) {
  return quantize_tensor(bf16, numel, std::move(shape), double_quant);
}

Nf4Tensor nf4_quantize(const float* values, int64_t numel, std::vector<int64_t> shape,
                       bool double_quant) {
  return quantize_tensor(values, numel, std::move(shape), double_quant);
}

std::vector<float> nf4_absmax(const Nf4Tensor& tensor) {
  check_consistent(tensor);
  if (!tensor.double_quant) return tensor.absmax;
  const int64_t blocks = tensor.num_blocks();
  std::vector<float> absmax(static_cast<size_t>(blocks));
  nf4_double_dequantize_absmax(tensor.absmax_q.data(), tensor.absmax_scale.data(),
                               tensor.absmax_offset, blocks, 0, blocks, absmax.data());
  return absmax;
}

void nf4_dequantize(const Nf4Tensor& tensor, uint16_t* bf16_out) {
  const std::vector<float> absmax = nf4_absmax(tensor);
  if (tensor.numel > 0)
    nf4_dequantize_blocks(tensor.packed.data(), absmax.data(), tensor.numel, 0,
                          tensor.num_blocks(), bf16_out);
}

void nf4_dequantize(const Nf4Tensor& tensor, float* out) {
  const std::vector<float> absmax = nf4_absmax(tensor);
  if (tensor.numel > 0)
    nf4_dequantize_blocks(tensor.packed.data(), absmax.data(), tensor.numel, 0,
                          tensor.num_blocks(), out);
}

double nf4_absmax_partial_sum(const float* absmax, int64_t count) {
  // Fixed chunks summed in order, so the result does not depend on the thread count.
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (count + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    double sum = 0.0;
    const int64_t end = std::min(count, (c + 1) * kChunk);
    for (int64_t i = c * kChunk; i < end; ++i) sum += absmax[i];
    partial[static_cast<size_t>(c)] = sum;
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

float nf4_absmax_offset(double absmax_sum, int64_t total_blocks) {
  if (total_blocks <= 0) throw std::logic_error("nf4_absmax_offset: no blocks");
  // torch's CUDA mean: an fp32 sum times the fp32 factor 1/N. The sum here is the exact one
  // rounded once; torch's fp32 tree sum can differ from it in the last bits (docs/nf4.md).
  const float factor = 1.0f / static_cast<float>(total_blocks);
  return static_cast<float>(absmax_sum) * factor;
}

void nf4_double_quantize_absmax(const float* absmax, int64_t total_blocks, int64_t first_block,
                                int64_t num_blocks, float offset, uint8_t* absmax_q,
                                float* absmax_scale) {
  if (first_block % kNf4AbsmaxBlockSize != 0 || first_block < 0 || num_blocks < 0)
    throw std::logic_error("nf4_double_quantize_absmax: first_block must be a multiple of 256");
  const int64_t n = std::max<int64_t>(0, std::min(first_block + num_blocks, total_blocks) - first_block);
  std::vector<float> centered(static_cast<size_t>(n));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) centered[static_cast<size_t>(i)] = flush_subnormal(absmax[i] - offset);
  dynamic8_quantize_blockwise(centered.data(), n, kNf4AbsmaxBlockSize, absmax_q, absmax_scale);
}

void nf4_double_dequantize_absmax(const uint8_t* absmax_q, const float* absmax_scale,
                                  float offset, int64_t total_blocks, int64_t first_block,
                                  int64_t num_blocks, float* absmax) {
  if (first_block % kNf4AbsmaxBlockSize != 0 || first_block < 0 || num_blocks < 0)
    throw std::logic_error("nf4_double_dequantize_absmax: first_block must be a multiple of 256");
  const int64_t n = std::max<int64_t>(0, std::min(first_block + num_blocks, total_blocks) - first_block);
  dynamic8_dequantize_blockwise(absmax_q, absmax_scale, n, kNf4AbsmaxBlockSize, absmax);
  // A separate rounding for the offset, as bitsandbytes' `absmax += offset` after dequantizing.
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) absmax[i] = flush_subnormal(absmax[i] + offset);
}

}  // namespace fsdpq
