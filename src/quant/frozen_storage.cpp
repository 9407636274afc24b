#include "quant/frozen_storage.h"

#include <fmt/format.h>

#include <stdexcept>

#include "backend/cuda_backend.h"

namespace fsdpq {

FrozenStorage::FrozenStorage(const FrozenFormat& format, const Shape& shape)
    : format_(&format), shape_(shape), specs_(format.segments(shape.numel())), segments_(specs_.size()) {}

FrozenStorage FrozenStorage::encode(const FrozenFormat& format, const Shape& shape, const void* values, DType dtype) {
  FrozenStorage s(format, shape);
  s.allocate(Device::CPU);
  const int64_t numel = shape.numel();
  std::vector<float> statistics(static_cast<size_t>(format.statistics_count(numel)), kUnknownStatistic);
  // The values a value segment is encoded from, concatenated from its ranges where they are several.
  std::vector<uint8_t> gathered;
  const auto values_of = [&](int segment, size_t bytes) -> const void* {
    const ElementRanges ranges = format.values_for(segment, numel, 0, bytes);
    const auto* all = static_cast<const uint8_t*>(values);
    const size_t width = dtype_size(dtype);
    if (ranges.size() == 1) return all + static_cast<size_t>(ranges[0].first) * width;
    gathered.clear();
    for (const ElementRange& r : ranges)
      gathered.insert(gathered.end(), all + static_cast<size_t>(r.first) * width,
                      all + static_cast<size_t>(r.first + r.count) * width);
    return gathered.data();
  };
  // Step 1: value segments, and the statistics of those that need the scalars.
  for (size_t i = 0; i < s.specs_.size(); ++i) {
    const SegmentSpec& spec = s.specs_[i];
    if (spec.bytes == 0 || spec.from_statistics) continue;
    const int segment = static_cast<int>(i);
    if (spec.needs_scalars)
      format.measure_values(segment, numel, 0, spec.bytes, values_of(segment, spec.bytes), dtype, statistics.data());
    else
      format.encode_values(segment, numel, 0, spec.bytes, values_of(segment, spec.bytes), dtype, s.segment(i).data(),
                           statistics.data());
  }
  // Step 2: the scalars, then statistics segments, and the value segments that need the scalars
  // together (encode_pieces_with_scalars; each with its own copy of the values it reads).
  s.scalars = format.scalars_from(statistics.data(), numel);
  std::vector<FrozenFormat::ScalarsPiece> pieces;
  std::vector<std::vector<uint8_t>> piece_values;
  for (size_t i = 0; i < s.specs_.size(); ++i) {
    const SegmentSpec& spec = s.specs_[i];
    if (spec.bytes == 0) continue;
    const int segment = static_cast<int>(i);
    if (spec.from_statistics) {
      format.encode_statistics(segment, numel, 0, spec.bytes, statistics.data(), s.scalars, s.segment(i).data());
    } else if (spec.needs_scalars) {
      const void* at = values_of(segment, spec.bytes);
      if (at == gathered.data()) {  // values_of's buffer is reused by the next segment: keep a copy
        piece_values.push_back(gathered);
        at = piece_values.back().data();
      }
      pieces.push_back({segment, 0, spec.bytes, at, dtype, s.segment(i).data()});
    }
  }
  format.encode_pieces_with_scalars(numel, pieces, s.scalars);
  return s;
}

const FrozenFormat& FrozenStorage::format() const {
  if (!format_) throw std::logic_error("FrozenStorage: no format (not a frozen weight)");
  return *format_;
}

std::span<uint8_t> FrozenStorage::segment(size_t i) {
  Tensor& t = segments_.at(i);
  return {static_cast<uint8_t*>(t.view().data), t.defined() ? t.nbytes() : 0};
}

std::span<const uint8_t> FrozenStorage::segment(size_t i) const {
  const Tensor& t = segments_.at(i);
  return {static_cast<const uint8_t*>(t.view().data), t.defined() ? t.nbytes() : 0};
}

// A dense format's one segment has the weight's shape (the ops read it as the weight); other
// segments are flat arrays of their element type.
Tensor FrozenStorage::allocate_tensor(size_t i, Device device) const {
  const SegmentSpec& spec = specs_.at(i);
  const Shape shape = format().quantized() ? Shape{static_cast<int64_t>(spec.bytes / dtype_size(spec.element))} : shape_;
  return Tensor::empty(shape, spec.element, device);
}

std::span<uint8_t> FrozenStorage::allocate(size_t i, Device device) {
  segments_.at(i) = Tensor();
  segments_[i] = allocate_tensor(i, device);
  return segment(i);
}

void FrozenStorage::allocate(Device device) {
  for (size_t i = 0; i < specs_.size(); ++i) allocate(i, device);
}

bool FrozenStorage::allocated() const {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].bytes > 0 && !segments_[i].defined()) return false;
  return true;
}

Device FrozenStorage::device() const {
  for (const Tensor& t : segments_)
    if (t.defined()) return t.device();
  return Device::CPU;
}

void FrozenStorage::release() {
  for (Tensor& t : segments_) t = Tensor();
  host_copy_.clear();
}

void FrozenStorage::place_on(Device target) {
  bool any = false;
  for (const Tensor& t : segments_) any = any || t.defined();
  if (!any || device() == target) return;
  if (target == Device::CPU && !host_copy_.empty()) {
    segments_ = std::move(host_copy_);
    host_copy_.clear();
    return;
  }
  std::vector<Tensor> moved;
  for (const Tensor& t : segments_) moved.push_back(t.defined() ? copy_to(t.view(), target) : Tensor());
  if (target == Device::CUDA && format().quantized()) host_copy_ = std::move(segments_);
  segments_ = std::move(moved);
}

std::vector<TensorView> FrozenStorage::segment_views() const {
  std::vector<TensorView> views;
  for (const Tensor& t : segments_) views.push_back(t.view());
  return views;
}

TensorView FrozenStorage::values() const {
  if (format().quantized())
    throw std::logic_error(fmt::format("FrozenStorage: a {} weight has no values in place", format_->name()));
  return segments_.at(0).view();
}

TensorView FrozenStorage::dense(Tensor& scratch, DType dtype) const {
  if (!format().quantized()) return values();
  if (!allocated()) throw std::logic_error("FrozenStorage::dense: the weight's bytes are not here (released)");
  const Device where = device();
  if (!scratch.defined() || scratch.shape() != shape_ || scratch.dtype() != dtype || scratch.device() != where)
    scratch = Tensor::empty(shape_, dtype, where);
  dequantize_into(scratch.view());
  return scratch.view();
}

void FrozenStorage::dequantize_into(const MatrixView& out) const {
  if (!format().quantized()) throw std::logic_error("FrozenStorage::dequantize_into: the weight is not quantised");
  if (!allocated()) throw std::logic_error("FrozenStorage::dequantize_into: the weight's bytes are not here (released)");
  if (out.device() != device() || out.numel() != numel() || (!out.whole() && out.cols() != shape_.last()))
    throw std::logic_error(fmt::format("FrozenStorage::dequantize_into: a {} weight {} on {} cannot fill columns [{}, {}) "
                                       "of {}",
                                       format_->name(), shape_.to_string(), device_name(device()), out.first_column,
                                       out.first_column + out.cols(), out.tensor.describe()));
  format_->dequantize(segment_views(), scalars, numel(), out);
}

}  // namespace fsdpq
