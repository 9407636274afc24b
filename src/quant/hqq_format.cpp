// HQQ as a frozen format (docs/hqq.md, quant/hqq.h): three segments in hqq's layout — the packed
// codes (hqq's W_q), the zero points and the scales (hqq's meta "zero_scale", one 16-bit value
// per group each). The codes and zero points need the number of solver updates, which the error
// of the whole tensor decides, so they are needs_scalars segments: step 1 runs the solver's 20
// iterations over blocks of 64 groups and keeps each block's error sum per iteration as
// statistics; scalars_from() sums the blocks into the tensor's errors and finds the number of
// updates; step 2 runs that many updates for the groups under the bytes. The scales come from
// each group's minimum and maximum alone: step 1 keeps them as statistics too (one per group, as
// NF4 keeps its absmax), so the scales segment is encoded from statistics and its owner reads no
// values (a shard group's ranks together read a linear about twice, not three times).
//
// The statistics of a weight: [blocks x 20 error sums][groups scales].
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <vector>

#include "quant/frozen_format.h"
#include "quant/hqq.h"
#include "quant/hqq_device.h"
#include "quant/hqq_solve.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

enum HqqSegment : int { kCodes = 0, kZeros = 1, kScales = 2 };

// The solver's errors are statistics per block of this many groups: a rank measuring a block
// reads all of it (values_for rounds the codes' groups out to whole blocks).
constexpr int64_t kBlockGroups = 64;

int64_t ceil_div(int64_t n, int64_t d) { return (n + d - 1) / d; }

// Groups [first, end) of a weight.
struct GroupRange {
  int64_t first = 0, end = 0;
};

// Where each group's values are in the concatenated values of some element ranges.
class GroupValues {
 public:
  GroupValues(const ElementRanges& ranges, const void* values, DType dtype)
      : ranges_(ranges), values_(static_cast<const uint8_t*>(values)), dtype_(dtype) {}
  // Group g's 64 values as fp32 (g must lie in the ranges).
  void read(int64_t g, float* out) const {
    int64_t offset = 0;
    for (const ElementRange& r : ranges_) {
      const int64_t first = g * kHqqGroupSize;
      if (first >= r.first && first < r.first + r.count) {
        const int64_t at = offset + (first - r.first);
        if (dtype_ == DType::F32) {
          std::memcpy(out, values_ + at * 4, kHqqGroupSize * 4);
        } else {
          const auto* h = reinterpret_cast<const uint16_t*>(values_) + at;
          for (int64_t j = 0; j < kHqqGroupSize; ++j) out[j] = bf16_to_float(h[j]);
        }
        return;
      }
      offset += r.count;
    }
    throw std::logic_error(fmt::format("hqq: group {} is not among the values given", g));
  }
  // The solver's reader of groups first, first + 1, ... (its group 0 is group `first`).
  HqqGroupReader from(int64_t first) const {
    return [this, first](int64_t g, float* out) { read(first + g, out); };
  }

 private:
  const ElementRanges& ranges_;
  const uint8_t* values_;
  DType dtype_;
};

ElementRanges elements_of(std::vector<GroupRange> groups) {
  std::sort(groups.begin(), groups.end(), [](const GroupRange& a, const GroupRange& b) { return a.first < b.first; });
  ElementRanges out;
  for (const GroupRange& g : groups) {
    if (g.first >= g.end) continue;
    const int64_t first = g.first * kHqqGroupSize, end = g.end * kHqqGroupSize;
    if (!out.empty() && first <= out.back().first + out.back().count)
      out.back().count = std::max(out.back().count, end - out.back().first);
    else
      out.push_back({first, end - first});
  }
  return out;
}

