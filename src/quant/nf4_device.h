// NF4 weights on the GPU: the packed codes and absmax statistics of an Nf4Tensor uploaded once,
// dequantized on demand (kernels/nf4.cu) into a device tensor, bit-identical to the CPU
// nf4_dequantize. In a build without CUDA both functions throw std::logic_error.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/tensor.h"
#include "quant/nf4.h"

namespace fsdpq {

struct Nf4Device {
  Tensor packed;        // U8 [(numel + 1) / 2], as Nf4Tensor::packed
  Tensor absmax;        // F32 [blocks] (plain form; empty tensor when double_quant)
  Tensor absmax_q;      // U8 [blocks] (double-quantized form)
  Tensor absmax_scale;  // F32 [ceil(blocks / 256)] (double-quantized form)
  float absmax_offset = 0.0f;
  bool double_quant = false;
  int64_t numel = 0;
  std::vector<int64_t> shape;
};

// Copies the tensor's buffers to the current CUDA device (cuda_init must have run).
Nf4Device upload_nf4(const Nf4Tensor& tensor);

// out (CUDA, F32/BF16/F16, numel elements, e.g. the weight's shape) = the dequantized weight,
// queued on the compute stream. BF16/F32 equal the CPU nf4_dequantize bit for bit; F16 is the
// fp32 value rounded once to half.
void nf4_dequantize(const Nf4Device& weight, TensorView out);

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

// out (CUDA, F32/BF16/F16, numel elements, e.g. the weight's shape) = the dequantized weight,
// queued on the compute stream. BF16/F32 equal the CPU nf4_dequantize bit for bit; F16 is the
// fp32 value rounded once to half.
void nf4_dequantize(const Nf4DeviceSegments& weight, TensorView out);

}  // namespace fsdpq
