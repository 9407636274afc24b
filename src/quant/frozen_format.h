// How a frozen base weight is stored: one implementation per format (ggml's type traits, as a
// class): dense values, NF4 with or without double quantisation (docs/nf4.md), or HQQ
// (docs/hqq.md). A format holds no bytes (FrozenStorage does, quant/frozen_storage.h): it says which
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
// A value segment whose bytes also depend on the scalars (HQQ's codes and zero points: the
// solver stops when the error of the whole tensor stops falling) is marked needs_scalars: step 1
// only measures its values (measure_values: the statistics), and step 2 encodes it from the same
// values and the scalars (encode_values_with_scalars). Its caller keeps the values in between.
// Between the two the caller completes the statistics vector: a rank leaves kUnknownStatistic
// where it computed nothing and a shard group max-reduces the vector (fsdp/shard_loader.cpp); a
// caller holding every value (a shard group of one) has nothing to complete. So the per-range
// math is here and the collective is the sharder's, moving floats it need not understand.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "backend/matrix_view.h"
#include "backend/tensor.h"
#include "util/dtype.h"

namespace fsdpq {

// One contiguous byte buffer of a stored weight.
struct SegmentSpec {
  std::string name;             // "values", "codes", "absmax", "absmax_codes", "absmax_scales"
  size_t bytes = 0;
  DType element = DType::U8;    // what the bytes hold (how a device allocates them)
  bool from_statistics = false;  // encoded in step 2 (from the statistics), not from values
  bool needs_scalars = false;    // a value segment encoded in step 2, from its values and the scalars
};

// Elements [first, first + count) of a weight, flat.
struct ElementRange {
  int64_t first = 0, count = 0;
  bool operator==(const ElementRange&) const = default;
};
// Ascending, disjoint ranges; their values are given concatenated in this order.
using ElementRanges = std::vector<ElementRange>;
int64_t element_count(const ElementRanges& ranges);

// What a stored weight keeps outside its segments, whole on every rank (it is not sharded).
struct FrozenScalars {
  float absmax_offset = 0.0f;  // NF4 with double quantisation: the mean absmax
  int hqq_zero_updates = 0;    // HQQ: how many updates its solver made to every zero point
};

inline constexpr float kUnknownStatistic = -std::numeric_limits<float>::infinity();

class FrozenFormat {
 public:
  virtual ~FrozenFormat() = default;
  virtual std::string name() const = 0;  // "bf16", "nf4", "nf4 (double-quantised absmax)", "hqq 4-bit"
  // False for dense values, which the ops read in place; true where they must be dequantised.
  virtual bool quantized() const = 0;
  // The segments of a weight of `numel` elements, in the order a unit's flat layout places them.
  virtual std::vector<SegmentSpec> segments(int64_t numel) const = 0;
  // The dtypes encode_values accepts the values in (the first is what a reader should give).
  virtual bool accepts_values(DType dtype) const = 0;

  // ---- 1. value segments ----
  // The elements whose values decide bytes [from, to) of value segment `segment` (one range but
  // for HQQ's codes, whose bytes each hold values of several groups far apart).
  virtual ElementRanges values_for(int segment, int64_t numel, size_t from, size_t to) const = 0;
  // Writes bytes [from, to) of the segment to `out`, from `values` (the elements of
  // values_for(...), concatenated, in `dtype`), and the statistics of those elements into
  // `statistics` (statistics_count floats for the whole tensor; entries of other elements
  // untouched). Not for needs_scalars segments.
  virtual void encode_values(int segment, int64_t numel, size_t from, size_t to, const void* values, DType dtype,
                             uint8_t* out, float* statistics) const = 0;
  // Whether those bytes are the values values_for(...) names, as read in `dtype` (dense values,
  // whole elements): the caller may then read them straight into `out` and skip encode_values,
  // which saves a copy of the largest tensors (the embedding) while loading.
  virtual bool stores_values_as_read(int segment, size_t from, size_t to, DType dtype) const;

  // A needs_scalars segment's step 1: only the statistics of the values (as encode_values).
  virtual void measure_values(int segment, int64_t numel, size_t from, size_t to, const void* values, DType dtype,
                              float* statistics) const;

  // ---- 2. statistics segments, and value segments that need the scalars ----
  virtual int64_t statistics_count(int64_t numel) const;
  virtual FrozenScalars scalars_from(const float* statistics, int64_t numel) const;
  // Writes bytes [from, to) of statistics segment `segment` to `out`.
  virtual void encode_statistics(int segment, int64_t numel, size_t from, size_t to, const float* statistics,
                                 const FrozenScalars& scalars, uint8_t* out) const;
  // Writes bytes [from, to) of needs_scalars segment `segment` to `out`, from the values
  // measure_values was given and the scalars.
  virtual void encode_values_with_scalars(int segment, int64_t numel, size_t from, size_t to, const void* values,
                                          DType dtype, const FrozenScalars& scalars, uint8_t* out) const;
  // encode_values_with_scalars for every needs_scalars piece of one weight a caller holds, together,
  // so a format whose segments share work does it once (HQQ: its codes and zero points need the
  // same solver run). The default encodes the pieces one by one.
  struct ScalarsPiece {
    int segment = 0;
    size_t from = 0, to = 0;
    const void* values = nullptr;  // as measure_values (or values_for) had them
    DType dtype = DType::F32;
    uint8_t* out = nullptr;
  };
  virtual void encode_pieces_with_scalars(int64_t numel, std::span<const ScalarsPiece> pieces,
                                          const FrozenScalars& scalars) const;

  // ---- decoding ----
  // out (`numel` elements, F32, BF16 or F16, on the segments' device) = the stored values, as
  // the ops compute with them. `segments` are the weight's segments in order. A quantised format
  // also writes into a block of a wider matrix's columns (backend/matrix_view.h) whose rows are the
  // weight's last dimension (on the CPU, rows of whole 64-value blocks or groups); a dense one
  // only into a whole tensor.
  virtual void dequantize(std::span<const TensorView> segments, const FrozenScalars& scalars, int64_t numel,
                          const MatrixView& out) const = 0;

 protected:
  // A CPU dequantisation into a block of a wider matrix's columns, row by row: fn(first, count,
  // row) for each row, its values units [first, first + count) of `unit` values each (NF4's blocks,
  // HQQ's groups), `row` its first value in out. A row that is not whole units is a logic_error.
  void for_each_row(const MatrixView& out, int64_t unit, const char* units,
                    const std::function<void(int64_t first, int64_t count, void* row)>& fn) const;
};

// Dense values stored as `dtype` (BF16, F16 or F32).
const FrozenFormat& dense_format(DType dtype);
// NF4 in bitsandbytes' layout; `double_quant` is compress_statistics (fsdp_qlora's default).
const FrozenFormat& nf4_format(bool double_quant);
// HQQ in hqq's layout (quant/hqq.h): `n_bits` 1, 2, 3, 4 or 8; zero points and scales in `meta`
// (fsdp_qlora's compute dtype: BF16 or F16); the solver in float16 as on a GPU, unless
// `float_solver` (hqq on the CPU, for its reference vectors).
const FrozenFormat& hqq_format(int n_bits, DType meta, bool float_solver = false);

// The bytes of every segment together (what the weight costs, before alignment).
size_t stored_bytes(const FrozenFormat& format, int64_t numel);

}  // namespace fsdpq
