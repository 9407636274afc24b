// Sequence packing and padding_free (docs/packing.md): on real sql records a packed batch and a
// padding-free row compute exactly the loss and LoRA gradients of their examples padded (within
// fp32 rounding); the rows a packed epoch holds, how they are dealt to ranks, what a packed batch
// carries; padding-free micro-batches, evaluation and rows longer than a sliding window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "data/collate.h"
#include "data/dataset.h"
#include "data/packing.h"
#include "model_llama_test_support.h"
#include "test_support.h"
#include "train/epoch_batches.h"
#include "train/evaluation.h"
#include "util/error.h"

namespace fsdpq {
namespace {

constexpr int64_t kContext = 256;

data::TokenizedDataset sql_examples(const std::filesystem::path& sql, const data::Tokenizer& tokenizer) {
  data::DataOptions o;
  o.dataset = "sql";
  o.data_path = sql;
  o.context_length = kContext;
  return data::build_dataset(o, tokenizer);
}

std::vector<double> gradients(LlamaModel& model) {
  std::vector<double> all;
  for (const TrainableParameter& p : model.trainable_parameters())
    for (int64_t i = 0; i < p.grad->numel(); ++i) all.push_back(p.grad->data<float>()[i]);
  return all;
}

// The loss sum, target count and LoRA gradients of one batch (normalised by its target tokens).
struct PassResult {
  LossSum loss;
  std::vector<double> grads;
};
PassResult pass(LlamaModel& model, const data::Batch& batch) {
  model.zero_grads();
  PassResult r;
  r.loss = model.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, 0);
  r.grads = gradients(model);
  return r;
}

TEST(Packing, PackedAndPaddingFreeBatchesEqualTheirExamplesPaddedOnSqlRecords) {
  FSDPQ_SHARED_DATA_OR_SKIP(sql, "sql.jsonl");
  FSDPQ_SHARED_DATA_OR_SKIP(tokenizer_file, "tokenizer.model");
  const auto tokenizer = data::load_tokenizer(tokenizer_file.string());
  const data::TokenizedDataset dataset = sql_examples(sql, *tokenizer);
  const std::vector<data::Example>& all = dataset.train.tokenized_examples();
  ASSERT_GE(all.size(), 12u);
  std::vector<const data::Example*> examples;
  std::vector<int64_t> lengths;
  for (size_t i = 0; i < 12; ++i) {
    examples.push_back(&all[i]);
    lengths.push_back(static_cast<int64_t>(all[i].input_ids.size()));
  }
  std::vector<std::vector<const data::Example*>> rows;
  for (const auto& row : data::pack_rows(lengths, kContext)) {
    auto& r = rows.emplace_back();
    for (size_t i : row) r.push_back(examples[i]);
  }
  ASSERT_LT(rows.size(), examples.size()) << "the sql records are short: several share a row";
  const data::Batch packed = data::collate_packed(rows, tokenizer->pad_id(), kContext);
  const data::Batch unpacked = data::collate(examples, tokenizer->pad_id(), kContext, false);
  EXPECT_EQ(packed.target_tokens, unpacked.target_tokens);
  EXPECT_EQ(packed.real_tokens, unpacked.real_tokens);
  // padding_free: the same examples in one row, no padding slot.
  const data::Batch one_row = data::collate_padding_free(examples, tokenizer->pad_id(), kContext);
  EXPECT_EQ(one_row.batch_size, 1);
  EXPECT_EQ(one_row.examples, 12);
  EXPECT_EQ(one_row.seq_len, unpacked.real_tokens);
  EXPECT_EQ(one_row.target_tokens, unpacked.target_tokens);
  EXPECT_LT(unpacked.real_tokens, unpacked.batch_size * unpacked.seq_len) << "the padded batch pads";

  // fp32 (exactness within fp32 rounding), adapters made non-zero so every path carries gradient.
  LlamaModel model = LlamaModel::random(test::tiny_llama(tokenizer->vocab_size()), 17,
                                        test::lora_options(Precision::FP32, /*quantize_base=*/false));
  test::randomize_lora_b(model, 5);
  const PassResult p = pass(model, packed), u = pass(model, unpacked), f = pass(model, one_row);
  // The same per-token losses summed in another order (and through other GEMM shapes): fp32 rounding.
  for (const PassResult* r : {&p, &f}) {
    SCOPED_TRACE(r == &p ? "packed" : "padding_free");
    EXPECT_EQ(r->loss.tokens, u.loss.tokens);
    EXPECT_NEAR(r->loss.loss_sum, u.loss.loss_sum, 1e-5 * u.loss.loss_sum);
    EXPECT_LE(test::normwise_error(r->grads, u.grads), 1e-5);
  }
  std::printf("packed %zu examples into %zu rows: loss %.9g vs %.9g, gradient error %.2e\n", examples.size(),
              rows.size(), p.loss.mean(), u.loss.mean(), test::normwise_error(p.grads, u.grads));

  // Not a test that cannot fail: letting the examples attend across their boundaries (no
  // segments) changes the result well beyond that rounding.
  data::Batch leaky = packed;
  leaky.segment_start.clear();
  leaky.positions.clear();
  const PassResult l = pass(model, leaky);
  EXPECT_GT(std::fabs(l.loss.loss_sum - u.loss.loss_sum), 1e-4 * u.loss.loss_sum);
  EXPECT_GT(test::normwise_error(l.grads, u.grads), 1e-3);
}

// Examples longer than context_length are cut as collate cuts them; no example yields one padding
// slot with no target (a rank with nothing to do).
TEST(PaddingFree, CutsLongExamplesAndLaysOutTheRestEndToEnd) {
  data::Example a{{1, 5, 6, 2}, {-100, -100, 6, 2}}, b{{1, 7, 8, 9, 9, 2}, {-100, 7, 8, 9, 9, 2}};
  const data::Batch batch = data::collate_padding_free({&a, &b}, /*pad_id=*/0, 5);
  ASSERT_EQ(batch.seq_len, 9);  // 4 + b cut to 5
  EXPECT_EQ(batch.input_ids, (std::vector<int32_t>{1, 5, 6, 2, 1, 7, 8, 9, 9}));
  EXPECT_EQ(batch.labels, (std::vector<int32_t>{-100, -100, 6, 2, -100, 7, 8, 9, 9}));
  EXPECT_EQ(batch.segment_start, (std::vector<int32_t>{0, 0, 0, 0, 4, 4, 4, 4, 4}));
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, 3, 4}));
  const data::Batch padded = data::collate({&a, &b}, 0, 5, false);
  EXPECT_EQ(batch.target_tokens, padded.target_tokens);
  EXPECT_EQ(batch.real_tokens, padded.real_tokens);
  const data::Batch none = data::collate_padding_free({}, 0, 5);
  EXPECT_EQ(none.seq_len, 1);
  EXPECT_EQ(none.target_tokens, 0);
  EXPECT_EQ(none.examples, 0);
}