// Packed row r's bytes (hqq's words, little-endian int32 for 3 bits): word j holds code j of
// group k * rows + r of every slice k, from the values and that group's solver result
// (group_of(k), absent past the last group: 3 bits' padding rows hold code 0).
template <class GroupOf>
void pack_row(const HqqPacking& p, int64_t r, const GroupValues& source, const GroupOf& group_of, uint8_t* bytes) {
  std::array<uint32_t, kHqqGroupSize> words{};
  for (int k = 0; k < p.slices; ++k) {
    const int64_t g = k * p.rows + r;
    if (g >= p.groups) break;
    std::array<float, kHqqGroupSize> values;
    std::array<uint8_t, kHqqGroupSize> codes;
    source.read(g, values.data());
    hqq_group_codes(values.data(), group_of(k), p.n_bits, codes.data());
    for (size_t j = 0; j < words.size(); ++j) words[j] |= uint32_t{codes[j]} << p.shift(k);
  }
  for (size_t j = 0; j < words.size(); ++j)
    for (size_t b = 0; b < static_cast<size_t>(p.word_bytes); ++b)
      bytes[j * static_cast<size_t>(p.word_bytes) + b] = static_cast<uint8_t>(words[j] >> (8 * b));
}

class HqqFormat final : public FrozenFormat {
 public:
  HqqFormat(int n_bits, DType meta, HqqSolverPrecision precision) : n_bits_(n_bits), meta_(meta), precision_(precision) {}

  std::string name() const override {
    return fmt::format("hqq {}-bit ({} zero points and scales{})", n_bits_, dtype_name(meta_),
                       precision_ == HqqSolverPrecision::kFloat ? ", fp32 solver" : "");
  }
  bool quantized() const override { return true; }

  std::vector<SegmentSpec> segments(int64_t numel) const override {
    const HqqPacking p = packing(numel);
    const auto meta_bytes = static_cast<size_t>(p.groups) * 2;
    return {{"codes", static_cast<size_t>(p.bytes()), DType::U8, false, true},
            {"zeros", meta_bytes, meta_, false, true},
            {"scales", meta_bytes, meta_, true, false}};
  }

  bool accepts_values(DType dtype) const override { return dtype == DType::BF16 || dtype == DType::F32; }

  ElementRanges values_for(int segment, int64_t numel, size_t from, size_t to) const override {
    const HqqPacking p = packing(numel);
    if (segment == kZeros) return elements_of({meta_groups(from, to)});
    if (segment != kCodes) throw std::logic_error(fmt::format("{}: segment {} is not encoded from values", name(), segment));
    // Every slice's groups under the rows, rounded out to whole blocks for measure_values.
    std::vector<GroupRange> groups = code_groups(p, from, to);
    for (GroupRange& g : groups)
      g = {g.first / kBlockGroups * kBlockGroups, std::min(ceil_div(g.end, kBlockGroups) * kBlockGroups, p.groups)};
    return elements_of(groups);
  }

  // Every segment with values needs the scalars (codes, zero points) or is encoded from statistics
  // (scales).
  void encode_values(int segment, int64_t, size_t, size_t, const void*, DType, uint8_t*, float*) const override {
    throw std::logic_error(fmt::format("{}: segment {} is not encoded from values alone", name(), segment));
  }

  int64_t statistics_count(int64_t numel) const override {
    const int64_t groups = packing(numel).groups;
    return error_statistics(groups) + groups;
  }

  // The codes' owners measure every block under their rows: each block's error sum per
  // iteration, over all 20 iterations (the stop is not known yet), and each of its groups' scale.
  void measure_values(int segment, int64_t numel, size_t from, size_t to, const void* values, DType dtype,
                      float* statistics) const override {
    if (segment == kZeros) return;  // the codes' owners measure every block
    if (segment != kCodes) FrozenFormat::measure_values(segment, numel, from, to, values, dtype, statistics);
    check_dtype(dtype);
    const ElementRanges ranges = values_for(segment, numel, from, to);
    const GroupValues source(ranges, values, dtype);
    // Each range is whole blocks (values_for): solve them all at once, 20 iterations, keeping each
    // block's error sums.
    for (const ElementRange& r : ranges) {
      const int64_t first = r.first / kHqqGroupSize, end = (r.first + r.count) / kHqqGroupSize;
      const HqqSolved solved = hqq_solve_groups(source.from(first), end - first, n_bits_, kHqqSolverIterations,
                                                precision_, /*block_errors=*/true);
      for (size_t k = 0; k < solved.block_errors.size(); ++k)
        statistics[first / kBlockGroups * kHqqSolverIterations + static_cast<int64_t>(k)] =
            static_cast<float>(solved.block_errors[k]);
      // The solver moves only the zero point: a group's scale is its start's, > 0.
      float* scales = statistics + error_statistics(packing(numel).groups);
      for (int64_t g = first; g < end; ++g) scales[g] = solved.groups[static_cast<size_t>(g - first)].scale;
    }
  }

