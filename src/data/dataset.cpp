#include "data/dataset.h"

#include <algorithm>
#include <cmath>
#include <exception>

#include "data/prompts.h"
#include "data/records.h"
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

RecordSource load_records(const DataOptions& o, const DatasetKind& kind, ReadStats* stats) {
  if (!kind.reads_file) {
    if (!o.data_path.empty())
      fail(
          "data_path '{}' is set, but dataset '{}' makes its own records; use dataset = alpaca "
          "(or sql, guanaco, orca_math) to train on a file",
          o.data_path.string(), o.dataset);
    if (o.dataset == "dummy") return RecordSource::dummy(o.dataset_samples, o.context_length);
    return RecordSource::synthetic(o.dataset_samples, o.seed);
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
  return RecordSource::held(read_records(o.data_path, fields, o.skip_bad_records, stats, limit));
}

// Records are read a chunk at a time, so that a made dataset is never held whole.
constexpr size_t kTokenizeChunk = 4096;

// Tokenizes the records at `indices` in parallel into fixed slots, so the order (and so the
// result) never depends on the thread count. The first failure, by record order, is rethrown.
std::vector<Example> tokenize(const RecordSource& source, const std::vector<size_t>& indices, PromptStyle style,
                              const Tokenizer& tokenizer, int64_t context_length) {
  std::vector<Example> examples(indices.size());
  source.read(indices, kTokenizeChunk, [&](size_t first, const std::vector<Record>& records) {
    const auto n = static_cast<int64_t>(records.size());
    std::vector<std::exception_ptr> errors(records.size());
#pragma omp parallel for schedule(dynamic, 16)
    for (int64_t i = 0; i < n; ++i) {
      try {
        examples[first + static_cast<size_t>(i)] =
            make_example(format_record(records[static_cast<size_t>(i)], style), tokenizer, context_length);
      } catch (...) {
        errors[static_cast<size_t>(i)] = std::current_exception();
      }
    }
    for (const auto& error : errors)
      if (error) std::rethrow_exception(error);
  });
  return examples;
}

std::vector<size_t> first_indices(size_t n) {
  std::vector<size_t> indices(n);
  for (size_t i = 0; i < n; ++i) indices[i] = i;
  return indices;
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

DatasetRecords load_dataset_records(const DataOptions& o) {
  validate(o);
  const DatasetKind kind = dataset_kind(o.dataset);
  ReadStats read_stats;
  const RecordSource records = load_records(o, kind, &read_stats);

  DatasetRecords out;
  out.style = kind.style;
  out.context_length = o.context_length;
  size_t train_records = records.size();
  if (!o.eval_data_path.empty()) {
    out.eval = RecordSource::held(
        read_records(o.eval_data_path, required_fields(kind.style), o.skip_bad_records, &read_stats));
  } else if (o.eval_fraction > 0.0) {
    size_t count =
        static_cast<size_t>(std::floor(o.eval_fraction * static_cast<double>(records.size())));
    count = std::max<size_t>(count, 1);  // a fraction was asked for: evaluate on something
    if (count >= records.size())
      fail(
          "eval_fraction {} leaves no training records out of {}; lower eval_fraction or add "
          "records",
          o.eval_fraction, records.size());
    train_records = records.size() - count;
    out.eval = records.slice(train_records, records.size());
  }

  // fsdp_qlora: dataset.select(range(0, len - len % (batch_size * gradient_accumulation_steps))).
  const size_t multiple = static_cast<size_t>(o.batch_size * o.gradient_accumulation_steps);
  const size_t kept = train_records - train_records % multiple;
  if (kept == 0)
    fail(
        "dataset '{}' has {} training examples, fewer than batch_size × "
        "gradient_accumulation_steps = {} × {} = {}, so none is left once the train set is cut "
        "to a multiple of that; add records{} or lower batch_size or gradient_accumulation_steps",
        o.dataset, train_records, o.batch_size, o.gradient_accumulation_steps, multiple,
        kind.reads_file && !kind.first_samples_only ? "" : " (raise dataset_samples)");
  out.train = records.slice(0, kept);

  DatasetStats& s = out.counts;
  s.records_read = read_stats.read + (kind.reads_file ? 0 : records.size());
  s.records_skipped = read_stats.skipped;
  s.skip_reasons = read_stats.first_skip_reasons;
  s.dropped_for_batching = train_records - kept;
  s.examples = kept;
  s.eval_examples = out.eval.size();
  return out;
}

TokenizedDataset tokenize_dataset(const DatasetRecords& records, const Tokenizer& tokenizer,
                                  const std::optional<std::vector<size_t>>& train_indices) {
  TokenizedDataset out;
  const std::vector<size_t> wanted = train_indices ? *train_indices : first_indices(records.train.size());
  std::vector<Example> train =
      tokenize(records.train, wanted, records.style, tokenizer, records.context_length);
  // Any other example a run reads (one resumed from a checkpoint of another split of its global
  // batch may) is tokenized when first read.
  auto make = [source = records.train, style = records.style, context = records.context_length,
               &tokenizer](size_t index) {
    return make_example(format_record(source.at({index}).at(0), style), tokenizer, context);
  };
  out.train = wanted.size() == records.train.size()
                  ? ExampleSet(std::move(train))
                  : ExampleSet(records.train.size(), wanted, std::move(train), make);
  out.eval = tokenize(records.eval, first_indices(records.eval.size()), records.style, tokenizer,
                      records.context_length);

  DatasetStats& s = out.stats;
  s = records.counts;
  s.examples_tokenized = out.train.tokenized();
  std::vector<DatasetStats::Length> lengths;
  lengths.reserve(out.train.tokenized());
  auto targets_of = [](const Example& e) {
    int64_t n = 0;
    for (size_t t = 1; t < e.labels.size(); ++t) n += e.labels[t] != kIgnoreIndex;
    return n;
  };
  for (const Example& e : out.train.tokenized_examples()) {
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
  s.length_max = lengths.empty() ? DatasetStats::Length{} : lengths.back();
  return out;
}

TokenizedDataset build_dataset(const DataOptions& o, const Tokenizer& tokenizer) {
  return tokenize_dataset(load_dataset_records(o), tokenizer, std::nullopt);
}

std::string summarize(const DatasetStats& s) {
  std::string text = fmt::format(
      "records: {} read, {} skipped; examples: {} train ({} dropped to fill whole batches), {} "
      "eval\n{}"
      "train lengths in tokens: p50 {}, p90 {}, p99 {}, max {}; {} truncated to context_length; "
      "{} target tokens",
      s.records_read, s.records_skipped, s.examples, s.dropped_for_batching, s.eval_examples,
      s.examples_tokenized < s.examples
          ? fmt::format("tokenized {} of the {} train examples, those the run reads: the lengths, truncation and "
                        "target tokens below are theirs\n",
                        s.examples_tokenized, s.examples)
          : "",
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