TEST(Packing, CollatedRowsCarryBoundariesPositionsAndNoCrossBoundaryTarget) {
  data::Example a{{1, 5, 6, 2}, {-100, -100, 6, 2}}, b{{1, 7, 2}, {-100, 7, 2}}, c{{1, 8, 9, 9, 2}, {-100, 8, 9, 9, 2}};
  const data::Batch batch = data::collate_packed({{&a, &b}, {&c}}, /*pad_id=*/0, 8);
  ASSERT_EQ(batch.seq_len, 7);  // the longest row
  EXPECT_EQ(batch.input_ids, (std::vector<int32_t>{1, 5, 6, 2, 1, 7, 2, /**/ 1, 8, 9, 9, 2, 0, 0}));
  // b's first token (position 4) is no target of a's last token: its label is ignored.
  EXPECT_EQ(batch.labels, (std::vector<int32_t>{-100, -100, 6, 2, -100, 7, 2, /**/ -100, 8, 9, 9, 2, -100, -100}));
  EXPECT_EQ(batch.segment_start, (std::vector<int32_t>{0, 0, 0, 0, 4, 4, 4, /**/ 0, 0, 0, 0, 0, 5, 6}));
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{0, 1, 2, 3, 0, 1, 2, /**/ 0, 1, 2, 3, 4, 0, 0}));
  EXPECT_EQ(batch.examples, 3);  // two rows, three examples
  EXPECT_EQ(data::collate({&a, &b}, 0, 8, false).examples, 2);
  EXPECT_EQ(batch.target_tokens, 2 + 2 + 4);  // as unpacked: labels past each example's position 0
  EXPECT_EQ(batch.real_tokens, 12);
  EXPECT_THROW(data::collate_packed({{&a, &b, &c}}, 0, 8), std::logic_error);  // 12 tokens in a row of 8
}

