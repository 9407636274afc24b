// The flat layout of one FSDP unit (docs/sharding.md), computed from shapes alone, so that a rank
// knows which bytes of which weight it owns before anything is read:
//   frozen bytes: each frozen weight's storage, segment by segment (dense values; or NF4 packed
//     codes, then absmax or the double-quantised absmax codes and their group scales), each
//     segment 16-byte aligned; split into shards of frozen_shard_bytes (a multiple of the
//     all-gather granule), shard r = bytes [r * frozen_shard_bytes, (r + 1) * frozen_shard_bytes).
//   trainable elements: every trainable tensor's elements concatenated, split into shards of
//     shard_numel elements (the last one padded with zeros).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "util/dtype.h"

namespace fsdpq {

struct BaseWeight;
struct ParamUnit;

enum class SegmentKind { Dense, Nf4Packed, Nf4Absmax, Nf4AbsmaxQ, Nf4AbsmaxScale };

// One contiguous piece of a frozen weight in the unit's flat bytes.
struct FrozenSegment {
  size_t weight = 0;  // index into the unit's frozen weights
  SegmentKind kind = SegmentKind::Dense;
  size_t offset = 0, bytes = 0;
};

// What a frozen weight is stored as: NF4 (with or without double quantisation) or dense values.
struct FrozenWeightShape {
  int64_t numel = 0;
  bool nf4 = false;
  bool double_quant = false;
  DType dense_dtype = DType::BF16;  // dense weights only
};

struct UnitLayout {
  std::vector<FrozenSegment> segments;  // in offset order
  size_t frozen_bytes = 0, frozen_shard_bytes = 0;
  std::vector<int64_t> trainable_offset;  // per trainable tensor, within the flat trainable elements
  int64_t trainable_numel = 0, shard_numel = 0;

  size_t frozen_begin(int shard_rank) const { return frozen_shard_bytes * static_cast<size_t>(shard_rank); }
  int64_t trainable_begin(int shard_rank) const { return shard_numel * shard_rank; }
};

inline constexpr size_t kSegmentAlignment = 16;  // each segment starts aligned, as FSDP's flat params

UnitLayout unit_layout(const std::vector<FrozenWeightShape>& frozen, const std::vector<int64_t>& trainable_numel,
                       int shard_size);

// A built weight's storage kind; `dense_dtype` is used when the weight has no NF4 form.
FrozenWeightShape frozen_weight_shape(const BaseWeight& weight, DType dense_dtype);
// The layout of a unit whose tensors are all built (dense weights in their tensors' dtype).
UnitLayout unit_layout(const ParamUnit& unit, int shard_size);

// The segment's bytes in the weight's own storage; `allocate` sizes that storage first (dense
// weights as `dense_dtype` tensors of the weight's shape).
uint8_t* segment_storage(BaseWeight& weight, const FrozenSegment& segment, DType dense_dtype, bool allocate);

// Bytes [begin, begin + out.size()) of a built unit's flat frozen bytes; bytes past the last
// segment, and alignment gaps, are zero.
void copy_frozen_bytes(const UnitLayout& layout, const ParamUnit& unit, size_t begin, uint8_t* out, size_t count);

}  // namespace fsdpq
