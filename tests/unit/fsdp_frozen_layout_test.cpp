// The flat layout of an FSDP unit from shapes alone (fsdp/frozen_layout.h), and the bytes of a
// built unit in it.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "fsdp/collectives.h"
#include "fsdp/frozen_layout.h"
#include "model/llama_weights.h"
#include "quant/nf4.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

TEST(FrozenLayout, SegmentsAreAlignedAndShardsPaddedToTheGatherGranule) {
  // A dense bf16 norm of 10 values, then NF4 with double quantisation of 130 values (3 blocks).
  const std::vector<FrozenWeightShape> frozen = {{&dense_format(DType::BF16), 10}, {&nf4_format(true), 130}};
  const UnitLayout layout = unit_layout(frozen, {5, 7}, 2);
  ASSERT_EQ(layout.segments.size(), 4u);
  using Range = std::pair<size_t, size_t>;
  const auto at = [&](size_t i) { return Range(layout.segments[i].offset, layout.segments[i].bytes); };
  EXPECT_EQ(at(0), Range(0, 20));    // 10 bf16
  EXPECT_EQ(at(1), Range(32, 65));   // packed codes, (130 + 1) / 2
  EXPECT_EQ(at(2), Range(112, 3));   // one absmax code per block
  EXPECT_EQ(at(3), Range(128, 4));   // one fp32 scale per 256 blocks
  EXPECT_EQ(layout.segments[1].weight, 1u);
  EXPECT_EQ(layout.segments[1].segment, 0u);  // the packed codes
  EXPECT_EQ(layout.segments[3].segment, 2u);  // the absmax scales
  EXPECT_EQ(layout.frozen_bytes, 132u);
  EXPECT_EQ(layout.frozen_shard_bytes, Communicator::kAllGatherGranule * 2) << "ceil(132 / 2) padded to 64s";
  EXPECT_EQ(layout.frozen_begin(1), 128u);
  EXPECT_EQ(layout.trainable_offset, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(layout.trainable_numel, 12);
  EXPECT_EQ(layout.shard_numel, 6);
  EXPECT_EQ(layout.trainable_begin(1), 6);
  // Without double quantisation the absmax is stored plain.
  const UnitLayout plain = unit_layout({{&nf4_format(false), 130}}, {}, 3);
  ASSERT_EQ(plain.segments.size(), 2u);
  EXPECT_EQ(nf4_format(false).segments(130)[plain.segments[1].segment].name, "absmax");
  EXPECT_EQ(plain.segments[1].bytes, 12u);
  EXPECT_EQ(plain.shard_numel, 0);
}

// A built unit: the layout from its tensors equals the one from shapes, and its flat bytes are
// each segment's storage at its offset, zeros between.
TEST(FrozenLayout, BuiltUnitBytesFollowTheLayout) {
  BaseWeight norm, linear;
  norm.name = "n";
  norm.shape = Shape{10};
  std::vector<uint16_t> norm_values(10);
  for (int i = 0; i < 10; ++i) norm_values[static_cast<size_t>(i)] = float_to_bf16(0.5f * static_cast<float>(i + 1));
  norm.frozen = FrozenStorage::encode(dense_format(DType::BF16), norm.shape, norm_values.data(), DType::BF16);
  linear.name = "w";
  linear.shape = Shape{2, 65};
  std::vector<uint16_t> values(130);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float_to_bf16(static_cast<float>(i % 17) - 8.0f);
  linear.frozen = FrozenStorage::encode(nf4_format(true), linear.shape, values.data(), DType::BF16);
  const Nf4Tensor nf4 = nf4_quantize(values.data(), 130, {2, 65}, true);
  ParamUnit unit;
  unit.frozen = {&norm, &linear};
  const UnitLayout built = unit_layout(unit, 2);
  const UnitLayout from_shapes = unit_layout({{&dense_format(DType::BF16), 10}, {&nf4_format(true), 130}}, {}, 2);
  ASSERT_EQ(built.segments.size(), from_shapes.segments.size());
  for (size_t i = 0; i < built.segments.size(); ++i) {
    EXPECT_EQ(built.segments[i].offset, from_shapes.segments[i].offset);
    EXPECT_EQ(built.segments[i].bytes, from_shapes.segments[i].bytes);
  }
  std::vector<uint8_t> flat(2 * built.frozen_shard_bytes, 0xee);
  copy_frozen_bytes(built, unit, 0, flat.data(), flat.size());
  std::vector<uint8_t> want(flat.size(), 0);
  ASSERT_EQ(want.size(), 256u);
  std::memcpy(want.data(), norm_values.data(), 20);
  std::copy(nf4.packed.begin(), nf4.packed.end(), want.begin() + 32);  // 65 bytes
  std::copy(nf4.absmax_q.begin(), nf4.absmax_q.end(), want.begin() + 112);
  std::memcpy(want.data() + 128, nf4.absmax_scale.data(), 4);
  EXPECT_EQ(flat, want);
  // A range: the second shard alone.
  std::vector<uint8_t> second(built.frozen_shard_bytes);
  copy_frozen_bytes(built, unit, built.frozen_begin(1), second.data(), second.size());
  EXPECT_EQ(second, std::vector<uint8_t>(want.begin() + 128, want.end()));
}

}  // namespace
}  // namespace fsdpq
