// The flat layout of one FSDP unit (docs/sharding.md), computed from shapes alone, so that a rank
// knows which bytes of which weight it owns before anything is read:
//   frozen bytes: each frozen weight's storage segments (quant/frozen_format.h: dense values; or
//     NF4 packed codes, then absmax or the double-quantised absmax codes and their group scales),
//     each segment 16-byte aligned; split into shards of frozen_shard_bytes (a multiple of the
//     all-gather granule), shard r = bytes [r * frozen_shard_bytes, (r + 1) * frozen_shard_bytes).
//   trainable elements: every trainable tensor's elements concatenated, split into shards of
//     shard_numel elements (the last one padded with zeros).
// What the segments hold is the format's business: here they are byte counts.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "quant/frozen_format.h"

namespace fsdpq {

struct ParamUnit;

// One contiguous piece of a frozen weight in the unit's flat bytes: segment `segment` of the
// unit's frozen weight `weight` (FrozenStorage::segment).
struct FrozenSegment {
  size_t weight = 0;
  size_t segment = 0;
  size_t offset = 0, bytes = 0;
};

// A frozen weight as the layout sees it: its format and element count.
struct FrozenWeightShape {
  const FrozenFormat* format = nullptr;
  int64_t numel = 0;
};

struct UnitLayout {
  std::vector<FrozenSegment> segments;  // in offset order; empty segments are left out
  size_t frozen_bytes = 0, frozen_shard_bytes = 0;
  std::vector<int64_t> trainable_offset;  // per trainable tensor, within the flat trainable elements
  int64_t trainable_numel = 0, shard_numel = 0;

  size_t frozen_begin(int shard_rank) const { return frozen_shard_bytes * static_cast<size_t>(shard_rank); }
  int64_t trainable_begin(int shard_rank) const { return shard_numel * shard_rank; }
};

inline constexpr size_t kSegmentAlignment = 16;  // each segment starts aligned, as FSDP's flat params

UnitLayout unit_layout(const std::vector<FrozenWeightShape>& frozen, const std::vector<int64_t>& trainable_numel,
                       int shard_size);
// The layout of a unit, built or a skeleton (from its weights' formats and shapes).
UnitLayout unit_layout(const ParamUnit& unit, int shard_size);

// Bytes [begin, begin + count) of a built unit's flat frozen bytes, from its weights' segments;
// bytes past the last segment, and alignment gaps, are zero.
void copy_frozen_bytes(const UnitLayout& layout, const ParamUnit& unit, size_t begin, uint8_t* out, size_t count);

}  // namespace fsdpq
