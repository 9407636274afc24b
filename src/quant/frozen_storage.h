// A frozen weight's bytes in its format (quant/frozen_format.h): one buffer per segment, on the
// host or the GPU, and the format's per-tensor scalars. The sharder sees only the segments, as
// byte spans: it flattens them into a unit's flat bytes, gathers them and allocates them where a
// gathered or fetched unit is unpacked (fsdp/). The model sees dense(): the values to compute with.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "backend/tensor.h"
#include "quant/frozen_format.h"

namespace fsdpq {

class FrozenStorage {
 public:
  FrozenStorage() = default;  // no format: the weight is not frozen
  // A weight of `shape` in `format`, with no bytes yet (allocate them, or encode into them).
  FrozenStorage(const FrozenFormat& format, const Shape& shape);
  // A whole tensor's values (`shape`'s elements in `dtype`, on the host) stored in `format`, in
  // host memory: the format's encoding with one range holding everything.
  static FrozenStorage encode(const FrozenFormat& format, const Shape& shape, const void* values, DType dtype);
  FrozenStorage(FrozenStorage&&) noexcept = default;
  FrozenStorage& operator=(FrozenStorage&&) noexcept = default;

  bool defined() const { return format_ != nullptr; }
  const FrozenFormat& format() const;
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return shape_.numel(); }
  const std::vector<SegmentSpec>& segments() const { return specs_; }

  // Segment i's bytes where they are now: empty while the segment has none.
  std::span<uint8_t> segment(size_t i);
  std::span<const uint8_t> segment(size_t i) const;
  // Allocates segment i on `device` (uninitialised, dropping what it held) and returns its bytes.
  std::span<uint8_t> allocate(size_t i, Device device);
  void allocate(Device device);  // every segment
  // Every segment holds its bytes (on one device).
  bool allocated() const;
  Device device() const;  // where the segments are (allocated() only)
  // Frees every segment on every device; the format, shape and scalars stay.
  void release();
  // Moves the bytes to `device`; nothing to move while released. A quantised weight placed on
  // the GPU keeps its host bytes (the memory planner counts that copy) and goes back to them.
  void place_on(Device device);

  // What the format keeps outside the segments (NF4's absmax offset), on every rank whole.
  FrozenScalars scalars;

  // The values to compute with: a dense format's own tensor, in place (`dtype` is ignored); a
  // quantised one dequantised into `scratch`, allocated here in `dtype` on the segments' device
  // on first use and reused after, so only one layer's weights are ever dense at a time.
  TensorView dense(Tensor& scratch, DType dtype) const;
  // A quantised weight's values written into `out`: a tensor of the weight's element count, or a
  // block of a wider matrix's columns with rows of the weight's last dimension (the base weight
  // of a folded LoRA weight, model/llama_layer.h), on the segments' device.
  void dequantize_into(const MatrixView& out) const;
  // A dense format's values in place.
  TensorView values() const;

 private:
  std::vector<TensorView> segment_views() const;
  Tensor allocate_tensor(size_t i, Device device) const;

  const FrozenFormat* format_ = nullptr;
  Shape shape_;
  std::vector<SegmentSpec> specs_;
  std::vector<Tensor> segments_;   // one per spec; undefined while released
  std::vector<Tensor> host_copy_;  // a quantised weight's host bytes while it is on the GPU
};

}  // namespace fsdpq
