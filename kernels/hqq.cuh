// HQQ dequantization on the GPU (hqq's layout, docs/hqq.md): w = (code - zero) * scale in the
// compute dtype (BF16 or F16), each operation rounded to it, as hqq's Quantizer.dequantize;
// written as that dtype or widened exactly to F32. Bit-identical to the CPU
// hqq_dequantize_groups (src/quant/hqq.h); tests/gpu/hqq_gpu_test.cpp checks that.
#pragma once
#include <cstdint>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// hqq's BitPack layout (quant/hqq.h, HqqPacking): `slices` blocks of `rows` groups, packed into
// [rows, 64] words of `word_bytes` bytes (1, or 4 for 3 bits), slice k of word (r, j) holding
// group k * rows + r (codes of groups past `groups` are padding).
struct HqqLayout {
  int n_bits;
  int64_t groups, rows;
  int word_bytes, slices;
};

// codes: the packed words; zeros, scales: one 16-bit value of type `meta` per group; out:
// groups * 64 values of `out_type` (`meta` or F32), value i at out[pitch.at(i)] (pitch.length
// divides groups * 64).
void hqq_dequantize(const uint8_t* codes, const uint16_t* zeros, const uint16_t* scales, KType meta,
                    const HqqLayout& layout, void* out, KType out_type, RowPitch pitch, cudaStream_t stream);

}  // namespace fsdpq::cuda