TEST(Packing, FirstFitDecreasingWithinAWindowKeepsEveryExampleOnce) {
  const std::vector<int64_t> lengths = {300, 100, 250, 200, 60, 500, 12, 40, 212};
  const auto rows = data::pack_rows(lengths, 512, /*window=*/6);
  std::vector<size_t> seen;
  for (const auto& row : rows) {
    int64_t used = 0;
    for (size_t i : row) used += lengths[i];
    EXPECT_LE(used, 512);
    EXPECT_TRUE(std::is_sorted(row.begin(), row.end()));
    seen.insert(seen.end(), row.begin(), row.end());
  }
  std::sort(seen.begin(), seen.end());
  std::vector<size_t> all(lengths.size());
  std::iota(all.begin(), all.end(), size_t{0});
  EXPECT_EQ(seen, all);
  // Window 1 (0..5): FFD puts 500 | 300+200 | 250+100+60; window 2 (6..8): 212+40+12. Rows follow
  // their first example's place in the order.
  EXPECT_EQ(rows, (std::vector<std::vector<size_t>>{{0, 3}, {1, 2, 4}, {5}, {6, 7, 8}}));
  EXPECT_THROW(data::pack_rows({600}, 512), std::logic_error);
}

TEST(Packing, RowsAreDealtToRanksBalancedByTokens) {
  const auto dealt = data::deal_rows({500, 100, 480, 120, 300, 310}, 2, 3);
  // 500 → rank 0, 480 → 1, 310 → 1 (790), 300 → 0 (800), 120 → 1 (910), 100 → 0 (900).
  EXPECT_EQ(dealt, (std::vector<std::vector<size_t>>{{0, 1, 4}, {2, 3, 5}}));
  EXPECT_EQ(data::deal_rows({10}, 2, 1), (std::vector<std::vector<size_t>>{{0}, {}}));
  EXPECT_THROW(data::deal_rows({1, 2, 3}, 1, 2), std::logic_error);
}

// Every rank's micro-batches of a packed epoch together hold each example once, and resuming
// after `consumed` rows continues with exactly the rows that follow, at any world size.
TEST(Packing, PackedEpochCoversEveryExampleOnceAndResumesAfterItsRows) {
  std::vector<data::Example> made;
  for (int i = 0; i < 50; ++i) {  // lengths 3..98: several per row of 128
    data::Example e;
    e.input_ids.assign(static_cast<size_t>(3 + (i * 37) % 96), i);
    e.labels = e.input_ids;
    made.push_back(e);
  }
  const data::ExampleSet examples(made);
  const BatchShape shape{.batch_size = 2, .pad_id = -1, .context_length = 128, .packing = true};
  for (int world : {1, 2, 3}) {
    std::multiset<int32_t> seen;
    int64_t rows = 0;
    for (int rank = 0; rank < world; ++rank) {
      const data::DistributedSampler sampler(50, world, rank, 7);
      const EpochBatches batches(examples, sampler, 1, shape);
      for (int64_t i = 0; i < batches.size(); ++i) {
        const data::Batch b = batches.batch(i);
        EXPECT_LE(b.batch_size, 2);
        for (size_t k = 0; k < b.input_ids.size(); ++k)
          if (b.input_ids[k] >= 0 && b.positions[k] == 0) seen.insert(b.input_ids[k]);
        rows += b.real_tokens > 0 ? b.batch_size : 0;
      }
    }
    const data::DistributedSampler any(50, world, 0, 7);
    EXPECT_EQ(rows, static_cast<int64_t>(packed_epoch_rows(examples, any, 1, 128).size())) << world << " ranks";
    EXPECT_EQ(seen.size(), 50u) << world << " ranks";
    EXPECT_EQ(std::set<int32_t>(seen.begin(), seen.end()).size(), 50u) << world << " ranks";
  }
  // One rank, resumed after 4 rows (2 micro-batches): its batches are the uninterrupted run's from
  // micro-batch 2 on.
  const data::DistributedSampler sampler(50, 1, 0, 7);
  const EpochBatches whole(examples, sampler, 1, shape), resumed(examples, sampler, 1, shape, 4);
  ASSERT_EQ(resumed.size(), whole.size() - 2);
  for (int64_t i = 0; i < resumed.size(); ++i) EXPECT_EQ(resumed.batch(i).input_ids, whole.batch(i + 2).input_ids);
}

