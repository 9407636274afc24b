// The frozen storage formats (quant/frozen_format.h, quant/frozen_storage.h): for each format,
// the segment sizes of odd element counts; encoding in arbitrary byte ranges (as the ranks of a
// shard group do, statistics max-merged between the two steps) gives the bytes of encoding the
// whole tensor, which are today's nf4_quantize bytes; and dequantising gives today's
// nf4_dequantize values (and the dense values back).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "quant/frozen_format.h"
#include "quant/hqq_solve.h"
#include "quant/frozen_storage.h"
#include "quant/hqq.h"
#include "quant/nf4.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

// Random non-zero values of `dtype` (BF16, F16 or F32), with a zero block when there is room
// (NF4's special case: absmax 0).
std::vector<uint8_t> random_values(int64_t n, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<uint8_t> bytes(static_cast<size_t>(n) * dtype_size(dtype));
  for (int64_t i = 0; i < n; ++i) {
    float x = normal(rng);
    if (x == 0.0f) x = 1e-3f;
    if (n >= 4 * kNf4BlockSize && i >= kNf4BlockSize && i < 2 * kNf4BlockSize) x = 0.0f;
    const size_t at = static_cast<size_t>(i) * dtype_size(dtype);
    if (dtype == DType::F32) {
      std::memcpy(bytes.data() + at, &x, 4);
    } else {
      const uint16_t h = dtype == DType::BF16 ? float_to_bf16(x) : float_to_f16(x);
      std::memcpy(bytes.data() + at, &h, 2);
    }
  }
  return bytes;
}

struct FormatCase {
  const FrozenFormat* format;
  DType values;  // what the values come in
};

std::vector<FormatCase> formats() {
  return {{&dense_format(DType::BF16), DType::BF16}, {&dense_format(DType::F16), DType::F16},
          {&dense_format(DType::F32), DType::F32},   {&nf4_format(false), DType::BF16},
          {&nf4_format(true), DType::BF16},          {&nf4_format(true), DType::F32}};
}

const std::vector<int64_t> kOddSizes = {1, 2, 63, 64, 65, 130, 1000, 64 * 256 + 1, 64 * 256 * 2 + 37};

TEST(FrozenFormat, SegmentSizesOfOddElementCounts) {
  for (int64_t n : kOddSizes) {
    SCOPED_TRACE("numel " + std::to_string(n));
    for (DType d : {DType::BF16, DType::F16, DType::F32}) {
      const auto s = dense_format(d).segments(n);
      ASSERT_EQ(s.size(), 1u);
      EXPECT_EQ(s[0].bytes, static_cast<size_t>(n) * dtype_size(d));
      EXPECT_FALSE(s[0].from_statistics);
      EXPECT_EQ(dense_format(d).statistics_count(n), 0);
    }
    const size_t blocks = static_cast<size_t>((n + 63) / 64), groups = (blocks + 255) / 256;
    const auto plain = nf4_format(false).segments(n);
    ASSERT_EQ(plain.size(), 2u);
    EXPECT_EQ(plain[0].bytes, static_cast<size_t>((n + 1) / 2));
    EXPECT_EQ(plain[1].bytes, 4 * blocks);
    const auto dq = nf4_format(true).segments(n);
    ASSERT_EQ(dq.size(), 3u);
    EXPECT_EQ(dq[0].name, "codes");
    EXPECT_EQ(dq[0].bytes, static_cast<size_t>((n + 1) / 2));
    EXPECT_FALSE(dq[0].from_statistics);
    EXPECT_EQ(dq[1].bytes, blocks);
    EXPECT_EQ(dq[2].bytes, 4 * groups);
    EXPECT_TRUE(dq[1].from_statistics && dq[2].from_statistics);
    EXPECT_EQ(nf4_format(true).statistics_count(n), static_cast<int64_t>(blocks));
    // What an Nf4Tensor holds, the offset aside (a scalar, not a segment).
    const std::vector<uint8_t> v = random_values(n, DType::BF16, 3);
    const Nf4Tensor t = nf4_quantize(reinterpret_cast<const uint16_t*>(v.data()), n, {n}, true);
    EXPECT_EQ(static_cast<int64_t>(stored_bytes(nf4_format(true), n)) + 4, t.storage_bytes());
  }
}