  // The scales: 1 / scale of each group under the bytes, as stored.
  void encode_statistics(int segment, int64_t numel, size_t from, size_t to, const float* statistics,
                         const FrozenScalars& scalars, uint8_t* out) const override {
    if (segment != kScales) FrozenFormat::encode_statistics(segment, numel, from, to, statistics, scalars, out);
    const float* scales = statistics + error_statistics(packing(numel).groups);
    write_meta(meta_groups(from, to), from, to, out,
               [&](int64_t g) { return hqq_stored({scales[g], 0.0f}, precision_, meta_).scale; });
  }

  FrozenScalars scalars_from(const float* statistics, int64_t numel) const override {
    std::array<double, kHqqSolverIterations> sums{};
    const int64_t blocks = error_statistics(packing(numel).groups) / kHqqSolverIterations;
    for (int64_t b = 0; b < blocks; ++b)
      for (int i = 0; i < kHqqSolverIterations; ++i) sums[static_cast<size_t>(i)] += statistics[b * kHqqSolverIterations + i];
    FrozenScalars s;
    s.hqq_zero_updates = hqq_zero_updates(sums, numel, precision_);
    return s;
  }

  void encode_values_with_scalars(int segment, int64_t numel, size_t from, size_t to, const void* values, DType dtype,
                                  const FrozenScalars& scalars, uint8_t* out) const override {
    SolvedGroups solved;
    encode_piece({segment, from, to, values, dtype, out}, numel, scalars, solved);
  }

  // The codes first: their solver run gives the zero points of the same groups (a rank holding a
  // weight's codes holds its zero points' groups too), so the solver runs once, not twice.
  void encode_pieces_with_scalars(int64_t numel, std::span<const ScalarsPiece> pieces,
                                  const FrozenScalars& scalars) const override {
    SolvedGroups solved;
    for (const ScalarsPiece& piece : pieces)
      if (piece.segment == kCodes) encode_piece(piece, numel, scalars, solved);
    for (const ScalarsPiece& piece : pieces)
      if (piece.segment != kCodes) encode_piece(piece, numel, scalars, solved);
  }

  void dequantize(std::span<const TensorView> segments, const FrozenScalars&, int64_t numel,
                  const MatrixView& out) const override {
    if (segments.size() != 3u || out.numel() != numel)
      throw std::logic_error(fmt::format("{} weight of {} elements: cannot dequantise into {} columns [{}, {})", name(),
                                         numel, out.tensor.describe(), out.first_column, out.first_column + out.cols()));
    const HqqPacking p = packing(numel);
    const auto* codes = static_cast<const uint8_t*>(segments[kCodes].data);
    const auto* zeros = static_cast<const uint16_t*>(segments[kZeros].data);
    const auto* scales = static_cast<const uint16_t*>(segments[kScales].data);
    if (out.device() == Device::CUDA) return hqq_dequantize(HqqDeviceSegments{codes, zeros, scales, meta_, p}, out);
    if (out.whole()) return hqq_dequantize_groups(p, codes, zeros, scales, meta_, 0, p.groups, out.dtype(), out.data());
    for_each_row(out, kHqqGroupSize, "groups", [&](int64_t first, int64_t count, void* row) {
      hqq_dequantize_groups(p, codes, zeros, scales, meta_, first, count, out.dtype(), row);
    });
  }

