// NF4 dequantization on the GPU (kernels/nf4.cu), bit-identical to the CPU nf4_dequantize: what
// the NF4 frozen format (quant/nf4_format.cpp) runs when a weight's segments are on the GPU. In a
// build without CUDA it throws std::logic_error (no CUDA tensor can exist there).
#pragma once
#include <cstdint>

#include "backend/matrix_view.h"
#include "backend/tensor.h"

namespace fsdpq {

// An NF4 weight's segments in GPU memory: the packed codes and either the plain absmax or the
// double-quantised form (absmax_q, absmax_scale, absmax_offset).
struct Nf4DeviceSegments {
  const uint8_t* packed = nullptr;      // (numel + 1) / 2 bytes
  const float* absmax = nullptr;        // one per block (plain form)
  const uint8_t* absmax_q = nullptr;    // one per block (double-quantised form)
  const float* absmax_scale = nullptr;  // one per 256 blocks (double-quantised form)
  float absmax_offset = 0.0f;
  int64_t numel = 0;
};

// out (CUDA, F32/BF16/F16, numel elements, e.g. the weight's shape, or a block of a wider
// matrix's columns whose rows are the weight's) = the dequantized weight, queued on the compute
// stream. BF16/F32 equal the CPU nf4_dequantize bit for bit; F16 is the
// fp32 value rounded once to half.
void nf4_dequantize(const Nf4DeviceSegments& weight, const MatrixView& out);

}  // namespace fsdpq