// Encodes every segment of a weight split into pieces at `cuts` (byte offsets of the flat
// concatenation of its segments, as a shard boundary falls), each piece with its own statistics
// vector as a separate rank would; the vectors are max-merged before the statistics step.
std::vector<std::vector<uint8_t>> encode_in_pieces(const FrozenFormat& format, int64_t numel, const uint8_t* values,
                                                   DType dtype, std::vector<size_t> cuts, FrozenScalars& scalars) {
  const std::vector<SegmentSpec> specs = format.segments(numel);
  std::vector<std::vector<uint8_t>> out;
  size_t total = 0;
  for (const SegmentSpec& s : specs) {
    out.emplace_back(s.bytes, 0xee);
    total += s.bytes;
  }
  cuts.push_back(0);
  cuts.push_back(total);
  std::sort(cuts.begin(), cuts.end());
  const size_t count = static_cast<size_t>(format.statistics_count(numel));
  std::vector<float> merged(count, kUnknownStatistic);
  struct Piece {
    size_t segment, from, to;
  };
  std::vector<Piece> pieces;
  for (size_t c = 0; c + 1 < cuts.size(); ++c) {
    size_t base = 0;
    for (size_t i = 0; i < specs.size(); base += specs[i].bytes, ++i) {
      const size_t lo = std::max(cuts[c], base), hi = std::min(cuts[c + 1], base + specs[i].bytes);
      if (lo < hi) pieces.push_back({i, lo - base, hi - base});
    }
  }
  // The values under a piece, concatenated from the ranges values_for names (as a reader gives them).
  const auto values_under = [&](const Piece& p) {
    const ElementRanges ranges = format.values_for(static_cast<int>(p.segment), numel, p.from, p.to);
    std::vector<uint8_t> v;
    for (const ElementRange& r : ranges) {
      EXPECT_GE(r.first, 0);
      EXPECT_LE(r.first + r.count, numel);
      v.insert(v.end(), values + static_cast<size_t>(r.first) * dtype_size(dtype),
               values + static_cast<size_t>(r.first + r.count) * dtype_size(dtype));
    }
    return v;
  };
  for (const Piece& p : pieces) {
    if (specs[p.segment].from_statistics) continue;
    std::vector<float> mine(count, kUnknownStatistic);
    const int segment = static_cast<int>(p.segment);
    const std::vector<uint8_t> v = values_under(p);
    if (specs[p.segment].needs_scalars)
      format.measure_values(segment, numel, p.from, p.to, v.data(), dtype, mine.data());
    else
      format.encode_values(segment, numel, p.from, p.to, v.data(), dtype, out[p.segment].data() + p.from, mine.data());
    for (size_t i = 0; i < count; ++i) merged[i] = std::max(merged[i], mine[i]);
  }
  for (float s : merged) EXPECT_NE(s, kUnknownStatistic);
  scalars = format.scalars_from(merged.data(), numel);
  for (const Piece& p : pieces) {
    if (specs[p.segment].from_statistics)
      format.encode_statistics(static_cast<int>(p.segment), numel, p.from, p.to, merged.data(), scalars,
                               out[p.segment].data() + p.from);
    else if (specs[p.segment].needs_scalars)
      format.encode_values_with_scalars(static_cast<int>(p.segment), numel, p.from, p.to, values_under(p).data(), dtype,
                                        scalars, out[p.segment].data() + p.from);
  }
  return out;
}

