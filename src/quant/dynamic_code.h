// bitsandbytes' signed 8-bit "dynamic" code and its blockwise quantization (the General8bit path
// of kQuantizeBlockwise / kDequantizeBlockwise). NF4 double quantization stores the per-block
// absmax values in this format; see docs/nf4.md.
#pragma once
#include <array>
#include <cstdint>

namespace fsdpq {

// create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): 256 sorted fp32 values,
// 127 negative, 0 at index 127, 127 positive, 1.0 at index 255. Built once with the same float32
// arithmetic as bitsandbytes (torch.linspace on the CPU, means, powers of ten).
const std::array<float, 256>& dynamic_code_signed();

// Index of the code value nearest to x, exactly as bitsandbytes' dQuantize<STOCHASTIC=0>: a
// 7-level binary descent over the sorted code, then the nearer of the two neighbours by the fp32
// midpoint; a value exactly at a midpoint keeps the descent's (even) index. NaN gives 0.
uint8_t dynamic_code_quantize(const std::array<float, 256>& code, float x);

// Blockwise 8-bit quantization of n fp32 values (blocks of `blocksize`, the last one may be
// short): absmax[b] = max |x| over block b; q[i] = dynamic_code_quantize(x[i] * (1/absmax[b])).
// Block boundaries are relative to `x`, so a block-aligned sub-range quantizes on its own.
void dynamic8_quantize_blockwise(const float* x, int64_t n, int64_t blocksize, uint8_t* q,
                                 float* absmax);

// out[i] = code[q[i]] * absmax[i / blocksize], in fp32.
void dynamic8_dequantize_blockwise(const uint8_t* q, const float* absmax, int64_t n,
                                   int64_t blocksize, float* out);

}  // namespace fsdpq
