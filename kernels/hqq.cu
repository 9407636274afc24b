#include <stdexcept>

#include "kernels/hqq.cuh"

namespace fsdpq::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kGroupSize = 64;

// One thread per packed word: it holds one value of each slice's group, at the same column.
// kPitched: value i goes to out[pitch.at(i)], else to out[i].
template <class Meta, class Out, bool kPitched>
__global__ void __launch_bounds__(kThreads)
    hqq_dequantize_kernel(const uint8_t* __restrict__ codes, const Meta* __restrict__ zeros,
                          const Meta* __restrict__ scales, HqqLayout layout, Out* __restrict__ out, RowPitch pitch) {
  const int64_t words = layout.rows * kGroupSize;
  const uint32_t mask = (1u << layout.n_bits) - 1u;
  for (int64_t w = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; w < words;
       w += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = w / kGroupSize, column = w % kGroupSize;
    const uint32_t word = layout.word_bytes == 4 ? reinterpret_cast<const uint32_t*>(codes)[w] : codes[w];
    for (int k = 0; k < layout.slices; ++k) {
      const int64_t g = k * layout.rows + row;
      if (g >= layout.groups) break;
      const int shift = layout.n_bits == 3 ? 27 - 3 * k : (layout.slices - 1 - k) * layout.n_bits;
      const float code = static_cast<float>((word >> shift) & mask);
      const float centred = round_to<Meta>(code - to_float(zeros[g]));
      const int64_t i = g * kGroupSize + column;
      out[kPitched ? pitch.at(i) : i] = from_float<Out>(round_to<Meta>(centred * to_float(scales[g])));
    }
  }
}

}  // namespace

void hqq_dequantize(const uint8_t* codes, const uint16_t* zeros, const uint16_t* scales, KType meta,
                    const HqqLayout& layout, void* out, KType out_type, RowPitch pitch, cudaStream_t stream) {
  if (layout.groups == 0) return;
  if (codes == nullptr || zeros == nullptr || scales == nullptr || out == nullptr)
    throw std::logic_error("cuda::hqq_dequantize: a null segment or output");
  if (meta == KType::F32 || (out_type != KType::F32 && out_type != meta))
    throw std::logic_error("cuda::hqq_dequantize: the meta type is BF16 or F16, the output that type or F32");
  if (pitch.length <= 0 || layout.groups * kGroupSize % pitch.length != 0 || pitch.stride < pitch.length)
    throw std::logic_error("cuda::hqq_dequantize: the output's rows must divide the weight and fit their stride");
  const unsigned grid = blocks_for(layout.rows * kGroupSize, kThreads);
  with_ktype(meta, [&](auto meta_tag) {
    using Meta = decltype(meta_tag);
    with_ktype(out_type, [&](auto out_tag) {
      using Out = decltype(out_tag);
      const auto* z = reinterpret_cast<const Meta*>(zeros);
      const auto* s = reinterpret_cast<const Meta*>(scales);
      if (pitch.contiguous())
        hqq_dequantize_kernel<Meta, Out, false>
            <<<grid, kThreads, 0, stream>>>(codes, z, s, layout, static_cast<Out*>(out), pitch);
      else
        hqq_dequantize_kernel<Meta, Out, true>
            <<<grid, kThreads, 0, stream>>>(codes, z, s, layout, static_cast<Out*>(out), pitch);
    });
  });
  check_launch("hqq_dequantize");
}

}  // namespace fsdpq::cuda
