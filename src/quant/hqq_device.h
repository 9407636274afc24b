// HQQ dequantization on the GPU (kernels/hqq.cu), bit-identical to the CPU hqq_dequantize_groups:
// what the HQQ frozen format (quant/hqq_format.cpp) runs when a weight's segments are on the GPU.
// In a build without CUDA it throws std::logic_error (no CUDA tensor can exist there).
#pragma once
#include <cstdint>

#include "backend/matrix_view.h"
#include "backend/tensor.h"
#include "quant/hqq.h"

namespace fsdpq {

// An HQQ weight's segments in GPU memory.
struct HqqDeviceSegments {
  const uint8_t* codes = nullptr;    // hqq's packed W_q (packing.bytes())
  const uint16_t* zeros = nullptr;   // one per group, in `meta`
  const uint16_t* scales = nullptr;  // one per group, in `meta`
  DType meta = DType::BF16;          // BF16 or F16
  HqqPacking packing;
};

// out (CUDA, the meta dtype or F32, the weight's elements: the whole tensor, or a block of a wider
// matrix's columns whose rows are the weight's) = the dequantized weight, queued on the compute
// stream.
void hqq_dequantize(const HqqDeviceSegments& weight, const MatrixView& out);

}  // namespace fsdpq
