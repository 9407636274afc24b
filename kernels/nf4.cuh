// NF4 dequantization on the GPU (bitsandbytes layout, docs/nf4.md): w[i] = code[q[i]] * absmax[i / 64]
// in fp32, rounded once to the output type. The absmax is either one fp32 per block (plain) or
// double-quantized: code8[absmax_q[b]] * absmax_scale[b / 256] + absmax_offset (two fp32 roundings,
// as nf4_double_dequantize_absmax). Bit-identical to the CPU nf4_dequantize (subnormals flushed the
// same way); tests/gpu/nf4_gpu_test.cpp checks that.
#pragma once
#include <cstdint>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// packed: (numel + 1) / 2 bytes, element 2j in the high nibble of byte j. Exactly one of
// `absmax` (plain: one fp32 per 64-value block) and `absmax_q` + `absmax_scale` (double-quantized:
// one code byte per block, one fp32 per 256 blocks) is non-null. nf4_code16 / code8_256 are HOST
// arrays (16 and 256 floats: nf4_code() and dynamic_code_signed()); they travel as kernel
// arguments, so nothing is uploaded. code8_256 may be null for the plain form. Value i goes to
// out[pitch.at(i)] (pitch.length divides numel).
void nf4_dequantize(const uint8_t* packed, const float* absmax, const uint8_t* absmax_q,
                    const float* absmax_scale, float absmax_offset, const float* nf4_code16,
                    const float* code8_256, int64_t numel, void* out, KType out_type, RowPitch pitch,
                    cudaStream_t stream);

}  // namespace fsdpq::cuda
