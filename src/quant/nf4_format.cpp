// NF4 as a frozen format (docs/nf4.md): the packed codes are the value segment; the absmax (plain
// form) or its double quantisation (absmax codes, group scales, and the offset as a scalar) are
// statistics segments, because the offset is the mean over the whole tensor.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "quant/frozen_format.h"
#include "quant/nf4.h"
#include "quant/nf4_device.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

enum Nf4Segment : int { kCodes = 0, kAbsmax = 1, kAbsmaxCodes = 1, kAbsmaxScales = 2 };

int64_t ceil_div(int64_t n, int64_t d) { return (n + d - 1) / d; }

// Blocks [first, first + count) of a tensor of `numel` values, and their values.
struct Blocks {
  int64_t first = 0, count = 0;
  ElementRange values(int64_t numel) const {
    const int64_t begin = first * kNf4BlockSize;
    return {begin, std::min((first + count) * kNf4BlockSize, numel) - begin};
  }
};

// The blocks whose codes fill packed bytes [from, to): a byte holds two values of one block.
Blocks blocks_of_codes(int64_t numel, size_t from, size_t to) {
  const int64_t first = static_cast<int64_t>(2 * from) / kNf4BlockSize;
  const int64_t end = nf4_num_blocks(std::min<int64_t>(static_cast<int64_t>(2 * to), numel));
  return {first, end - first};
}

class Nf4Format final : public FrozenFormat {
 public:
  explicit Nf4Format(bool double_quant) : double_quant_(double_quant) {}

  std::string name() const override { return double_quant_ ? "nf4 (double-quantised absmax)" : "nf4"; }
  bool quantized() const override { return true; }

  std::vector<SegmentSpec> segments(int64_t numel) const override {
    const auto blocks = static_cast<size_t>(nf4_num_blocks(numel));
    std::vector<SegmentSpec> s = {{"codes", static_cast<size_t>(nf4_packed_bytes(numel)), DType::U8, false}};
    if (double_quant_) {
      s.push_back({"absmax_codes", blocks, DType::U8, true});
      s.push_back({"absmax_scales", static_cast<size_t>(ceil_div(static_cast<int64_t>(blocks), kNf4AbsmaxBlockSize)) *
                                        sizeof(float),
                   DType::F32, true});
    } else {
      s.push_back({"absmax", blocks * sizeof(float), DType::F32, true});
    }
    return s;
  }

  bool accepts_values(DType dtype) const override { return dtype == DType::BF16 || dtype == DType::F32; }

  ElementRanges values_for(int segment, int64_t numel, size_t from, size_t to) const override {
    if (segment != kCodes) throw std::logic_error(fmt::format("{}: segment {} is not encoded from values", name(), segment));
    return {blocks_of_codes(numel, from, to).values(numel)};
  }

  // Quantises the blocks under the bytes (at most one block more at each end than the bytes
  // need) and keeps their absmax as the statistics.
  void encode_values(int segment, int64_t numel, size_t from, size_t to, const void* values, DType dtype,
                     uint8_t* out, float* statistics) const override {
    if (segment != kCodes) throw std::logic_error(fmt::format("{}: segment {} is not encoded from values", name(), segment));
    const Blocks blocks = blocks_of_codes(numel, from, to);
    // The blocks' codes go straight to `out` when the bytes are exactly theirs (a whole tensor,
    // or a range of whole blocks); else they are staged and cut.
    const size_t base = static_cast<size_t>(blocks.first * kNf4BlockSize / 2);
    const size_t bytes = static_cast<size_t>(nf4_packed_bytes(blocks.values(numel).count));
    std::vector<uint8_t> staged(from == base && to == base + bytes ? 0 : bytes);
    uint8_t* packed = staged.empty() ? out : staged.data();
    float* absmax = statistics + blocks.first;
    if (dtype == DType::BF16)
      nf4_quantize_blocks(static_cast<const uint16_t*>(values), numel, blocks.first, blocks.count, packed, absmax);
    else if (dtype == DType::F32)
      nf4_quantize_blocks(static_cast<const float*>(values), numel, blocks.first, blocks.count, packed, absmax);
    else
      throw std::logic_error(fmt::format("{}: values given as {}, expected BF16 or F32", name(), dtype_name(dtype)));
    if (!staged.empty()) std::memcpy(out, staged.data() + (from - base), to - from);
  }

  int64_t statistics_count(int64_t numel) const override { return nf4_num_blocks(numel); }

  FrozenScalars scalars_from(const float* absmax, int64_t numel) const override {
    const int64_t blocks = nf4_num_blocks(numel);
    FrozenScalars s;
    if (double_quant_ && blocks > 0) s.absmax_offset = nf4_absmax_offset(nf4_absmax_partial_sum(absmax, blocks), blocks);
    return s;
  }

