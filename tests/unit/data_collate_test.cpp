// Collation: padding with pad / -100, truncation and the count of loss targets.
#include <gtest/gtest.h>

#include "data/collate.h"

namespace fsdpq::data {
namespace {
using Ids = std::vector<int32_t>;
constexpr int32_t M = kIgnoreIndex;

Example example(Ids ids, Ids labels) {
  Example e;
  e.full_length = static_cast<int64_t>(ids.size());
  e.input_ids = std::move(ids);
  e.labels = std::move(labels);
  return e;
}

TEST(DataCollate, PadsToTheLongestExample) {
  Example a = example({1, 10, 11, 2}, {M, M, 11, 2});
  Example b = example({1, 20, 2}, {M, 20, 2});
  Batch batch = collate({&a, &b}, /*pad_id=*/2, /*context_length=*/16, false);
  EXPECT_EQ(batch.batch_size, 2);
  EXPECT_EQ(batch.seq_len, 4);
  EXPECT_EQ(batch.input_ids, (Ids{1, 10, 11, 2, 1, 20, 2, 2}));
  EXPECT_EQ(batch.labels, (Ids{M, M, 11, 2, M, 20, 2, M}));
  EXPECT_EQ(batch.target_tokens, 4);
}

TEST(DataCollate, PadsToContextLengthWhenAsked) {
  Example a = example({1, 10, 2}, {M, 10, 2});
  Batch batch = collate({&a}, 7, 5, true);
  EXPECT_EQ(batch.seq_len, 5);
  EXPECT_EQ(batch.input_ids, (Ids{1, 10, 2, 7, 7}));
  EXPECT_EQ(batch.labels, (Ids{M, 10, 2, M, M}));
}

TEST(DataCollate, CutsRowsToContextLengthAndSkipsPositionZeroInTheCount) {
  // A label at position 0 is never a target of the shifted loss.
  Example a = example({1, 10, 11, 12, 2}, {1, 10, 11, 12, 2});
  Batch batch = collate({&a}, 2, 3, false);
  EXPECT_EQ(batch.seq_len, 3);
  EXPECT_EQ(batch.input_ids, (Ids{1, 10, 11}));
  EXPECT_EQ(batch.labels, (Ids{1, 10, 11}));
  EXPECT_EQ(batch.target_tokens, 2);
}

TEST(DataCollate, EmptyBatch) {
  Batch batch = collate({}, 2, 8, false);
  EXPECT_EQ(batch.batch_size, 0);
  EXPECT_TRUE(batch.input_ids.empty());
}

}  // namespace
}  // namespace fsdpq::data
