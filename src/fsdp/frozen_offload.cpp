#include "fsdp/frozen_offload.h"

#include <fmt/format.h>

#include <stdexcept>

namespace fsdpq {

uint8_t* allocate_segment_storage(BaseWeight& w, const FrozenSegment& seg, Device device) {
  const std::span<uint8_t> bytes = w.frozen.allocate(seg.segment, device);
  if (bytes.size() != seg.bytes)
    throw std::logic_error(fmt::format("{}: segment {} has {} bytes, the layout {}", w.name, seg.segment, bytes.size(),
                                       seg.bytes));
  return bytes.data();
}

void evict_frozen_storage(BaseWeight& w) { w.frozen.release(); }

OffloadedFrozen::OffloadedFrozen(const ParamUnit& unit, Device device)
    : weights_(unit.frozen), layout_(unit_layout(unit, 1)), device_(device) {
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
      dst.push_back(allocate_segment_storage(*weights_[seg.weight], seg, Device::CUDA));
    copies.wait_for_compute();
    for (size_t i = 0; i < dst.size(); ++i) {
      const FrozenSegment& seg = layout_.segments[i];
      copies.copy(dst[i], Device::CUDA, host + seg.offset, Device::CPU, seg.bytes);
    }
    copied_ = copies.mark();
  } else {
    for (const FrozenSegment& seg : layout_.segments) {
      uint8_t* dst = allocate_segment_storage(*weights_[seg.weight], seg, Device::CPU);
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
