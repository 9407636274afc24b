#include "dist/frozen_layout.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "dist/collectives.h"
#include "model/llama_weights.h"

namespace fsdpq {
namespace {

size_t round_up(size_t n, size_t multiple) { return (n + multiple - 1) / multiple * multiple; }
size_t ceil_div(size_t n, size_t d) { return (n + d - 1) / d; }

}  // namespace

UnitLayout unit_layout(const std::vector<FrozenWeightShape>& frozen, const std::vector<int64_t>& trainable_numel,
                       int shard_size) {
  if (shard_size < 1) throw std::logic_error("unit_layout: shard size must be at least 1");
  const size_t S = static_cast<size_t>(shard_size);
  UnitLayout layout;
  size_t offset = 0;
  auto add = [&](size_t weight, SegmentKind kind, size_t bytes) {
    if (bytes == 0) return;
    offset = round_up(offset, kSegmentAlignment);
    layout.segments.push_back({weight, kind, offset, bytes});
    offset += bytes;
  };
  for (size_t k = 0; k < frozen.size(); ++k) {
    const FrozenWeightShape& w = frozen[k];
    if (!w.nf4) {
      add(k, SegmentKind::Dense, static_cast<size_t>(w.numel) * dtype_size(w.dense_dtype));
      continue;
    }
    const auto blocks = static_cast<size_t>(nf4_num_blocks(w.numel));
    add(k, SegmentKind::Nf4Packed, static_cast<size_t>(nf4_packed_bytes(w.numel)));
    if (w.double_quant) {
      add(k, SegmentKind::Nf4AbsmaxQ, blocks);
      add(k, SegmentKind::Nf4AbsmaxScale, ceil_div(blocks, static_cast<size_t>(kNf4AbsmaxBlockSize)) * sizeof(float));
    } else {
      add(k, SegmentKind::Nf4Absmax, blocks * sizeof(float));
    }
  }
  layout.frozen_bytes = offset;
  layout.frozen_shard_bytes = round_up(ceil_div(layout.frozen_bytes, S), Communicator::kAllGatherGranule);
  for (int64_t n : trainable_numel) {
    layout.trainable_offset.push_back(layout.trainable_numel);
    layout.trainable_numel += n;
  }
  layout.shard_numel = static_cast<int64_t>(ceil_div(static_cast<size_t>(layout.trainable_numel), S));
  return layout;
}

FrozenWeightShape frozen_weight_shape(const BaseWeight& weight, DType dense_dtype) {
  FrozenWeightShape shape;
  shape.numel = weight.shape.numel();
  if (weight.nf4) {
    shape.nf4 = true;
    shape.double_quant = weight.nf4->double_quant;
  } else {
    shape.dense_dtype = dense_dtype;
  }
  return shape;
}

UnitLayout unit_layout(const ParamUnit& unit, int shard_size) {
  std::vector<FrozenWeightShape> frozen;
  for (const BaseWeight* w : unit.frozen)
    frozen.push_back(frozen_weight_shape(*w, w->frozen.defined() ? w->frozen.dtype() : DType::U8));
  std::vector<int64_t> trainable;
  for (const TrainableTensor* t : unit.trainable) trainable.push_back(t->master.numel());
  return unit_layout(frozen, trainable, shard_size);
}

uint8_t* segment_storage(BaseWeight& w, const FrozenSegment& segment, DType dense_dtype, bool allocate) {
  const size_t bytes = segment.bytes;
  switch (segment.kind) {
    case SegmentKind::Dense:
      if (allocate) w.frozen = Tensor::empty(w.shape, dense_dtype);
      return static_cast<uint8_t*>(w.frozen.view().data);
    case SegmentKind::Nf4Packed:
      if (allocate) w.nf4->packed.resize(bytes);
      return w.nf4->packed.data();
    case SegmentKind::Nf4Absmax:
      if (allocate) w.nf4->absmax.resize(bytes / sizeof(float));
      return reinterpret_cast<uint8_t*>(w.nf4->absmax.data());
    case SegmentKind::Nf4AbsmaxQ:
      if (allocate) w.nf4->absmax_q.resize(bytes);
      return w.nf4->absmax_q.data();
    case SegmentKind::Nf4AbsmaxScale:
      if (allocate) w.nf4->absmax_scale.resize(bytes / sizeof(float));
      return reinterpret_cast<uint8_t*>(w.nf4->absmax_scale.data());
  }
  return nullptr;
}

void copy_frozen_bytes(const UnitLayout& layout, const ParamUnit& unit, size_t begin, uint8_t* out, size_t count) {
  std::memset(out, 0, count);
  const size_t end = begin + count;
  for (const FrozenSegment& seg : layout.segments) {
    const size_t lo = std::max(begin, seg.offset), hi = std::min(end, seg.offset + seg.bytes);
    if (lo >= hi) continue;
    BaseWeight& w = *unit.frozen[seg.weight];
    const uint8_t* src = segment_storage(w, seg, w.frozen.defined() ? w.frozen.dtype() : DType::U8, false);
    std::memcpy(out + (lo - begin), src + (lo - seg.offset), hi - lo);
  }
}

}  // namespace fsdpq