 private:
  HqqPacking packing(int64_t numel) const { return HqqPacking::of(n_bits_, numel); }

  // How many of a weight's statistics are error sums (the scales follow them).
  static int64_t error_statistics(int64_t groups) { return ceil_div(groups, kBlockGroups) * kHqqSolverIterations; }
  // Groups a solver run has given (after the run's number of updates), by range.
  struct SolvedGroups {
    std::vector<std::pair<GroupRange, std::vector<HqqGroup>>> runs;
    // Groups [first, end) if runs hold them all (false otherwise, `out` untouched), copied a run's
    // stretch at a time (a 7B weight's zero points are 700 K groups).
    bool find(int64_t first, int64_t end, std::vector<HqqGroup>& out) const {
      std::vector<HqqGroup> found;
      found.reserve(static_cast<size_t>(end - first));
      for (int64_t g = first; g < end;) {
        const auto run = std::find_if(runs.begin(), runs.end(),
                                      [&](const auto& r) { return g >= r.first.first && g < r.first.end; });
        if (run == runs.end()) return false;
        const int64_t stop = std::min(end, run->first.end);
        const auto from_run = run->second.begin() + (g - run->first.first);
        found.insert(found.end(), from_run, from_run + (stop - g));
        g = stop;
      }
      out = std::move(found);
      return true;
    }
  };

  // One needs_scalars piece (encode_values_with_scalars), solving only groups `solved` lacks and
  // adding what it solves there.
  void encode_piece(const ScalarsPiece& piece, int64_t numel, const FrozenScalars& scalars, SolvedGroups& solved) const {
    const int segment = piece.segment;
    const size_t from = piece.from, to = piece.to;
    uint8_t* const out = piece.out;
    check_dtype(piece.dtype);
    const HqqPacking p = packing(numel);
    const ElementRanges ranges = values_for(segment, numel, from, to);
    const GroupValues source(ranges, piece.values, piece.dtype);
    // Groups [first, end) after the run's number of updates.
    const auto solve = [&](int64_t first, int64_t end) {
      std::vector<HqqGroup> groups;
      if (solved.find(first, end, groups)) return groups;
      groups = hqq_solve_groups(source.from(first), end - first, n_bits_, scalars.hqq_zero_updates, precision_, false)
                   .groups;
      solved.runs.push_back({{first, end}, groups});
      return groups;
    };
    if (segment == kZeros) {
      const GroupRange groups = meta_groups(from, to);
      const std::vector<HqqGroup> zero_points = solve(groups.first, groups.end);
      write_meta(groups, from, to, out, [&](int64_t g) {
        return hqq_stored(zero_points[static_cast<size_t>(g - groups.first)], precision_, meta_).zero;
      });
      return;
    }
    if (segment != kCodes)
      FrozenFormat::encode_values_with_scalars(segment, numel, from, to, piece.values, piece.dtype, scalars, out);
    // Every slice's groups under the packed rows solved, then the rows packed straight into `out`.
    const int64_t word_row = kHqqGroupSize * p.word_bytes;
    const int64_t r0 = static_cast<int64_t>(from) / word_row, r1 = ceil_div(static_cast<int64_t>(to), word_row);
    std::vector<std::vector<HqqGroup>> slices(static_cast<size_t>(p.slices));
    for (int k = 0; k < p.slices; ++k) {
      const int64_t first = std::min(k * p.rows + r0, p.groups), end = std::min(k * p.rows + r1, p.groups);
      if (first < end) slices[static_cast<size_t>(k)] = solve(first, end);  // 3 bits: none in the padding rows
    }
    write_codes(p, r0, r1, source, slices, from, to, out);
  }