TEST(FrozenFormat, EncodingARangeEqualsEncodingTheWholeThenSlicing) {
  std::mt19937 rng(11);
  for (const FormatCase& f : formats()) {
    for (int64_t n : kOddSizes) {
      SCOPED_TRACE(f.format->name() + " from " + std::string(dtype_name(f.values)) + ", numel " + std::to_string(n));
      const std::vector<uint8_t> v = random_values(n, f.values, static_cast<uint32_t>(n));
      const FrozenStorage whole = FrozenStorage::encode(*f.format, Shape{n}, v.data(), f.values);
      size_t total = stored_bytes(*f.format, n);
      for (int split = 0; split < 4; ++split) {
        std::vector<size_t> cuts;
        std::uniform_int_distribution<size_t> at(0, total);
        for (int k = 0; k < 1 + split * 2; ++k) cuts.push_back(at(rng));
        FrozenScalars scalars;
        const auto pieces = encode_in_pieces(*f.format, n, v.data(), f.values, cuts, scalars);
        for (size_t i = 0; i < pieces.size(); ++i) {
          const std::span<const uint8_t> want = whole.segment(i);
          EXPECT_TRUE(std::equal(pieces[i].begin(), pieces[i].end(), want.begin(), want.end())) << "segment " << i;
        }
        EXPECT_EQ(scalars.absmax_offset, whole.scalars.absmax_offset);
      }
      // The whole encoding is today's: the values themselves, or nf4_quantize's bytes.
      if (!f.format->quantized()) {
        EXPECT_TRUE(std::equal(v.begin(), v.end(), whole.segment(0).begin(), whole.segment(0).end()));
        continue;
      }
      const bool dq = whole.segments().size() == 3;
      const Nf4Tensor t = f.values == DType::BF16
                              ? nf4_quantize(reinterpret_cast<const uint16_t*>(v.data()), n, {n}, dq)
                              : nf4_quantize(reinterpret_cast<const float*>(v.data()), n, {n}, dq);
      auto same = [](std::span<const uint8_t> got, const void* want, size_t bytes) {
        return got.size() == bytes && std::memcmp(got.data(), want, bytes) == 0;
      };
      EXPECT_TRUE(same(whole.segment(0), t.packed.data(), t.packed.size()));
      if (dq) {
        EXPECT_TRUE(same(whole.segment(1), t.absmax_q.data(), t.absmax_q.size()));
        EXPECT_TRUE(same(whole.segment(2), t.absmax_scale.data(), 4 * t.absmax_scale.size()));
        EXPECT_EQ(whole.scalars.absmax_offset, t.absmax_offset);
      } else {
        EXPECT_TRUE(same(whole.segment(1), t.absmax.data(), 4 * t.absmax.size()));
      }
    }
  }
}

TEST(FrozenFormat, DequantizeEqualsTodaysFunctions) {
  for (const FormatCase& f : formats()) {
    for (int64_t n : kOddSizes) {
      SCOPED_TRACE(f.format->name() + " from " + std::string(dtype_name(f.values)) + ", numel " + std::to_string(n));
      const std::vector<uint8_t> v = random_values(n, f.values, static_cast<uint32_t>(7 * n));
      const FrozenStorage s = FrozenStorage::encode(*f.format, Shape{n}, v.data(), f.values);
      Tensor scratch;
      if (!f.format->quantized()) {
        // Dense values are computed with in place, unchanged.
        const TensorView in_place = s.dense(scratch, DType::F32);
        EXPECT_FALSE(scratch.defined());
        EXPECT_EQ(in_place.dtype, f.values);
        EXPECT_EQ(std::memcmp(in_place.data, v.data(), v.size()), 0);
        continue;
      }
      const bool dq = s.segments().size() == 3;
      const Nf4Tensor t = f.values == DType::BF16
                              ? nf4_quantize(reinterpret_cast<const uint16_t*>(v.data()), n, {n}, dq)
                              : nf4_quantize(reinterpret_cast<const float*>(v.data()), n, {n}, dq);
      std::vector<float> want32(static_cast<size_t>(n));
      std::vector<uint16_t> want16(static_cast<size_t>(n)), want_half(static_cast<size_t>(n));
      nf4_dequantize(t, want32.data());
      nf4_dequantize(t, want16.data());
      for (size_t i = 0; i < want32.size(); ++i) want_half[i] = float_to_f16(want32[i]);
      Tensor f32, bf16, f16;
      s.dense(f32, DType::F32);
      s.dense(bf16, DType::BF16);
      s.dense(f16, DType::F16);
      EXPECT_EQ(std::memcmp(f32.view().data, want32.data(), 4 * want32.size()), 0);
      EXPECT_EQ(std::memcmp(bf16.view().data, want16.data(), 2 * want16.size()), 0);
      EXPECT_EQ(std::memcmp(f16.view().data, want_half.data(), 2 * want_half.size()), 0);
      // The scratch is reused while shape, dtype and device match.
      const void* before = bf16.view().data;
      s.dense(bf16, DType::BF16);
      EXPECT_EQ(bf16.view().data, before);
    }
  }
}

