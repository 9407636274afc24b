// From a dataset option to tokenized train / eval examples: fsdp_qlora's dataset choice, prompt
// style, tokenization, masking and its truncation to whole batches.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "data/example_set.h"
#include "data/examples.h"
#include "data/prompts.h"
#include "data/record_source.h"
#include "data/tokenizer.h"

namespace fsdpq::data {

struct DataOptions {
  // alpaca, alpaca_sample, dummy, guanaco, sql, orca_math, synthetic (known_datasets()).
  std::string dataset = "alpaca_sample";
  // The local JSON / JSONL file for alpaca, alpaca_sample, guanaco, sql and orca_math (fsdpq
  // downloads nothing). Must be empty for dummy and synthetic, which make their own records.
  std::filesystem::path data_path;
  int64_t dataset_samples = 128;  // alpaca_sample: the first N records; dummy / synthetic: N made
  int64_t context_length = 512;
  int64_t batch_size = 1;
  int64_t gradient_accumulation_steps = 1;
  uint64_t seed = 42;                    // synthetic records (the sampler's seed is the caller's)
  bool skip_bad_records = false;         // leave bad records out (counted) instead of stopping
  double eval_fraction = 0.0;            // the last fraction of the records becomes the eval set
  std::filesystem::path eval_data_path;  // or a separate eval file (same style)
  bool pad_to_context_length = false;    // for the collator; kept here with the other data options
};

struct DatasetStats {
  size_t records_read = 0, records_skipped = 0;
  size_t examples = 0;              // train examples kept
  // Train examples tokenized: all of them, or those the run reads (tokenize_dataset). The lengths,
  // truncation and target counts below are over these.
  size_t examples_tokenized = 0;
  size_t truncated = 0;             // train examples longer than context_length (cut)
  size_t dropped_for_batching = 0;  // train examples dropped to reach a multiple of the batch
  size_t eval_examples = 0;
  // Train example lengths in tokens before truncation (BOS and EOS included). A long text is encoded
  // only as far as context_length keeps it (examples.h): its length is then a lower bound, which
  // `at_least` marks where a percentile falls on one.
  struct Length {
    int64_t tokens = 0;
    bool at_least = false;
  };
  Length length_p50, length_p90, length_p99, length_max;
  size_t lengths_at_least = 0;  // train examples whose length is a lower bound
  int64_t target_tokens = 0;              // train tokens the loss counts (after truncation)
  // Examples left with no token for the loss once truncated to context_length (their answers
  // were cut away): they train nothing and have no loss.
  size_t train_without_targets = 0, eval_without_targets = 0;
  std::vector<std::string> skip_reasons;  // the first few
};

struct TokenizedDataset {
  ExampleSet train;
  std::vector<Example> eval;
  DatasetStats stats;
};

// A dataset's records, split and cut, before tokenization.
struct DatasetRecords {
  PromptStyle style = PromptStyle::Alpaca;
  int64_t context_length = 0;
  RecordSource train;   // cut to a multiple of batch_size × gradient_accumulation_steps
  RecordSource eval;
  DatasetStats counts;  // records read and skipped, examples kept and dropped, eval examples
};

// The dataset names build_dataset accepts.
const std::vector<std::string>& known_datasets();

// Reads the records (a made dataset's are made later, as they are tokenized), splits off the eval
// set and truncates the train set to a multiple of batch_size × gradient_accumulation_steps.
DatasetRecords load_dataset_records(const DataOptions& options);

// Formats the records in the dataset's prompt style and tokenizes them (in parallel; the result
// does not depend on the thread count): the eval set, and of the train set the examples at
// `train_indices` (strictly ascending), or all of them; another train example is tokenized when
// first read (the set then refers to `tokenizer`). Any example gets the same ids either way.
TokenizedDataset tokenize_dataset(const DatasetRecords& records, const Tokenizer& tokenizer,
                                  const std::optional<std::vector<size_t>>& train_indices);

// load_dataset_records, then tokenize_dataset of every example.
TokenizedDataset build_dataset(const DataOptions& options, const Tokenizer& tokenizer);

// A few human-readable lines about the dataset, for the run log.
std::string summarize(const DatasetStats& stats);

}  // namespace fsdpq::data