  // Bytes [from, to) of the codes, packed rows r0 to r1 (slices[k]: slice k's groups from row r0
  // on), row by row in parallel: one pass from the values to the bytes, with no codes matrix or
  // packed copy in between (each was a one-thread fill of a large buffer).
  void write_codes(const HqqPacking& p, int64_t r0, int64_t r1, const GroupValues& source,
                   const std::vector<std::vector<HqqGroup>>& slices, size_t from, size_t to, uint8_t* out) const {
    const auto word_row = static_cast<size_t>(kHqqGroupSize * p.word_bytes);
#pragma omp parallel for schedule(static) if (r1 - r0 >= 64)
    for (int64_t r = r0; r < r1; ++r) {
      std::array<uint8_t, kHqqGroupSize * 4> bytes;
      pack_row(p, r, source, [&](int k) { return slices[static_cast<size_t>(k)][static_cast<size_t>(r - r0)]; },
               bytes.data());
      const size_t row_first = static_cast<size_t>(r) * word_row;
      const size_t lo = std::max(from, row_first), hi = std::min(to, row_first + word_row);
      std::memcpy(out + (lo - from), bytes.data() + (lo - row_first), hi - lo);
    }
  }

  void check_dtype(DType dtype) const {
    if (!accepts_values(dtype))
      throw std::logic_error(fmt::format("{}: values given as {}, expected BF16 or F32", name(), dtype_name(dtype)));
  }

  // The groups whose 16-bit zero point or scale lies under bytes [from, to).
  static GroupRange meta_groups(size_t from, size_t to) {
    return {static_cast<int64_t>(from / 2), ceil_div(static_cast<int64_t>(to), 2)};
  }

  // The groups of every slice whose codes lie in the packed rows under bytes [from, to).
  static std::vector<GroupRange> code_groups(const HqqPacking& p, size_t from, size_t to) {
    const int64_t word_row = kHqqGroupSize * p.word_bytes;
    const int64_t r0 = static_cast<int64_t>(from) / word_row, r1 = ceil_div(static_cast<int64_t>(to), word_row);
    std::vector<GroupRange> groups;
    for (int k = 0; k < p.slices; ++k)
      groups.push_back({std::min(k * p.rows + r0, p.groups), std::min(k * p.rows + r1, p.groups)});
    return groups;
  }

  // Writes bytes [from, to) of a 16-bit-per-group segment, value_of(g) giving group g's value.
  template <class ValueOf>
  void write_meta(const GroupRange& groups, size_t from, size_t to, uint8_t* out, const ValueOf& value_of) const {
    std::vector<uint16_t> words(static_cast<size_t>(groups.end - groups.first));
#pragma omp parallel for schedule(static) if (groups.end - groups.first >= 4096)
    for (int64_t g = groups.first; g < groups.end; ++g)
      words[static_cast<size_t>(g - groups.first)] = hqq_meta_bits(value_of(g), meta_);
    std::memcpy(out, reinterpret_cast<const uint8_t*>(words.data()) + (from - static_cast<size_t>(groups.first) * 2), to - from);
  }

  int n_bits_;
  DType meta_;
  HqqSolverPrecision precision_;
};

}  // namespace

const FrozenFormat& hqq_format(int n_bits, DType meta, bool float_solver) {
  if (!hqq_supported_bits(n_bits)) throw std::logic_error(fmt::format("hqq_format: {} bits", n_bits));
  if (meta != DType::BF16 && meta != DType::F16)
    throw std::logic_error(fmt::format("hqq_format: zero points and scales in {}", dtype_name(meta)));
  // One format per (bits, meta dtype, solver): 5 x 2 x 2.
  static const auto formats = [] {
    std::vector<std::unique_ptr<HqqFormat>> all;
    for (int bits : {1, 2, 3, 4, 8})
      for (DType m : {DType::BF16, DType::F16})
        for (HqqSolverPrecision s : {HqqSolverPrecision::kHalf, HqqSolverPrecision::kFloat})
          all.push_back(std::make_unique<HqqFormat>(bits, m, s));
    return all;
  }();
  const int bits_index = n_bits == 8 ? 4 : n_bits - 1;
  return *formats[static_cast<size_t>(bits_index * 4 + (meta == DType::F16 ? 2 : 0) + (float_solver ? 1 : 0))];
}

}  // namespace fsdpq