// A quantised weight dequantised into a block of a wider matrix's columns (a folded LoRA weight's
// base, model/llama_layer.h): each row holds the dense values' row, the columns around the block
// keep what they held. A block whose rows are not the weight's is a logic error.
TEST(FrozenStorage, DequantisesIntoABlockOfColumns) {
  struct Case {
    const FrozenFormat* format;
    DType out;
  };
  const Case cases[] = {{&nf4_format(false), DType::BF16}, {&nf4_format(true), DType::F32},
                        {&nf4_format(true), DType::F16},          {&hqq_format(4, DType::BF16), DType::BF16},
                        {&hqq_format(2, DType::F16), DType::F32}};
  const int64_t rows = 6, cols = 128, wide = 200, first = 40;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.format->name() + " into " + std::string(dtype_name(c.out)));
    const std::vector<uint8_t> v = random_values(rows * cols, DType::F32, 31);
    const FrozenStorage s = FrozenStorage::encode(*c.format, Shape{rows, cols}, v.data(), DType::F32);
    Tensor dense;
    s.dense(dense, c.out);
    Tensor folded = Tensor::empty(Shape{rows, wide}, c.out);
    TensorView view = folded.view();
    for (int64_t i = 0; i < folded.numel(); ++i) store_f32(view, i, -7.0f);
    s.dequantize_into(MatrixView(folded.view(), first, cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < wide; ++k) {
        const float got = load_f32(folded.view(), r * wide + k);
        if (k < first || k >= first + cols)
          ASSERT_EQ(got, -7.0f) << "row " << r << " column " << k;
        else
          ASSERT_EQ(got, load_f32(dense.view(), r * cols + k - first)) << "row " << r << " column " << k;
      }
    EXPECT_THROW(s.dequantize_into(MatrixView(folded.view(), first, cols / 2)), std::logic_error);
  }
  // Rows of 96 values are not whole 64-value blocks: NF4 cannot write them a row at a time.
  const std::vector<uint8_t> v = random_values(4 * 96, DType::F32, 32);
  const FrozenStorage odd = FrozenStorage::encode(nf4_format(true), Shape{4, 96}, v.data(), DType::F32);
  Tensor folded = Tensor::empty(Shape{4, 100}, DType::BF16);
  EXPECT_THROW(odd.dequantize_into(MatrixView(folded.view(), 0, 96)), std::logic_error);
}

TEST(FrozenStorage, ReleasedKeepsScalarsAndCanBeAllocatedSegmentBySegment) {
  const std::vector<uint8_t> v = random_values(1000, DType::BF16, 5);
  FrozenStorage s = FrozenStorage::encode(nf4_format(true), Shape{10, 100}, v.data(), DType::BF16);
  const float offset = s.scalars.absmax_offset;
  std::vector<std::vector<uint8_t>> bytes;
  for (size_t i = 0; i < s.segments().size(); ++i) bytes.emplace_back(s.segment(i).begin(), s.segment(i).end());
  s.release();
  EXPECT_FALSE(s.allocated());
  EXPECT_TRUE(s.segment(0).empty());
  EXPECT_EQ(s.scalars.absmax_offset, offset);
  Tensor scratch;
  EXPECT_THROW(s.dense(scratch, DType::BF16), std::logic_error);
  s.place_on(Device::CPU);  // nothing to move
  for (size_t i = 0; i < bytes.size(); ++i) {
    const std::span<uint8_t> to = s.allocate(i, Device::CPU);
    ASSERT_EQ(to.size(), bytes[i].size());
    std::memcpy(to.data(), bytes[i].data(), to.size());
  }
  EXPECT_TRUE(s.allocated());
  const FrozenStorage again = FrozenStorage::encode(nf4_format(true), Shape{10, 100}, v.data(), DType::BF16);
  Tensor a, b;
  s.dense(a, DType::F32);
  again.dense(b, DType::F32);
  EXPECT_EQ(a.shape(), (Shape{10, 100}));
  EXPECT_EQ(std::memcmp(a.view().data, b.view().data, a.nbytes()), 0);
  // A dense format's segment has the weight's shape.
  FrozenStorage dense(dense_format(DType::BF16), Shape{10, 100});
  dense.allocate(Device::CPU);
  EXPECT_EQ(dense.values().shape, (Shape{10, 100}));
  EXPECT_THROW((void)s.values(), std::logic_error);
  EXPECT_FALSE(FrozenStorage().defined());
}

