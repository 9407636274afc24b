#include "data/dataset.h"

#include <algorithm>
#include <cmath>
#include <exception>

#include "data/prompts.h"
#include "data/records.h"
#include "data/synthetic.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq::data {

namespace {

// Which records a dataset name means and how they are formatted.
struct DatasetKind {
  PromptStyle style;
  bool reads_file;
  bool first_samples_only;  // alpaca_sample: train[:dataset_samples]
};

DatasetKind dataset_kind(const std::string& name) {
  if (name == "alpaca") return {PromptStyle::Alpaca, true, false};
  if (name == "alpaca_sample") return {PromptStyle::Alpaca, true, true};
  if (name == "dummy" || name == "synthetic") return {PromptStyle::Alpaca, false, false};
  if (name == "sql") return {PromptStyle::Qna, true, false};
  if (name == "orca_math") return {PromptStyle::QnaNoCtx, true, false};
  if (name == "guanaco") return {PromptStyle::Guanaco, true, false};
  std::string suggestion = closest_match(name, known_datasets());
  fail("dataset '{}' is unknown{}; expected one of {}", name,
       suggestion.empty() ? "" : fmt::format(" (did you mean '{}'?)", suggestion),
       join(known_datasets(), ", "));
}

void validate(const DataOptions& o) {
  if (o.context_length < 1)
    fail("context_length is {}; expected a positive number of tokens", o.context_length);
  if (o.batch_size < 1) fail("batch_size is {}; expected at least 1", o.batch_size);
  if (o.gradient_accumulation_steps < 1)
    fail("gradient_accumulation_steps is {}; expected at least 1", o.gradient_accumulation_steps);
  if (!(o.eval_fraction >= 0.0 && o.eval_fraction < 1.0))
    fail("eval_fraction is {}; expected a fraction in [0, 1)", o.eval_fraction);
  if (o.eval_fraction > 0.0 && !o.eval_data_path.empty())
    fail("both eval_fraction ({}) and eval_data_path ('{}') are set; use one of them",
         o.eval_fraction, o.eval_data_path.string());
}

std::vector<Record> load_records(const DataOptions& o, const DatasetKind& kind, ReadStats* stats) {
  if (!kind.reads_file) {
    if (!o.data_path.empty())
      fail(
          "data_path '{}' is set, but dataset '{}' makes its own records; use dataset = alpaca "
          "(or sql, guanaco, orca_math) to train on a file",
          o.data_path.string(), o.dataset);
    if (o.dataset == "dummy") return make_dummy_records(o.dataset_samples, o.context_length);
    return make_synthetic_records(o.dataset_samples, o.seed);
  }
  const std::vector<std::string> fields = required_fields(kind.style);
  if (o.data_path.empty())
    fail(
        "dataset '{}' needs data_path: fsdpq downloads nothing, so point data_path at a local "
        "JSON or JSONL file whose records have the fields {}",
        o.dataset, join(fields, ", "));
  size_t limit = SIZE_MAX;
  if (kind.first_samples_only) {
    if (o.dataset_samples < 1)
      fail("dataset_samples is {}; expected at least 1", o.dataset_samples);
    limit = static_cast<size_t>(o.dataset_samples);
  }
  return read_records(o.data_path, fields, o.skip_bad_records, stats, limit);
}

// Tokenizes in parallel into fixed slots, so the order (and so the result) never depends on
// the thread count. The first failure, by record order, is rethrown.
std::vector<Example> tokenize(const std::vector<Record>& records, PromptStyle style,
                              const Tokenizer& tokenizer, int64_t context_length) {
  const int64_t n = static_cast<int64_t>(records.size());
  std::vector<Example> examples(records.size());
  std::vector<std::exception_ptr> errors(records.size());
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t i = 0; i < n; ++i) {
    try {
      examples[i] = make_example(format_record(records[i], style), tokenizer, context_length);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  }
  for (const auto& error : errors)
    if (error) std::rethrow_exception(error);
  return examples;
}

// Nearest-rank percentile of sorted values.
DatasetStats::Length percentile(const std::vector<DatasetStats::Length>& sorted, double p) {
  if (sorted.empty()) return {};
  size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::clamp<size_t>(rank, 1, sorted.size()) - 1];
}

std::string length_text(const DatasetStats::Length& length) {
  return fmt::format("{}{}", length.at_least ? "≥" : "", length.tokens);
}

}  // namespace

const std::vector<std::string>& known_datasets() {
  static const std::vector<std::string> names = {"alpaca", "alpaca_sample", "dummy",    "guanaco",
                                                 "sql",    "orca_math",     "synthetic"};
  return names;
}

