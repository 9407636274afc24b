// build_dataset: dataset names, truncation to whole batches, eval split, stats and errors.
#include <gtest/gtest.h>
#include <omp.h>

#include "data/dataset.h"
#include "data/records.h"
#include "data/synthetic.h"
#include "test_support.h"
#include "util/error.h"

namespace fsdpq::data {
namespace {
namespace fs = std::filesystem;

using test::error_of;

DataOptions synthetic(int64_t samples) {
  DataOptions o;
  o.dataset = "synthetic";
  o.dataset_samples = samples;
  o.context_length = 256;
  return o;
}

TEST(DataDataset, TruncatesTrainToAMultipleOfTheBatch) {
  ByteTokenizer tok;
  DataOptions o = synthetic(103);
  o.batch_size = 4;
  o.gradient_accumulation_steps = 2;
  TokenizedDataset d = build_dataset(o, tok);
  EXPECT_EQ(d.train.size(), 96u);
  EXPECT_EQ(d.stats.examples, 96u);
  EXPECT_EQ(d.stats.dropped_for_batching, 7u);
  EXPECT_EQ(d.stats.records_read, 103u);
  EXPECT_EQ(d.stats.eval_examples, 0u);
  // The first examples are kept (fsdp_qlora selects range(0, len - len % multiple)).
  auto records = make_synthetic_records(103, o.seed);
  Example first = make_example(format_record(records[0], PromptStyle::Alpaca), tok, 256);
  EXPECT_EQ(d.train[0].input_ids, first.input_ids);
  EXPECT_EQ(d.train[95].input_ids,
            make_example(format_record(records[95], PromptStyle::Alpaca), tok, 256).input_ids);
}

TEST(DataDataset, NothingLeftAfterBatchingIsAnError) {
  ByteTokenizer tok;
  DataOptions o = synthetic(5);
  o.batch_size = 3;
  o.gradient_accumulation_steps = 2;
  EXPECT_EQ(
      error_of([&] { build_dataset(o, tok); }),
      "dataset 'synthetic' has 5 training examples, fewer than batch_size × "
      "gradient_accumulation_steps = 3 × 2 = 6, so none is left once the train set is cut to a "
      "multiple of that; add records (raise dataset_samples) or lower batch_size or "
      "gradient_accumulation_steps");
}

TEST(DataDataset, EvalSplitTakesTheLastRecords) {
  ByteTokenizer tok;
  DataOptions o = synthetic(50);
  o.eval_fraction = 0.1;
  TokenizedDataset d = build_dataset(o, tok);
  EXPECT_EQ(d.train.size(), 45u);
  EXPECT_EQ(d.eval.size(), 5u);
  auto records = make_synthetic_records(50, o.seed);
  EXPECT_EQ(d.eval[0].input_ids,
            make_example(format_record(records[45], PromptStyle::Alpaca), tok, 256).input_ids);

  // Or a separate file in the same style.
  fs::path dir = test::make_temp_dir("data-eval");
  write_jsonl(dir / "eval.jsonl", make_synthetic_records(7, 99));
  DataOptions with_file = synthetic(20);
  with_file.eval_data_path = dir / "eval.jsonl";
  TokenizedDataset e = build_dataset(with_file, tok);
  EXPECT_EQ(e.train.size(), 20u);
  EXPECT_EQ(e.eval.size(), 7u);
}

TEST(DataDataset, StatsDescribeLengthsTruncationAndTargets) {
  ByteTokenizer tok;
  DataOptions o;
  o.dataset = "dummy";
  o.dataset_samples = 4;
  o.context_length = 64;
  TokenizedDataset d = build_dataset(o, tok);
  ASSERT_EQ(d.train.size(), 4u);
  // dummy's output is 2 × context_length copies of "output": always longer than the context.
  EXPECT_EQ(d.stats.truncated, 4u);
  const std::string prompt =
      "Below is an instruction that describes a task, paired with an input that provides further "
      "context. Write a response that appropriately completes the request.\n\n### Instruction:\n"
      "instruction\n\n### Input:\ninput\n\n### Response:";
  // The texts are encoded only as far as the context keeps them (63 bytes after BOS): their lengths
  // are lower bounds, and say so.
  EXPECT_EQ(d.stats.length_max.tokens, 1 + 63 + 1);
  EXPECT_TRUE(d.stats.length_max.at_least);
  EXPECT_TRUE(d.stats.length_p50.at_least);
  EXPECT_EQ(d.stats.lengths_at_least, 4u);
  EXPECT_EQ(d.train[0].input_ids.size(), 64u);
  EXPECT_EQ(d.stats.target_tokens, 0);  // the prompt alone fills the 64-token context
  EXPECT_NE(summarize(d.stats).find("4 truncated to context_length"), std::string::npos);
  EXPECT_NE(summarize(d.stats).find("p50 ≥65, p90 ≥65, p99 ≥65, max ≥65"), std::string::npos) << summarize(d.stats);
  EXPECT_NE(summarize(d.stats).find("4 long text(s) encoded only as far as context_length keeps them"),
            std::string::npos);

  // With a longer context the start of the output is trained on: what follows BOS + prompt.
  o.context_length = 1024;
  TokenizedDataset longer = build_dataset(o, tok);
  EXPECT_EQ(longer.stats.truncated, 4u);
  EXPECT_EQ(longer.stats.target_tokens, 4 * (1024 - 1 - static_cast<int64_t>(prompt.size())));
}

TEST(DataDataset, TokenizationDoesNotDependOnThreadCount) {
  ByteTokenizer tok;
  DataOptions o = synthetic(500);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  TokenizedDataset one = build_dataset(o, tok);
  omp_set_num_threads(4);
  TokenizedDataset four = build_dataset(o, tok);
  omp_set_num_threads(threads);
  ASSERT_EQ(one.train.size(), four.train.size());
  for (size_t i = 0; i < one.train.size(); ++i) {
    EXPECT_EQ(one.train[i].input_ids, four.train[i].input_ids);
    EXPECT_EQ(one.train[i].labels, four.train[i].labels);
  }
}

TEST(DataDataset, FileDatasetsOnRealData) {
  FSDPQ_SHARED_DATA_OR_SKIP(model, "tokenizer.model");
  FSDPQ_SHARED_DATA_OR_SKIP(alpaca, "alpaca.jsonl");
  FSDPQ_SHARED_DATA_OR_SKIP(sql, "sql.jsonl");
  auto tok = load_tokenizer(model.string());
  DataOptions o;
  o.dataset = "alpaca_sample";
  o.data_path = alpaca;
  o.dataset_samples = 128;
  o.batch_size = 8;
  TokenizedDataset a = build_dataset(o, *tok);
  EXPECT_EQ(a.stats.records_read, 128u);
  EXPECT_EQ(a.train.size(), 128u);
  EXPECT_GT(a.stats.length_p90.tokens, a.stats.length_p50.tokens);
  EXPECT_LE(a.stats.length_p99.tokens, a.stats.length_max.tokens);
  // Parallel tokenization with sentencepiece gives what a serial loop gives.
  auto records = read_records(alpaca, required_fields(PromptStyle::Alpaca), false, nullptr, 128);
  for (size_t i = 0; i < records.size(); ++i) {
    Example serial = make_example(format_record(records[i], PromptStyle::Alpaca), *tok, 512);
    ASSERT_EQ(a.train[i].input_ids, serial.input_ids) << "record " << i;
    ASSERT_EQ(a.train[i].labels, serial.labels) << "record " << i;
  }

  o.dataset = "sql";
  o.data_path = sql;
  o.batch_size = 3;
  TokenizedDataset s = build_dataset(o, *tok);
  EXPECT_EQ(s.stats.records_read, 4000u);
  EXPECT_EQ(s.train.size(), 3999u);
  EXPECT_EQ(s.stats.dropped_for_batching, 1u);
  EXPECT_EQ(s.stats.truncated, 0u);
}

TEST(DataDataset, SkipBadRecordsFlowsIntoStats) {
  ByteTokenizer tok;
  fs::path dir = test::make_temp_dir("data-skip");
  test::write_file(dir / "d.jsonl",
                   "{\"instruction\": \"a\", \"output\": \"b\"}\n{\"oops\": \"x\"}\n"
                   "{\"instruction\": \"c\", \"output\": \"d\"}\n");
  DataOptions o;
  o.dataset = "alpaca";
  o.data_path = dir / "d.jsonl";
  o.skip_bad_records = true;
  TokenizedDataset d = build_dataset(o, tok);
  EXPECT_EQ(d.stats.records_read, 2u);
  EXPECT_EQ(d.stats.records_skipped, 1u);
  ASSERT_EQ(d.stats.skip_reasons.size(), 1u);
  EXPECT_EQ(d.stats.skip_reasons[0], (dir / "d.jsonl").string() +
                                         ":2: missing field 'instruction'; each record needs the "
                                         "fields instruction, output");
}

TEST(DataDataset, OptionErrors) {
  ByteTokenizer tok;
  DataOptions o;
  o.dataset = "alpaka";
  EXPECT_EQ(error_of([&] { build_dataset(o, tok); }),
            "dataset 'alpaka' is unknown (did you mean 'alpaca'?); expected one of alpaca, "
            "alpaca_sample, dummy, guanaco, sql, orca_math, synthetic");
  o.dataset = "guanaco";
  EXPECT_EQ(error_of([&] { build_dataset(o, tok); }),
            "dataset 'guanaco' needs data_path: fsdpq downloads nothing, so point data_path at a "
            "local JSON or JSONL file whose records have the fields text");
  o = synthetic(10);
  o.data_path = "x.jsonl";
  EXPECT_EQ(
      error_of([&] { build_dataset(o, tok); }),
      "data_path 'x.jsonl' is set, but dataset 'synthetic' makes its own records; use dataset "
      "= alpaca (or sql, guanaco, orca_math) to train on a file");
  o = synthetic(10);
  o.eval_fraction = 1.0;
  EXPECT_EQ(error_of([&] { build_dataset(o, tok); }),
            "eval_fraction is 1; expected a fraction in [0, 1)");
  o.eval_fraction = 0.5;
  o.eval_data_path = "e.jsonl";
  EXPECT_EQ(error_of([&] { build_dataset(o, tok); }),
            "both eval_fraction (0.5) and eval_data_path ('e.jsonl') are set; use one of them");
  o = synthetic(10);
  o.batch_size = 0;
  EXPECT_EQ(error_of([&] { build_dataset(o, tok); }), "batch_size is 0; expected at least 1");
  o = synthetic(0);
  EXPECT_EQ(error_of([&] { build_dataset(o, tok); }),
            "dataset_samples is 0; the synthetic dataset needs at least 1");
}

}  // namespace
}  // namespace fsdpq::data