// A padding-free row may be longer than context_length: attention and RoPE see its examples, each
// no longer than that, so a model with a sliding window takes a row longer than the window whose
// examples are shorter (and still refuses an example longer than it).
TEST(PaddingFree, ARowLongerThanTheWindowOfShorterExamplesTrains) {
  LlamaConfig config = test::tiny_llama();
  config.sliding_window = 16;
  LlamaModel model = LlamaModel::random(config, 3, test::lora_options(Precision::FP32, false));
  std::vector<data::Example> made;
  for (int i = 0; i < 3; ++i) {
    data::Example e;
    for (int t = 0; t < 12; ++t) e.input_ids.push_back(1 + (i * 7 + t * 3) % 200);
    e.labels = e.input_ids;
    made.push_back(e);
  }
  const data::Batch row = data::collate_padding_free({&made[0], &made[1], &made[2]}, 0, 16);
  ASSERT_EQ(row.seq_len, 36);
  const LossSum loss = model.forward_backward(row, static_cast<double>(row.target_tokens), 1.0f, 0);
  EXPECT_EQ(loss.tokens, 3 * 11);
  EXPECT_TRUE(std::isfinite(loss.loss_sum));
  made[0].input_ids.resize(20, 5);
  made[0].labels.resize(20, 5);
  const data::Batch long_example = data::collate_padding_free({&made[0], &made[1]}, 0, 32);
  EXPECT_THROW(model.forward_backward(long_example, 1.0, 1.0f, 0), UserError);
}

// Evaluation with padding_free: the same token-weighted mean loss as over padded batches (fp32: within
// summation order), batch sizes that leave a short last batch included.
TEST(PaddingFree, EvaluationGivesThePaddedBatchesLoss) {
  const LlamaConfig config = test::tiny_llama();
  LlamaModel model = LlamaModel::random(config, 5, test::lora_options(Precision::FP32, false));
  std::vector<data::Example> examples;
  for (int i = 0; i < 7; ++i) {
    data::Example e;
    for (int t = 0; t < 4 + (i * 5) % 13; ++t) e.input_ids.push_back(1 + (i * 11 + t * 7) % 250);
    e.labels = e.input_ids;
    e.labels[0] = data::kIgnoreIndex;
    examples.push_back(e);
  }
  for (int64_t batch : {1, 3, 7}) {
    const double padded = evaluate_loss(model, examples, batch, 0, 32);
    const double free = evaluate_loss(model, examples, batch, 0, 32, nullptr, /*padding_free=*/true);
    EXPECT_NEAR(free, padded, 1e-6 * std::fabs(padded)) << "batch " << batch;
  }
}

// With padding_free an epoch's micro-batches hold the unpacked run's examples, micro-batch by
// micro-batch (the same tokens, targets and examples, in one row), at any world size and resumed.
TEST(PaddingFree, MicroBatchesHoldTheUnpackedRunsExamples) {
  std::vector<data::Example> made;
  for (int i = 0; i < 23; ++i) {
    data::Example e;
    e.input_ids.assign(static_cast<size_t>(3 + (i * 37) % 96), i);
    e.labels = e.input_ids;
    made.push_back(e);
  }
  const data::ExampleSet examples(made);
  const BatchShape padded{.batch_size = 4, .pad_id = -1, .context_length = 64};
  BatchShape free = padded;
  free.padding_free = true;
  for (int world : {1, 2}) {
    const data::DistributedSampler sampler(23, world, world - 1, 7);
    for (int64_t consumed : {0, 8}) {
      const EpochBatches a(examples, sampler, 1, padded, consumed), b(examples, sampler, 1, free, consumed);
      ASSERT_EQ(a.size(), b.size());
      for (int64_t i = 0; i < a.size(); ++i) {
        const data::Batch x = a.batch(i), y = b.batch(i);
        EXPECT_EQ(y.batch_size, 1);
        EXPECT_EQ(y.examples, x.examples);
        EXPECT_EQ(y.real_tokens, x.real_tokens);
        EXPECT_EQ(y.seq_len, x.real_tokens);
        EXPECT_EQ(y.target_tokens, x.target_tokens);
        std::vector<int32_t> real;  // the padded rows' tokens, padding left out
        for (int32_t id : x.input_ids)
          if (id >= 0) real.push_back(id);
        EXPECT_EQ(y.input_ids, real);
      }
    }
  }
}

}  // namespace
}  // namespace fsdpq
