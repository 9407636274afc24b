// NF4 4-bit quantization, byte-for-byte compatible with bitsandbytes
// quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=...) and its
// dequantize_4bit. The format (code table, blocks, nibble order, double quantization of the
// absmax) is described in docs/nf4.md.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

namespace fsdpq {

inline constexpr int64_t kNf4BlockSize = 64;         // values sharing one absmax
inline constexpr int64_t kNf4AbsmaxBlockSize = 256;  // absmax values sharing one fp32 scale
                                                     // under double quantization

// The 16 NF4 values; the 4-bit code of a value is its index here.
const std::array<float, 16>& nf4_code();
// The 15 decision thresholds of bitsandbytes' dQuantizeNF4, ascending; threshold k is the
// midpoint of code[k] and code[k + 1].
const std::array<float, 15>& nf4_thresholds();
// 4-bit code of a value already divided by its block's absmax: the number of thresholds strictly
// below x. A value exactly on a threshold takes the lower code, values beyond +-1 the end codes,
// NaN code 0 (as the GPU's decision tree, where every comparison with NaN is false).
uint8_t nf4_quantize_value(float x);

// A quantized tensor. Either `absmax` (one fp32 per block) or, when double_quant, the
// double-quantized form (absmax_q, absmax_scale, absmax_offset) is filled, never both.
struct Nf4Tensor {
  std::vector<uint8_t> packed;  // (numel + 1) / 2 bytes: byte j = element 2j << 4 | element 2j+1
  std::vector<float> absmax;    // one per block of 64 values (plain form)
  bool double_quant = false;
  std::vector<uint8_t> absmax_q;    // one dynamic-code byte per block (double-quantized form)
  std::vector<float> absmax_scale;  // one per 256 blocks (double-quantized form)
  float absmax_offset = 0.0f;       // mean of the raw absmax (double-quantized form)
  int64_t numel = 0;
  std::vector<int64_t> shape;

  int64_t num_blocks() const;
  // Bytes of packed data plus statistics (what the tensor costs in memory).
  int64_t storage_bytes() const;
};

int64_t nf4_num_blocks(int64_t numel);    // ceil(numel / 64)
int64_t nf4_packed_bytes(int64_t numel);  // ceil(numel / 2)

// Quantizes a row-major tensor of `numel` values (shape's product must equal numel).
Nf4Tensor nf4_quantize(const uint16_t* bf16, int64_t numel, std::vector<int64_t> shape,
                       bool double_quant);
Nf4Tensor nf4_quantize(const float* values, int64_t numel, std::vector<int64_t> shape,
                       bool double_quant);

// w = code[q] * absmax[block] in fp32; the bf16 form rounds that to nearest even, as
// bitsandbytes' dequantize_4bit does for a bf16 quant_state dtype.
void nf4_dequantize(const Nf4Tensor& tensor, uint16_t* bf16_out);
void nf4_dequantize(const Nf4Tensor& tensor, float* out);

// The per-block absmax the dequantization uses (decoded from the double-quantized form when
// double_quant, else a copy of `absmax`).
std::vector<float> nf4_absmax(const Nf4Tensor& tensor);

// ---- Block ranges: a sharded loader quantizes only the blocks it owns. ----
// Blocks [first_block, first_block + num_blocks) of a tensor of `numel` values (the range may run
// past the end: it is cut at numel). `src` / `out` point at the range's first value (element
// first_block * 64), `packed` at its first byte (first_block * 32), `absmax` at
// absmax[first_block]. The bytes written equal those of the whole-tensor call.
void nf4_quantize_blocks(const uint16_t* src, int64_t numel, int64_t first_block,
                         int64_t num_blocks, uint8_t* packed, float* absmax);
void nf4_quantize_blocks(const float* src, int64_t numel, int64_t first_block,
                         int64_t num_blocks, uint8_t* packed, float* absmax);
void nf4_dequantize_blocks(const uint8_t* packed, const float* absmax, int64_t numel,
                           int64_t first_block, int64_t num_blocks, uint16_t* out);
void nf4_dequantize_blocks(const uint8_t* packed, const float* absmax, int64_t numel,
                           int64_t first_block, int64_t num_blocks, float* out);

// ---- Double quantization of the absmax (bitsandbytes compress_statistics=True). ----
// offset = mean(absmax) over the whole tensor. Shards add up their partial sums (exact enough in
// double) and all-reduce them before calling nf4_absmax_offset.
double nf4_absmax_partial_sum(const float* absmax, int64_t count);
float nf4_absmax_offset(double absmax_sum, int64_t total_blocks);
// absmax - offset, quantized in groups of 256 blocks with the signed dynamic code. first_block
// must be a multiple of 256; `absmax` and `absmax_q` point at entry first_block, `absmax_scale`
// at group first_block / 256.
void nf4_double_quantize_absmax(const float* absmax, int64_t total_blocks, int64_t first_block,
                                int64_t num_blocks, float offset, uint8_t* absmax_q,
                                float* absmax_scale);
// absmax = code8[q] * scale[group] + offset, in fp32 (two roundings, as bitsandbytes' two steps).
void nf4_double_dequantize_absmax(const uint8_t* absmax_q, const float* absmax_scale,
                                  float offset, int64_t total_blocks, int64_t first_block,
                                  int64_t num_blocks, float* absmax);

}  // namespace fsdpq
