// Everything a training job prepares before its first step — model source, tokenizer, dataset,
// batch plan — and the dry-run report that prints it.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "config/config_loader.h"
#include "data/dataset.h"
#include "data/tokenizer.h"
#include "model/footprint.h"
#include "model/model_source.h"
#include "runtime/gpu.h"
#include "runtime/world.h"

namespace fsdpq {

struct BatchPlan {
  int world_size = 1;
  int64_t examples = 0;                 // train examples after truncation to whole batches
  int64_t examples_per_rank = 0;        // DistributedSampler: ceil(examples / world)
  int64_t micro_batches_per_epoch = 0;  // per rank: ceil(examples_per_rank / batch_size)
  int64_t steps_per_epoch = 0;          // optimizer steps: micro-batches / accumulation
  int64_t total_steps = 0;              // over all epochs, capped by max_steps
  int64_t global_batch = 0;             // examples per optimizer step over all ranks
  int64_t max_tokens_per_step = 0;      // global_batch × context_length
  double mean_tokens_per_step = 0;      // global_batch × mean (truncated) example length
  // The learning-rate schedule's length: fsdp_qlora's num_training_steps, or with packing the
  // steps its epochs hold.
  int64_t schedule_steps = 0;
  // Packing (docs/packing.md): batch_size and global_batch count rows; per epoch, the rows its
  // examples pack into (micro_batches_per_epoch and steps_per_epoch are epoch 0's), their tokens
  // and the slots they fill (rows × context_length).
  bool packing = false;
  std::vector<int64_t> rows_per_epoch;
  int64_t packed_tokens = 0, packed_slots = 0;  // epoch 0's
  // Unpacked rows: rank 0's micro-batches of epoch 0 that the run reads, their real tokens and the
  // slots of their rows padded to each micro-batch's longest example (what padding_free saves).
  int64_t unpacked_tokens = 0, unpacked_padded_slots = 0;
};

// The counts of a run over `examples` train examples (mean_tokens_per_step left at 0).
BatchPlan plan_batches(const TrainConfig& config, int64_t examples, int world_size);
// With packing: the counts again from the rows each epoch's examples pack into (every train example
// tokenized), and mean_tokens_per_step from epoch 0's rows.
void plan_packed_batches(const TrainConfig& config, BatchPlan& batches, const data::ExampleSet& train);
// Without packing: BatchPlan's unpacked_tokens and unpacked_padded_slots.
void plan_padding(const TrainConfig& config, BatchPlan& batches, const data::ExampleSet& train);
// global_batch × the mean length of the tokenized train examples (context_length when padded to it).
double mean_tokens_per_step(const TrainConfig& config, const BatchPlan& batches, const data::ExampleSet& train);

// What the run does with the train set: train on the examples its steps read (only those are
// tokenized), evaluate on all of them, or write them all out (`fsdpq examples`).
enum class DataUse { Training, Evaluation, Export };

struct RunPlan {
  ModelSource model;
  LlamaConfig trained_model;  // model.config, with Llama-Pro's new blocks (model/block_expansion.h)
  std::unique_ptr<data::Tokenizer> tokenizer;
  data::TokenizedDataset dataset;
  ModelFootprint footprint;
  BatchPlan batches;
};

data::DataOptions data_options_from(const TrainConfig& config);

// The model a run trains from a checkpoint of config `checkpoint`: the checkpoint's, or under
// bnb_llama_pro / hqq_llama_pro its block expansion (fails naming llama_pro_num_new_blocks when
// that does not divide the layer count).
LlamaConfig trained_model_config(const TrainConfig& config, const LlamaConfig& checkpoint);

// Collective: every rank prepares the same plan; any failure stops all ranks with one message.
RunPlan prepare_run(const World& world, const ResolvedConfig& resolved, DataUse use = DataUse::Training);

std::string format_dry_run(const ResolvedConfig& resolved, const RunPlan& plan, const World& world,
                           const GpuInfo& gpu);

}  // namespace fsdpq