  // Double quantisation works on whole groups of 256 blocks, so the groups under the bytes are
  // quantised (the same bytes as quantising the whole vector: groups are independent).
  void encode_statistics(int segment, int64_t numel, size_t from, size_t to, const float* absmax,
                         const FrozenScalars& scalars, uint8_t* out) const override {
    const int64_t blocks = nf4_num_blocks(numel);
    if (!double_quant_) {
      if (segment != kAbsmax) FrozenFormat::encode_statistics(segment, numel, from, to, absmax, scalars, out);
      std::memcpy(out, reinterpret_cast<const uint8_t*>(absmax) + from, to - from);
      return;
    }
    if (segment != kAbsmaxCodes && segment != kAbsmaxScales)
      FrozenFormat::encode_statistics(segment, numel, from, to, absmax, scalars, out);
    // Groups [g0, g1) cover the bytes: one code byte per block, one fp32 scale per group.
    const auto at = [](size_t byte, int64_t per) { return static_cast<int64_t>(byte) / per; };
    const int64_t g0 = segment == kAbsmaxCodes ? at(from, kNf4AbsmaxBlockSize) : at(from, sizeof(float));
    const int64_t g1 = segment == kAbsmaxCodes ? ceil_div(static_cast<int64_t>(to), kNf4AbsmaxBlockSize)
                                               : ceil_div(static_cast<int64_t>(to), sizeof(float));
    const int64_t first_block = g0 * kNf4AbsmaxBlockSize;
    const int64_t count = std::min(g1 * kNf4AbsmaxBlockSize, blocks) - first_block;
    std::vector<uint8_t> codes(static_cast<size_t>(count));
    std::vector<float> scales(static_cast<size_t>(g1 - g0));
    nf4_double_quantize_absmax(absmax + first_block, blocks, first_block, count, scalars.absmax_offset, codes.data(),
                               scales.data());
    if (segment == kAbsmaxCodes)
      std::memcpy(out, codes.data() + (from - static_cast<size_t>(first_block)), to - from);
    else
      std::memcpy(out, reinterpret_cast<const uint8_t*>(scales.data()) + (from - static_cast<size_t>(g0) * sizeof(float)),
                  to - from);
  }

  void dequantize(std::span<const TensorView> segments, const FrozenScalars& scalars, int64_t numel,
                  const MatrixView& block) const override {
    if (segments.size() != (double_quant_ ? 3u : 2u) || block.numel() != numel)
      throw std::logic_error(fmt::format("{} weight of {} elements: cannot dequantise into {} columns [{}, {})", name(),
                                         numel, block.tensor.describe(), block.first_column,
                                         block.first_column + block.cols()));
    const auto* codes = static_cast<const uint8_t*>(segments[kCodes].data);
    if (block.device() == Device::CUDA) {
      Nf4DeviceSegments d{codes, nullptr, nullptr, nullptr, scalars.absmax_offset, numel};
      if (double_quant_) {
        d.absmax_q = static_cast<const uint8_t*>(segments[kAbsmaxCodes].data);
        d.absmax_scale = static_cast<const float*>(segments[kAbsmaxScales].data);
      } else {
        d.absmax = static_cast<const float*>(segments[kAbsmax].data);
      }
      nf4_dequantize(d, block);
      return;
    }
    const int64_t blocks = nf4_num_blocks(numel);
    if (blocks == 0) return;
    std::vector<float> absmax(static_cast<size_t>(blocks));
    if (double_quant_)
      nf4_double_dequantize_absmax(static_cast<const uint8_t*>(segments[kAbsmaxCodes].data),
                                   static_cast<const float*>(segments[kAbsmaxScales].data), scalars.absmax_offset,
                                   blocks, 0, blocks, absmax.data());
    else
      std::memcpy(absmax.data(), segments[kAbsmax].data, absmax.size() * sizeof(float));
    if (block.whole()) return dequantize_blocks(codes, absmax.data(), numel, 0, blocks, block.dtype(), block.data());
    for_each_row(block, kNf4BlockSize, "blocks", [&](int64_t first, int64_t count, void* row) {
      dequantize_blocks(codes + first * (kNf4BlockSize / 2), absmax.data() + first, numel, first, count, block.dtype(),
                        row);
    });
  }

 private:
  // Blocks [first_block, first_block + count) (cut at numel) into out, in `dtype`: codes and absmax
  // point at the first block's, out at its first value.
  void dequantize_blocks(const uint8_t* codes, const float* absmax, int64_t numel, int64_t first_block, int64_t count,
                         DType dtype, void* out) const {
    if (dtype == DType::F32) {
      nf4_dequantize_blocks(codes, absmax, numel, first_block, count, static_cast<float*>(out));
    } else if (dtype == DType::BF16) {
      nf4_dequantize_blocks(codes, absmax, numel, first_block, count, static_cast<uint16_t*>(out));
    } else if (dtype == DType::F16) {
      // code * absmax in fp32, rounded once to half, staged 256 blocks at a time (no fp32 copy of
      // the whole weight on every pass).
      constexpr int64_t kChunkBlocks = 256;
      auto* half = static_cast<uint16_t*>(out);
      const int64_t first_value = first_block * kNf4BlockSize;
#pragma omp parallel for schedule(static)
      for (int64_t b0 = 0; b0 < count; b0 += kChunkBlocks) {
        float staged[kChunkBlocks * kNf4BlockSize];
        const int64_t count_blocks = std::min(kChunkBlocks, count - b0);
        nf4_dequantize_blocks(codes + b0 * (kNf4BlockSize / 2), absmax + b0, numel, first_block + b0, count_blocks,
                              staged);
        const int64_t first = b0 * kNf4BlockSize;
        const int64_t values = std::min(numel - first_value - first, count_blocks * kNf4BlockSize);
        for (int64_t i = 0; i < values; ++i) half[first + i] = float_to_f16(staged[i]);
      }
    } else {
      throw std::logic_error(fmt::format("{}: cannot dequantise into {}", name(), dtype_name(dtype)));
    }
  }

  bool double_quant_;
};

}  // namespace

const FrozenFormat& nf4_format(bool double_quant) {
  static const Nf4Format plain(false), compressed(true);
  return double_quant ? compressed : plain;
}

}  // namespace fsdpq
