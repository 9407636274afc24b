// How a frozen base weight is stored: one implementation per format (ggml's type traits, as a
// class): dense values, or NF4 with or without double quantisation (docs/nf4.md); HQQ would be
// one more. A format holds no bytes (FrozenStorage does, quant/frozen_storage.h): it says which
// byte segments a weight of n elements has, computes them from the weight's values range by
// range, and turns them back into values.
//
// Range by range, because a rank of a shard group encodes only the bytes it holds
// (docs/sharding.md) and some bytes depend on the whole tensor. Encoding is split in two:
//   1. value segments (dense values, NF4 codes): bytes [from, to) come from the values of the
//      elements values_for() names, read by the caller; encode_values also writes the
//      statistics those elements decide (NF4: each block's absmax) at their index in the
//      tensor's statistics vector;
//   2. statistics segments (NF4's absmax and its double quantisation): once every statistic is
//      known, scalars_from() computes the per-tensor scalars (NF4's absmax offset) and
//      encode_statistics() any byte range of them.
// Between the two the caller completes the statistics vector: a rank leaves kUnknownStatistic
// where it computed nothing and a shard group max-reduces the vector (dist/shard_loader.cpp); a
// caller holding every value (a shard group of one) has nothing to complete. So the per-range
// math is here and the collective is the sharder's, moving floats it need not understand.
#pragma once
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "backend/tensor.h"
#include "util/dtype.h"

namespace fsdpq {

// One contiguous byte buffer of a stored weight.
struct SegmentSpec {
  std::string name;             // "values", "codes", "absmax", "absmax_codes", "absmax_scales"
  size_t bytes = 0;
  DType element = DType::U8;    // what the bytes hold (how a device allocates them)
  bool from_statistics = false;  // encoded in step 2 (from the statistics), not from values
};

// Elements [first, first + count) of a weight, flat.
struct ElementRange {
  int64_t first = 0, count = 0;
};

// What a stored weight keeps outside its segments, whole on every rank (it is not sharded).
struct FrozenScalars {
  float absmax_offset = 0.0f;  // NF4 with double quantisation: the mean absmax
};

inline constexpr float kUnknownStatistic = -std::numeric_limits<float>::infinity();

class FrozenFormat {
 public:
  virtual ~FrozenFormat() = default;
  virtual std::string name() const = 0;  // "bf16", "nf4", "nf4 (double-quantised absmax)"
  // False for dense values, which the ops read in place; true where they must be dequantised.
  virtual bool quantized() const = 0;
  // The segments of a weight of `numel` elements, in the order a unit's flat layout places them.
  virtual std::vector<SegmentSpec> segments(int64_t numel) const = 0;
  // The dtypes encode_values accepts the values in (the first is what a reader should give).
  virtual bool accepts_values(DType dtype) const = 0;

  // ---- 1. value segments ----
  // The elements whose values decide bytes [from, to) of value segment `segment`.
  virtual ElementRange values_for(int segment, int64_t numel, size_t from, size_t to) const = 0;
  // Writes bytes [from, to) of the segment to `out`, from `values` (elements values_for(...),
  // in `dtype`), and the statistics of those elements into `statistics` (statistics_count
  // floats for the whole tensor; entries of other elements untouched).
  virtual void encode_values(int segment, int64_t numel, size_t from, size_t to, const void* values, DType dtype,
                             uint8_t* out, float* statistics) const = 0;
  // Whether those bytes are the values values_for(...) names, as read in `dtype` (dense values,
  // whole elements): the caller may then read them straight into `out` and skip encode_values,
  // which saves a copy of the largest tensors (the embedding) while loading.
  virtual bool stores_values_as_read(int segment, size_t from, size_t to, DType dtype) const;

  // ---- 2. statistics segments ----
  virtual int64_t statistics_count(int64_t numel) const;
  virtual FrozenScalars scalars_from(const float* statistics, int64_t numel) const;
  // Writes bytes [from, to) of statistics segment `segment` to `out`.
  virtual void encode_statistics(int segment, int64_t numel, size_t from, size_t to, const float* statistics,
                                 const FrozenScalars& scalars, uint8_t* out) const;

  // ---- decoding ----
  // out (`numel` elements, F32, BF16 or F16, on the segments' device) = the stored values, as
  // the ops compute with them. `segments` are the weight's segments in order.
  virtual void dequantize(std::span<const TensorView> segments, const FrozenScalars& scalars, int64_t numel,
                          TensorView out) const = 0;
};

// Dense values stored as `dtype` (BF16, F16 or F32).
const FrozenFormat& dense_format(DType dtype);
// NF4 in bitsandbytes' layout; `double_quant` is compress_statistics (fsdp_qlora's default).
const FrozenFormat& nf4_format(bool double_quant);

// The bytes of every segment together (what the weight costs, before alignment).
size_t stored_bytes(const FrozenFormat& format, int64_t numel);

}  // namespace fsdpq