// A reader may read whole dense elements straight into the bytes (UnitBuild does); nothing else.
TEST(FrozenFormat, OnlyWholeDenseElementsAreStoredAsRead) {
  EXPECT_TRUE(dense_format(DType::BF16).stores_values_as_read(0, 0, 20, DType::BF16));
  EXPECT_TRUE(dense_format(DType::F32).stores_values_as_read(0, 8, 16, DType::F32));
  EXPECT_FALSE(dense_format(DType::BF16).stores_values_as_read(0, 1, 20, DType::BF16));
  EXPECT_FALSE(dense_format(DType::F32).stores_values_as_read(0, 8, 18, DType::F32));
  EXPECT_FALSE(dense_format(DType::F16).stores_values_as_read(0, 0, 20, DType::BF16));
  EXPECT_FALSE(nf4_format(true).stores_values_as_read(0, 0, 32, DType::BF16));
}

TEST(FrozenFormat, RejectsValuesOfTheWrongType) {
  const std::vector<uint8_t> v = random_values(64, DType::F16, 1);
  std::vector<uint8_t> out(128);
  std::vector<float> stats(1);
  EXPECT_THROW(dense_format(DType::BF16).encode_values(0, 64, 0, 128, v.data(), DType::F16, out.data(), stats.data()),
               std::logic_error);
  EXPECT_THROW(nf4_format(true).encode_values(0, 64, 0, 32, v.data(), DType::F16, out.data(), stats.data()),
               std::logic_error);
  EXPECT_FALSE(nf4_format(true).accepts_values(DType::F16));
  EXPECT_THROW(nf4_format(true).values_for(1, 64, 0, 1), std::logic_error);
  EXPECT_THROW(dense_format(DType::U8), std::logic_error);
}


// HQQ's codes hold groups far apart in one byte and its zero points depend on the whole tensor
// (the solver stops when the tensor's error stops falling): encoding in pieces, as the ranks of
// a shard group do, still gives the bytes of the whole encoding, for every width and both
// compute dtypes, on weights with several statistics blocks (64 groups each).
TEST(FrozenFormat, HqqEncodingInPiecesEqualsTheWhole) {
  std::mt19937 rng(5);
  struct HqqCase {
    int bits;
    DType meta, values;
    int64_t numel;
  };
  std::vector<HqqCase> cases;
  for (int bits : {1, 2, 3, 4, 8})
    for (int64_t groups : {8, 40, 136}) cases.push_back({bits, DType::BF16, DType::BF16, groups * kHqqGroupSize});
  cases.push_back({4, DType::F16, DType::F32, 200 * kHqqGroupSize});
  cases.push_back({3, DType::F16, DType::BF16, 330 * kHqqGroupSize});
  for (const HqqCase& c : cases) {
    const FrozenFormat& format = hqq_format(c.bits, c.meta);
    SCOPED_TRACE(format.name() + " from " + std::string(dtype_name(c.values)) + ", numel " + std::to_string(c.numel));
    const std::vector<uint8_t> v = random_values(c.numel, c.values, static_cast<uint32_t>(c.numel + c.bits));
    const FrozenStorage whole = FrozenStorage::encode(format, Shape{c.numel}, v.data(), c.values);
    EXPECT_GT(whole.scalars.hqq_zero_updates, 0);
    const size_t total = stored_bytes(format, c.numel);
    for (int split = 0; split < 3; ++split) {
      std::vector<size_t> cuts;
      std::uniform_int_distribution<size_t> at(0, total);
      for (int k = 0; k < 1 + split * 3; ++k) cuts.push_back(at(rng));
      FrozenScalars scalars;
      const auto pieces = encode_in_pieces(format, c.numel, v.data(), c.values, cuts, scalars);
      for (size_t i = 0; i < pieces.size(); ++i) {
        const std::span<const uint8_t> want = whole.segment(i);
        EXPECT_TRUE(std::equal(pieces[i].begin(), pieces[i].end(), want.begin(), want.end())) << "segment " << i;
      }
      EXPECT_EQ(scalars.hqq_zero_updates, whole.scalars.hqq_zero_updates);
    }
  }
}