TokenizedDataset build_dataset(const DataOptions& o, const Tokenizer& tokenizer) {
  validate(o);
  const DatasetKind kind = dataset_kind(o.dataset);
  ReadStats read_stats;
  std::vector<Record> records = load_records(o, kind, &read_stats);

  std::vector<Record> eval_records;
  if (!o.eval_data_path.empty()) {
    eval_records = read_records(o.eval_data_path, required_fields(kind.style), o.skip_bad_records,
                                &read_stats);
  } else if (o.eval_fraction > 0.0) {
    size_t count =
        static_cast<size_t>(std::floor(o.eval_fraction * static_cast<double>(records.size())));
    count = std::max<size_t>(count, 1);  // a fraction was asked for: evaluate on something
    if (count >= records.size())
      fail(
          "eval_fraction {} leaves no training records out of {}; lower eval_fraction or add "
          "records",
          o.eval_fraction, records.size());
    eval_records.assign(std::make_move_iterator(records.end() - static_cast<std::ptrdiff_t>(count)),
                        std::make_move_iterator(records.end()));
    records.resize(records.size() - count);
  }

  TokenizedDataset out;
  out.train = tokenize(records, kind.style, tokenizer, o.context_length);
  out.eval = tokenize(eval_records, kind.style, tokenizer, o.context_length);

  // fsdp_qlora: dataset.select(range(0, len - len % (batch_size * gradient_accumulation_steps))).
  const size_t multiple = static_cast<size_t>(o.batch_size * o.gradient_accumulation_steps);
  const size_t kept = out.train.size() - out.train.size() % multiple;
  if (kept == 0)
    fail(
        "dataset '{}' has {} training examples, fewer than batch_size × "
        "gradient_accumulation_steps = {} × {} = {}, so none is left once the train set is cut "
        "to a multiple of that; add records{} or lower batch_size or gradient_accumulation_steps",
        o.dataset, out.train.size(), o.batch_size, o.gradient_accumulation_steps, multiple,
        kind.reads_file && !kind.first_samples_only ? "" : " (raise dataset_samples)");

  DatasetStats& s = out.stats;
  s.records_read = read_stats.read + (kind.reads_file ? 0 : records.size() + eval_records.size());
  s.records_skipped = read_stats.skipped;
  s.skip_reasons = read_stats.first_skip_reasons;
  s.dropped_for_batching = out.train.size() - kept;
  out.train.resize(kept);
  s.examples = out.train.size();
  s.eval_examples = out.eval.size();

  std::vector<DatasetStats::Length> lengths;
  lengths.reserve(out.train.size());
  auto targets_of = [](const Example& e) {
    int64_t n = 0;
    for (size_t t = 1; t < e.labels.size(); ++t) n += e.labels[t] != kIgnoreIndex;
    return n;
  };
  for (const Example& e : out.train) {
    lengths.push_back({e.full_length, !e.full_length_exact});
    s.lengths_at_least += !e.full_length_exact;
    s.truncated += e.truncated;
    const int64_t targets = targets_of(e);
    s.target_tokens += targets;
    s.train_without_targets += targets == 0;
  }
  for (const Example& e : out.eval) s.eval_without_targets += targets_of(e) == 0;
  // A lower bound sorts after an exact length of the same value: it may stand for more.
  std::sort(lengths.begin(), lengths.end(), [](const DatasetStats::Length& a, const DatasetStats::Length& b) {
    return a.tokens != b.tokens ? a.tokens < b.tokens : a.at_least < b.at_least;
  });
  s.length_p50 = percentile(lengths, 50);
  s.length_p90 = percentile(lengths, 90);
  s.length_p99 = percentile(lengths, 99);
  s.length_max = lengths.back();
  return out;
}

std::string summarize(const DatasetStats& s) {
  std::string text = fmt::format(
      "records: {} read, {} skipped; examples: {} train ({} dropped to fill whole batches), {} "
      "eval\n"
      "train lengths in tokens: p50 {}, p90 {}, p99 {}, max {}; {} truncated to context_length; "
      "{} target tokens",
      s.records_read, s.records_skipped, s.examples, s.dropped_for_batching, s.eval_examples,
      length_text(s.length_p50), length_text(s.length_p90), length_text(s.length_p99), length_text(s.length_max),
      s.truncated, s.target_tokens);
  if (s.lengths_at_least > 0)
    text += fmt::format("\n{} long text(s) encoded only as far as context_length keeps them: their lengths are "
                        "lower bounds (≥)", s.lengths_at_least);
  if (s.train_without_targets > 0 || s.eval_without_targets > 0)
    text += fmt::format("\nno target token left after truncation: {} train, {} eval examples", s.train_without_targets,
                        s.eval_without_targets);
  for (const std::string& reason : s.skip_reasons) text += "\nskipped: " + reason;
  return text;
}

}  // namespace fsdpq::data
