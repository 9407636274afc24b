#include "dist/frozen_offload.h"

#include <fmt/format.h>

#include <stdexcept>

#include "quant/nf4_device.h"

namespace fsdpq {
namespace {

template <class T>
void free_vector(std::vector<T>& v) { std::vector<T>().swap(v); }

// Allocates the weight's storage for this segment on the GPU and returns where its bytes go.
uint8_t* device_segment_storage(BaseWeight& w, const FrozenSegment& seg, DType dense_dtype) {
  const int64_t bytes = static_cast<int64_t>(seg.bytes);
  auto allocate = [&](Tensor& t, DType dtype) {
    t = Tensor::empty(Shape{bytes / static_cast<int64_t>(dtype_size(dtype))}, dtype, Device::CUDA);
    return static_cast<uint8_t*>(t.view().data);
  };
  if (seg.kind == SegmentKind::Dense) {
    w.frozen = Tensor::empty(w.shape, dense_dtype, Device::CUDA);
    return static_cast<uint8_t*>(w.frozen.view().data);
  }
  if (!w.nf4) throw std::logic_error(fmt::format("OffloadedFrozen: {} has NF4 segments but no NF4 form", w.name));
  if (!w.nf4_device) {
    w.nf4_device = std::make_unique<Nf4Device>();
    w.nf4_device->numel = w.nf4->numel;
    w.nf4_device->shape = w.nf4->shape;
    w.nf4_device->double_quant = w.nf4->double_quant;
    w.nf4_device->absmax_offset = w.nf4->absmax_offset;
  }
  Nf4Device& d = *w.nf4_device;
  switch (seg.kind) {
    case SegmentKind::Nf4Packed: return allocate(d.packed, DType::U8);
    case SegmentKind::Nf4Absmax: return allocate(d.absmax, DType::F32);
    case SegmentKind::Nf4AbsmaxQ: return allocate(d.absmax_q, DType::U8);
    case SegmentKind::Nf4AbsmaxScale: return allocate(d.absmax_scale, DType::F32);
    case SegmentKind::Dense: break;
  }
  throw std::logic_error("OffloadedFrozen: unknown segment kind");
}

}  // namespace

uint8_t* allocate_segment_storage(BaseWeight& w, const FrozenSegment& seg, DType dense_dtype, Device device) {
  return device == Device::CPU ? segment_storage(w, seg, dense_dtype, true) : device_segment_storage(w, seg, dense_dtype);
}

void evict_frozen_storage(BaseWeight& w) {
  w.nf4_device = nullptr;
  if (w.nf4) {
    free_vector(w.nf4->packed);
    free_vector(w.nf4->absmax);
    free_vector(w.nf4->absmax_q);
    free_vector(w.nf4->absmax_scale);
  } else {
    w.frozen = Tensor();
  }
}

OffloadedFrozen::OffloadedFrozen(const ParamUnit& unit, std::vector<DType> dense_dtypes, Device device)
    : weights_(unit.frozen), dense_dtypes_(std::move(dense_dtypes)), layout_(unit_layout(unit, 1)), device_(device) {
  if (dense_dtypes_.size() != weights_.size()) throw std::logic_error("OffloadedFrozen: one dtype per frozen weight");
  auto* host = static_cast<uint8_t*>(host_.reserve(layout_.frozen_bytes));
  copy_frozen_bytes(layout_, unit, 0, host, layout_.frozen_bytes);
  for (BaseWeight* w : weights_) evict_frozen_storage(*w);
}

void OffloadedFrozen::rebind(const std::vector<BaseWeight*>& weights) {
  if (weights.size() != weights_.size()) throw std::logic_error("OffloadedFrozen: the unit's frozen weights changed");
  weights_ = weights;
}

void OffloadedFrozen::fetch(SideStream& copies) {
  if (state_ != State::Evicted) return;
  const auto* host = static_cast<const uint8_t*>(host_.reserve(layout_.frozen_bytes));
  if (device_ == Device::CUDA) {
    // The blocks just allocated may have been freed by kernels still queued on the compute
    // stream: the copies wait for them.
    std::vector<uint8_t*> dst;
    for (const FrozenSegment& seg : layout_.segments)
      dst.push_back(device_segment_storage(*weights_[seg.weight], seg, dense_dtypes_[seg.weight]));
    copies.wait_for_compute();
    for (size_t i = 0; i < dst.size(); ++i) {
      const FrozenSegment& seg = layout_.segments[i];
      copies.copy(dst[i], Device::CUDA, host + seg.offset, Device::CPU, seg.bytes);
    }
    copied_ = copies.mark();
  } else {
    for (const FrozenSegment& seg : layout_.segments) {
      uint8_t* dst = segment_storage(*weights_[seg.weight], seg, dense_dtypes_[seg.weight], true);
      copies.copy(dst, Device::CPU, host + seg.offset, Device::CPU, seg.bytes);
    }
    copied_ = {};
  }
  state_ = State::InFlight;
}

void OffloadedFrozen::ensure(SideStream& copies) {
  fetch(copies);
  if (state_ == State::InFlight) {
    copied_.compute_waits();
    copied_ = {};
    state_ = State::Ready;
  }
}

void OffloadedFrozen::evict() {
  if (state_ == State::Evicted) return;
  // A copy still in flight writes into the blocks freed below: whatever the compute stream
  // allocates from them next must wait for it.
  if (state_ == State::InFlight) copied_.compute_waits();
  copied_ = {};
  for (BaseWeight* w : weights_) evict_frozen_storage(*w);
  state_ = State::Evicted;
}

}  // namespace fsdpq
