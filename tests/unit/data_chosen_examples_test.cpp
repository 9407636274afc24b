// Tokenizing only the train examples a run reads: records read a chunk at a time, by index, and
// the examples at chosen indices are those that tokenizing everything gives.
#include <gtest/gtest.h>

#include "data/dataset.h"
#include "data/record_source.h"
#include "data/sampler.h"
#include "data/synthetic.h"
#include "test_support.h"

namespace fsdpq::data {
namespace {

std::vector<size_t> every(size_t n, size_t step, size_t first = 0) {
  std::vector<size_t> out;
  for (size_t i = first; i < n; i += step) out.push_back(i);
  return out;
}

void expect_same_records(const std::vector<Record>& got, const std::vector<Record>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].fields, want[i].fields) << what << " record " << i;
    EXPECT_EQ(got[i].line, want[i].line) << what << " record " << i;
  }
}

TEST(DataChosenExamples, RecordsReadByIndexAndChunkAreTheDatasetsRecords) {
  const std::vector<Record> synthetic = make_synthetic_records(500, 9);
  const std::vector<Record> dummy = make_dummy_records(20, 16);
  const std::vector<size_t> chosen = every(500, 7, 3);
  std::vector<Record> want;
  for (size_t i : chosen) want.push_back(synthetic[i]);
  for (size_t chunk : {1, 5, 1000}) {
    std::vector<Record> got;
    size_t expected_first = 0;
    RecordSource::synthetic(500, 9).read(chosen, chunk, [&](size_t first, const std::vector<Record>& records) {
      EXPECT_EQ(first, expected_first);
      EXPECT_LE(records.size(), chunk) << "never more than a chunk at once";
      expected_first += records.size();
      got.insert(got.end(), records.begin(), records.end());
    });
    expect_same_records(got, want, "synthetic, chunk " + std::to_string(chunk));
  }
  // A slice counts from its start; records keep their lines in the whole dataset.
  expect_same_records(RecordSource::synthetic(500, 9).slice(450, 500).at({0, 49}), {synthetic[450], synthetic[499]},
                      "synthetic slice");
  expect_same_records(RecordSource::dummy(20, 16).at(every(20, 1)), dummy, "dummy");
  expect_same_records(RecordSource::held(synthetic).slice(100, 200).at({5}), {synthetic[105]}, "held slice");
  EXPECT_THROW(RecordSource::dummy(20, 16).at({3, 3}), std::logic_error);
  EXPECT_THROW(RecordSource::dummy(20, 16).at({20}), std::logic_error);
}

void expect_same_examples(const Example& got, const Example& want, const std::string& what) {
  EXPECT_EQ(got.input_ids, want.input_ids) << what;
  EXPECT_EQ(got.labels, want.labels) << what;
  EXPECT_EQ(got.full_length, want.full_length) << what;
  EXPECT_EQ(got.truncated, want.truncated) << what;
}

// The same dataset tokenized whole and at chosen indices: the same examples at those indices, the
// same eval set and counts, statistics over the chosen ones, and no reading the others.
void check_chosen(const DataOptions& o, const Tokenizer& tok, const std::string& what) {
  const TokenizedDataset all = build_dataset(o, tok);
  const std::vector<size_t> chosen = every(all.train.size(), 5, 2);
  const TokenizedDataset some = tokenize_dataset(load_dataset_records(o), tok, chosen);
  ASSERT_EQ(some.train.size(), all.train.size()) << what;
  EXPECT_EQ(some.train.tokenized(), chosen.size()) << what;
  EXPECT_FALSE(some.train.complete()) << what;
  for (size_t i : chosen) expect_same_examples(some.train[i], all.train[i], what + " example " + std::to_string(i));
  // One not chosen (a resumed run may read one) is tokenized when first read, the same again.
  expect_same_examples(some.train[0], all.train[0], what + " example 0, read later");
  EXPECT_EQ(&some.train[0], &some.train[0]) << "made once";
  EXPECT_EQ(some.train.tokenized(), chosen.size()) << what << ": counts what was made ahead";
  ASSERT_EQ(some.eval.size(), all.eval.size()) << what;
  for (size_t i = 0; i < all.eval.size(); ++i) expect_same_examples(some.eval[i], all.eval[i], what + " eval");

  EXPECT_EQ(some.stats.examples, all.stats.examples) << what;
  EXPECT_EQ(some.stats.eval_examples, all.stats.eval_examples) << what;
  EXPECT_EQ(some.stats.records_read, all.stats.records_read) << what;
  EXPECT_EQ(some.stats.examples_tokenized, chosen.size()) << what;
  EXPECT_EQ(all.stats.examples_tokenized, all.stats.examples) << what;
  int64_t targets = 0;
  for (size_t i : chosen)
    for (size_t t = 1; t < all.train[i].labels.size(); ++t) targets += all.train[i].labels[t] != kIgnoreIndex;
  EXPECT_EQ(some.stats.target_tokens, targets) << what << ": the chosen examples' own";
  EXPECT_NE(summarize(some.stats).find(fmt::format("tokenized {} of the {} train examples, those the run reads",
                                                   chosen.size(), all.train.size())),
            std::string::npos)
      << summarize(some.stats);
  EXPECT_EQ(summarize(all.stats).find("tokenized"), std::string::npos) << "all tokenized: nothing to say";
}

TEST(DataChosenExamples, AreTheExamplesThatTokenizingEverythingGives) {
  ByteTokenizer tok;
  DataOptions o;
  o.dataset = "synthetic";
  o.dataset_samples = 300;
  o.context_length = 64;
  o.batch_size = 4;
  o.eval_fraction = 0.1;
  check_chosen(o, tok, "synthetic with an eval split");
  o.dataset = "dummy";
  check_chosen(o, tok, "dummy");

  const auto dir = test::make_temp_dir("chosen");
  write_jsonl(dir / "d.jsonl", make_synthetic_records(120, 4));
  o = DataOptions{};
  o.dataset = "alpaca";
  o.data_path = dir / "d.jsonl";
  o.batch_size = 3;
  o.eval_data_path = dir / "d.jsonl";
  check_chosen(o, tok, "a file with an eval file");
}

TEST(DataChosenExamples, WithoutAMakerAnExampleNotMadeAheadIsABug) {
  Example e;
  e.input_ids = e.labels = {7};
  const ExampleSet set(10, {4}, {e});
  EXPECT_EQ(set[4].input_ids, e.input_ids);
  EXPECT_THROW(set[3], std::logic_error);
  EXPECT_THROW(set[10], std::logic_error);
  EXPECT_THROW(ExampleSet(10, {4, 4}, {e, e}), std::logic_error);
}

// What the trainer's sampler needs of every rank: all ranks' indices in one order.
TEST(DataChosenExamples, EpochOrderHoldsEveryRanksIndices) {
  for (int world : {1, 2, 3}) {
    const std::vector<int64_t> order = DistributedSampler(10, world, 0, 5).epoch_order(2);
    for (int rank = 0; rank < world; ++rank) {
      std::vector<int64_t> mine;
      for (size_t i = static_cast<size_t>(rank); i < order.size(); i += static_cast<size_t>(world))
        mine.push_back(order[i]);
      EXPECT_EQ(mine, DistributedSampler(10, world, rank, 5).indices(2)) << "world " << world << " rank " << rank;
    }
  }
}

}  // namespace
}  // namespace fsdpq::data