// A weight's codes and zero points share the solver run after the measuring one
// (encode_pieces_with_scalars): the solver sees each group twice, not three times.
TEST(FrozenFormat, HqqSolvesEachGroupTwice) {
  const int64_t groups = 136;
  const std::vector<uint8_t> v = random_values(groups * kHqqGroupSize, DType::BF16, 9);
  const HqqSolverWork before = hqq_solver_work();
  const FrozenStorage s = FrozenStorage::encode(hqq_format(4, DType::BF16), Shape{groups * kHqqGroupSize}, v.data(),
                                                DType::BF16);
  EXPECT_EQ(hqq_solver_work().groups - before.groups, 2 * groups);
}

// What hqq cannot pack is refused with the reason; the sizes are hqq's.
TEST(FrozenFormat, HqqSegmentSizesAndWhatItCannotPack) {
  const int64_t n = 24 * kHqqGroupSize;  // 24 groups
  for (int bits : {1, 2, 4, 8}) {
    const auto s = hqq_format(bits, DType::BF16).segments(n);
    ASSERT_EQ(s.size(), 3u);
    EXPECT_EQ(s[0].bytes, static_cast<size_t>(n * bits / 8));
    EXPECT_TRUE(s[0].needs_scalars && s[1].needs_scalars && !s[2].needs_scalars);
    EXPECT_EQ(s[1].bytes, 48u);
    EXPECT_EQ(s[2].bytes, 48u);
  }
  EXPECT_EQ(hqq_format(3, DType::F16).segments(n)[0].bytes, 3u * 64 * 4) << "10 slices of 3 rows, int32 words";
  EXPECT_THROW(hqq_format(4, DType::BF16).segments(100), std::invalid_argument);
  EXPECT_THROW(hqq_format(1, DType::BF16).segments(12 * kHqqGroupSize), std::invalid_argument);
  EXPECT_THROW(hqq_format(5, DType::BF16), std::logic_error);
  EXPECT_THROW(hqq_format(4, DType::F32), std::logic_error);
  try {
    (void)HqqPacking::of(2, 6 * kHqqGroupSize);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "hqq packs 2 bits from 4 groups at a time; 384 values make 6 groups");
  }
}

// The dequantised weight is close to the weight: within about one quantisation step of each
// group's range (half a step of rounding; the zero point moves, so a value may land one code
// further). 1 bit: the solver trades the extremes for the bulk (1.5 steps). 8 bits: bf16 keeps 8
// significant bits, so the two bf16 roundings of (code - zero) * scale add up to a step for codes
// near 255 (measured 1.40).
TEST(FrozenFormat, HqqDequantisesCloseToTheWeight) {
  const int64_t n = 64 * kHqqGroupSize;
  const std::vector<uint8_t> v = random_values(n, DType::F32, 9);
  const auto* w = reinterpret_cast<const float*>(v.data());
  for (int bits : {1, 2, 3, 4, 8}) {
    const FrozenStorage s = FrozenStorage::encode(hqq_format(bits, DType::BF16), Shape{n}, v.data(), DType::F32);
    Tensor scratch;
    const TensorView d = s.dense(scratch, DType::F32);
    double worst = 0;
    for (int64_t g = 0; g < n / kHqqGroupSize; ++g) {
      const float* group = w + g * kHqqGroupSize;
      const auto [lo, hi] = std::minmax_element(group, group + kHqqGroupSize);
      const double step = (*hi - *lo) / ((1 << bits) - 1);
      for (int64_t j = 0; j < kHqqGroupSize; ++j)
        worst = std::max(worst, std::fabs(static_cast<const float*>(d.data)[g * kHqqGroupSize + j] - group[j]) / step);
    }
    EXPECT_LT(worst, bits == 1 ? 1.5 : bits == 8 ? 2.0 : 1.05) << bits << " bits: the largest error in quantisation steps";
  }
}

}  // namespace
}  // namespace fsdpq
