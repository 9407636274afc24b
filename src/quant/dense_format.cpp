// Dense values: one segment, the weight's elements in its dtype, encoded by copying them.
#include <fmt/format.h>

#include <cstring>
#include <stdexcept>

#include "backend/cuda_backend.h"
#include "quant/frozen_format.h"

namespace fsdpq {
namespace {

class DenseFormat final : public FrozenFormat {
 public:
  explicit DenseFormat(DType dtype) : dtype_(dtype) {}

  std::string name() const override { return std::string(dtype_name(dtype_)); }
  bool quantized() const override { return false; }
  std::vector<SegmentSpec> segments(int64_t numel) const override {
    return {{"values", static_cast<size_t>(numel) * element(), dtype_, false}};
  }
  bool accepts_values(DType dtype) const override { return dtype == dtype_; }

  // The elements under the bytes (a range may cut an element at either end).
  ElementRanges values_for(int segment, int64_t numel, size_t from, size_t to) const override {
    return {elements_under(segment, numel, from, to)};
  }

  void encode_values(int segment, int64_t numel, size_t from, size_t to, const void* values, DType dtype,
                     uint8_t* out, float*) const override {
    if (dtype != dtype_)
      throw std::logic_error(fmt::format("dense {} weight: values given as {}", name(), dtype_name(dtype)));
    const ElementRange range = elements_under(segment, numel, from, to);
    std::memcpy(out, static_cast<const uint8_t*>(values) + (from - static_cast<size_t>(range.first) * element()),
                to - from);
  }

  ElementRange elements_under(int segment, int64_t, size_t from, size_t to) const {
    check_segment(segment);
    const size_t first = from / element(), end = (to + element() - 1) / element();
    return {static_cast<int64_t>(first), static_cast<int64_t>(end - first)};
  }

  bool stores_values_as_read(int segment, size_t from, size_t to, DType dtype) const override {
    check_segment(segment);
    return dtype == dtype_ && from % element() == 0 && to % element() == 0;
  }

  // The ops read dense values in place (FrozenStorage::dense); a copy is only asked for in its own dtype.
  void dequantize(std::span<const TensorView> segments, const FrozenScalars&, int64_t numel,
                  const MatrixView& block) const override {
    if (segments.size() != 1 || !block.whole() || block.dtype() != dtype_ || block.numel() != numel ||
        segments[0].numel() != numel)
      throw std::logic_error(fmt::format("dense {} weight of {} elements: cannot copy into {} (whole: {})", name(),
                                         numel, block.tensor.describe(), block.whole()));
    const TensorView out = block.tensor;
    copy_bytes(out.data, out.device, segments[0].data, segments[0].device, out.nbytes());
  }

 private:
  size_t element() const { return dtype_size(dtype_); }
  void check_segment(int segment) const {
    if (segment != 0) throw std::logic_error(fmt::format("dense {} weight: no segment {}", name(), segment));
  }
  DType dtype_;
};

}  // namespace

const FrozenFormat& dense_format(DType dtype) {
  static const DenseFormat bf16(DType::BF16), f16(DType::F16), f32(DType::F32);
  switch (dtype) {
    case DType::BF16: return bf16;
    case DType::F16: return f16;
    case DType::F32: return f32;
    default: throw std::logic_error(fmt::format("dense_format: {} is not a weight dtype", dtype_name(dtype)));
  }
}

}  // namespace fsdpq
