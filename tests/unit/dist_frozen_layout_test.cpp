// The flat layout of an FSDP unit from shapes alone (dist/frozen_layout.h), and the bytes of a
// built unit in it.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "dist/collectives.h"
#include "dist/frozen_layout.h"
#include "model/llama_weights.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

TEST(FrozenLayout, SegmentsAreAlignedAndShardsPaddedToTheGatherGranule) {
  // A dense bf16 norm of 10 values, then NF4 with double quantisation of 130 values (3 blocks).
  const std::vector<FrozenWeightShape> frozen = {{10, false, false, DType::BF16}, {130, true, true, DType::BF16}};
  const UnitLayout layout = unit_layout(frozen, {5, 7}, 2);
  ASSERT_EQ(layout.segments.size(), 4u);
  using Range = std::pair<size_t, size_t>;
  const auto at = [&](size_t i) { return Range(layout.segments[i].offset, layout.segments[i].bytes); };
  EXPECT_EQ(at(0), Range(0, 20));    // 10 bf16
  EXPECT_EQ(at(1), Range(32, 65));   // packed codes, (130 + 1) / 2
  EXPECT_EQ(at(2), Range(112, 3));   // one absmax code per block
  EXPECT_EQ(at(3), Range(128, 4));   // one fp32 scale per 256 blocks
  EXPECT_EQ(layout.segments[1].kind, SegmentKind::Nf4Packed);
  EXPECT_EQ(layout.segments[3].kind, SegmentKind::Nf4AbsmaxScale);
  EXPECT_EQ(layout.frozen_bytes, 132u);
  EXPECT_EQ(layout.frozen_shard_bytes, Communicator::kAllGatherGranule * 2) << "ceil(132 / 2) padded to 64s";
  EXPECT_EQ(layout.frozen_begin(1), 128u);
  EXPECT_EQ(layout.trainable_offset, (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(layout.trainable_numel, 12);
  EXPECT_EQ(layout.shard_numel, 6);
  EXPECT_EQ(layout.trainable_begin(1), 6);
  // Without double quantisation the absmax is stored plain.
  const UnitLayout plain = unit_layout({{130, true, false, DType::BF16}}, {}, 3);
  ASSERT_EQ(plain.segments.size(), 2u);
  EXPECT_EQ(plain.segments[1].kind, SegmentKind::Nf4Absmax);
  EXPECT_EQ(plain.segments[1].bytes, 12u);
  EXPECT_EQ(plain.shard_numel, 0);
}

// A built unit: the layout from its tensors equals the one from shapes, and its flat bytes are
// each segment's storage at its offset, zeros between.
TEST(FrozenLayout, BuiltUnitBytesFollowTheLayout) {
  BaseWeight norm, linear;
  norm.name = "n";
  norm.shape = Shape{10};
  norm.frozen = Tensor::empty(norm.shape, DType::BF16);
  for (int i = 0; i < 10; ++i) norm.frozen.data<uint16_t>()[i] = float_to_bf16(0.5f * static_cast<float>(i + 1));
  linear.name = "w";
  linear.shape = Shape{2, 65};
  std::vector<uint16_t> values(130);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float_to_bf16(static_cast<float>(i % 17) - 8.0f);
  linear.nf4 = std::make_unique<Nf4Tensor>(nf4_quantize(values.data(), 130, {2, 65}, true));
  ParamUnit unit;
  unit.frozen = {&norm, &linear};
  const UnitLayout built = unit_layout(unit, 2);
  const UnitLayout from_shapes = unit_layout({{10, false, false, DType::BF16}, {130, true, true, DType::BF16}}, {}, 2);
  ASSERT_EQ(built.segments.size(), from_shapes.segments.size());
  for (size_t i = 0; i < built.segments.size(); ++i) {
    EXPECT_EQ(built.segments[i].offset, from_shapes.segments[i].offset);
    EXPECT_EQ(built.segments[i].bytes, from_shapes.segments[i].bytes);
  }
  std::vector<uint8_t> flat(2 * built.frozen_shard_bytes, 0xee);
  copy_frozen_bytes(built, unit, 0, flat.data(), flat.size());
  std::vector<uint8_t> want(flat.size(), 0);
  std::memcpy(want.data(), norm.frozen.data<uint16_t>(), 20);
  std::memcpy(want.data() + 32, linear.nf4->packed.data(), 65);
  std::memcpy(want.data() + 112, linear.nf4->absmax_q.data(), 3);
  std::memcpy(want.data() + 128, linear.nf4->absmax_scale.data(), 4);
  EXPECT_EQ(flat, want);
  // A range: the second shard alone.
  std::vector<uint8_t> second(built.frozen_shard_bytes);
  copy_frozen_bytes(built, unit, built.frozen_begin(1), second.data(), second.size());
  EXPECT_EQ(second, std::vector<uint8_t>(want.begin() + 128, want.end()));
}

}  // namespace
}  // namespace fsdpq
