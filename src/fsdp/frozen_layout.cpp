#include "fsdp/frozen_layout.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "fsdp/collectives.h"
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
  for (size_t k = 0; k < frozen.size(); ++k) {
    const std::vector<SegmentSpec> segments = frozen[k].format->segments(frozen[k].numel);
    for (size_t i = 0; i < segments.size(); ++i) {
      if (segments[i].bytes == 0) continue;
      offset = round_up(offset, kSegmentAlignment);
      layout.segments.push_back({k, i, offset, segments[i].bytes});
      offset += segments[i].bytes;
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

UnitLayout unit_layout(const ParamUnit& unit, int shard_size) {
  std::vector<FrozenWeightShape> frozen;
  for (const BaseWeight* w : unit.frozen) frozen.push_back({&w->frozen.format(), w->frozen.numel()});
  std::vector<int64_t> trainable;
  for (const TrainableTensor* t : unit.trainable) trainable.push_back(t->shape.numel());
  return unit_layout(frozen, trainable, shard_size);
}

void copy_frozen_bytes(const UnitLayout& layout, const ParamUnit& unit, size_t begin, uint8_t* out, size_t count) {
  if (count == 0) return;  // an empty shard: out may be null, which memset may not be given
  std::memset(out, 0, count);
  const size_t end = begin + count;
  for (const FrozenSegment& seg : layout.segments) {
    const size_t lo = std::max(begin, seg.offset), hi = std::min(end, seg.offset + seg.bytes);
    if (lo >= hi) continue;
    const std::span<const uint8_t> src = std::as_const(unit.frozen[seg.weight]->frozen).segment(seg.segment);
    if (src.size() != seg.bytes)
      throw std::logic_error(fmt::format("copy_frozen_bytes: '{}' holds {} bytes of segment {}, the layout {}",
                                         unit.frozen[seg.weight]->name, src.size(), seg.segment, seg.bytes));
    std::memcpy(out + (lo - begin), src.data() + (lo - seg.offset), hi - lo);
  }
}

}  // namespace fsdpq
