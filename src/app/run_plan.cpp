#include "app/run_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "model/block_expansion.h"
#include "runtime/agreed_errors.h"
#include "runtime/fault_injection.h"
#include "runtime/host_out_of_memory.h"
#include "runtime/log.h"
#include "runtime/watchdog.h"
#include "optim/lr_schedule.h"
#include "train/epoch_batches.h"
#include "train/visited_examples.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {

data::DataOptions data_options_from(const TrainConfig& c) {
  data::DataOptions o;
  o.dataset = c.dataset;
  o.data_path = c.data_path;
  o.dataset_samples = c.dataset_samples;
  o.context_length = c.context_length;
  o.batch_size = c.batch_size;
  o.gradient_accumulation_steps = c.gradient_accumulation_steps;
  o.seed = static_cast<uint64_t>(c.seed);
  o.skip_bad_records = c.skip_bad_records;
  o.eval_fraction = c.eval_fraction;
  o.eval_data_path = c.eval_data_path;
  o.pad_to_context_length = c.pad_to_context_length;
  return o;
}

BatchPlan plan_batches(const TrainConfig& c, int64_t examples, int world_size) {
  BatchPlan p;
  p.world_size = world_size;
  p.examples = examples;
  p.examples_per_rank = (p.examples + world_size - 1) / world_size;
  p.micro_batches_per_epoch = (p.examples_per_rank + c.batch_size - 1) / c.batch_size;
  p.steps_per_epoch = p.micro_batches_per_epoch / c.gradient_accumulation_steps;
  p.total_steps = p.steps_per_epoch * c.num_epochs;
  if (c.max_steps > 0) p.total_steps = std::min(p.total_steps, c.max_steps);
  p.global_batch = c.batch_size * c.gradient_accumulation_steps * world_size;
  p.max_tokens_per_step = p.global_batch * c.context_length;
  p.schedule_steps = num_training_steps(c.num_epochs, p.micro_batches_per_epoch, c.gradient_accumulation_steps);
  return p;
}

void plan_packed_batches(const TrainConfig& c, BatchPlan& p, const data::ExampleSet& train) {
  p.packing = true;
  const data::DistributedSampler sampler(p.examples, p.world_size, 0, static_cast<uint64_t>(c.seed));
  const int64_t rows_per_micro_batch = c.batch_size * p.world_size;
  p.rows_per_epoch.clear();
  p.total_steps = 0;
  for (int64_t epoch = 0; epoch < c.num_epochs; ++epoch) {
    const std::vector<std::vector<int64_t>> rows = packed_epoch_rows(train, sampler, epoch, c.context_length);
    p.rows_per_epoch.push_back(static_cast<int64_t>(rows.size()));
    const int64_t micro_batches = (static_cast<int64_t>(rows.size()) + rows_per_micro_batch - 1) / rows_per_micro_batch;
    p.total_steps += micro_batches / c.gradient_accumulation_steps;
    if (epoch > 0) continue;
    p.micro_batches_per_epoch = micro_batches;
    p.steps_per_epoch = micro_batches / c.gradient_accumulation_steps;
    p.packed_slots = static_cast<int64_t>(rows.size()) * c.context_length;
    p.packed_tokens = 0;
    for (const auto& row : rows)
      for (int64_t index : row) p.packed_tokens += static_cast<int64_t>(train[static_cast<size_t>(index)].input_ids.size());
  }
  p.schedule_steps = p.total_steps;
  if (c.max_steps > 0) p.total_steps = std::min(p.total_steps, c.max_steps);
  // Full rows' tokens: a step's rows hold about this many real tokens.
  p.mean_tokens_per_step = p.rows_per_epoch.empty() || p.rows_per_epoch[0] == 0
                               ? 0
                               : static_cast<double>(p.packed_tokens) / static_cast<double>(p.rows_per_epoch[0]) *
                                     static_cast<double>(p.global_batch);
}

void plan_padding(const TrainConfig& c, BatchPlan& p, const data::ExampleSet& train) {
  // Rank 0's micro-batches as the trainer makes them, padded (what padding_free would not compute).
  const data::DistributedSampler sampler(p.examples, p.world_size, 0, static_cast<uint64_t>(c.seed));
  const EpochBatches batches(train, sampler, 0, {.batch_size = c.batch_size, .context_length = c.context_length});
  const int64_t read = std::min(batches.size(), p.total_steps * c.gradient_accumulation_steps);
  p.unpacked_tokens = p.unpacked_padded_slots = 0;
  for (int64_t i = 0; i < read; ++i) {
    const data::Batch batch = batches.batch(i);
    p.unpacked_tokens += batch.real_tokens;
    p.unpacked_padded_slots += batch.batch_size * batch.seq_len;
  }
}

double mean_tokens_per_step(const TrainConfig& c, const BatchPlan& b, const data::ExampleSet& train) {
  if (c.pad_to_context_length) return static_cast<double>(b.max_tokens_per_step);
  const std::vector<data::Example>& examples = train.tokenized_examples();
  double total_len = 0;
  for (const auto& e : examples) total_len += static_cast<double>(e.input_ids.size());
  const double mean_len = examples.empty() ? 0 : total_len / static_cast<double>(examples.size());
  return mean_len * static_cast<double>(b.global_batch);
}

namespace {

// A training run tokenizes only the examples its steps read (all of them when it runs whole
// epochs); evaluation reads them all. nullopt: all.
std::optional<std::vector<size_t>> train_examples_to_tokenize(const TrainConfig& c, const BatchPlan& b,
                                                              DataUse use) {
  if (use != DataUse::Training || b.total_steps == 0) return std::nullopt;  // (no step: the trainer says so)
  if (c.packing) return std::nullopt;  // the rows depend on every example's length
  std::vector<size_t> visited = examples_the_run_visits({.examples = b.examples,
                                                         .world_size = b.world_size,
                                                         .seed = static_cast<uint64_t>(c.seed),
                                                         .batch_size = c.batch_size,
                                                         .gradient_accumulation_steps = c.gradient_accumulation_steps,
                                                         .num_epochs = c.num_epochs,
                                                         .total_steps = b.total_steps});
  if (visited.size() == static_cast<size_t>(b.examples)) return std::nullopt;
  return visited;
}

}  // namespace

LlamaConfig trained_model_config(const TrainConfig& c, const LlamaConfig& checkpoint) {
  return BlockExpansion(checkpoint.num_hidden_layers, c.llama_pro() ? c.llama_pro_num_new_blocks : 0).expanded(checkpoint);
}

RunPlan prepare_run(const World& world, const ResolvedConfig& resolved, DataUse use) {
  const TrainConfig& c = resolved.config;
  RunPlan plan;
  run_on_all_ranks(world, [&] {
    if (c.world_size != -1 && c.world_size != world.size)
      fail("{}: the job runs {} rank(s) ({})", resolved.cite("world_size"), world.size, world.launcher);
    plan.model = open_model_source(c.model_name);
  });
  run_on_all_ranks(world, [&] {
    plan.tokenizer = data::load_tokenizer(tokenizer_spec_for(plan.model, c.tokenizer_path));
    if (plan.tokenizer->vocab_size() > plan.model.config.vocab_size)
      fail("the tokenizer {} has {} tokens but the model's vocab_size is {}: token ids would fall "
           "outside the embedding", plan.tokenizer->description(), plan.tokenizer->vocab_size(),
           plan.model.config.vocab_size);
    if (c.context_length > plan.model.config.max_position_embeddings)
      fail("{}: longer than the model's max_position_embeddings ({})", resolved.cite("context_length"),
           plan.model.config.max_position_embeddings);
    if (const std::string why = BlockExpansion::problem(plan.model.config.num_hidden_layers, c.llama_pro_num_new_blocks);
        !why.empty())
      fail("{}: {} (model {})", resolved.cite("llama_pro_num_new_blocks"), why, plan.model.name);
    plan.trained_model = trained_model_config(c, plan.model.config);
  });
  watchdog_phase("reading and tokenizing the data");
  run_on_all_ranks(world, [&] {
    maybe_inject_fault(world, "load_data");
    const HostMemoryPurpose purpose("reading and tokenizing the dataset");
    const data::DatasetRecords records = data::load_dataset_records(data_options_from(c));
    plan.batches = plan_batches(c, static_cast<int64_t>(records.train.size()), world.size);
    plan.dataset = data::tokenize_dataset(records, *plan.tokenizer, train_examples_to_tokenize(c, plan.batches, use));
    plan.batches.mean_tokens_per_step = mean_tokens_per_step(c, plan.batches, plan.dataset.train);
    if (c.packing)
      plan_packed_batches(c, plan.batches, plan.dataset.train);
    else if (!c.pad_to_context_length && c.dry_run)
      plan_padding(c, plan.batches, plan.dataset.train);
    // Never train on nothing: with every answer truncated away the loss would count no token.
    if (plan.dataset.stats.target_tokens == 0)
      fail("no training example keeps any answer token after truncation to {}: every label is masked "
           "(prompt tokens are not trained on{}); increase context_length",
           resolved.cite("context_length"),
           plan.dataset.train.complete()
               ? ""
               : fmt::format("; checked on the {} examples the run reads, of {}", plan.dataset.train.tokenized(),
                             plan.dataset.train.size()));
  });
  const data::DatasetStats& stats = plan.dataset.stats;
  if (!plan.dataset.train.complete() && !c.dry_run)  // (a dry run's report says so)
    log::info("tokenized {} of the {} train examples: those the run's {} step(s) read", stats.examples_tokenized,
              stats.examples, plan.batches.total_steps);
  if (stats.train_without_targets > 0)
    log::warn("{} of {} training examples{} keep no answer token after truncation to {}: they train nothing, and a "
              "step made only of them logs no loss (increase context_length to keep them)",
              stats.train_without_targets, stats.examples_tokenized,
              plan.dataset.train.complete() ? "" : " the run reads", resolved.cite("context_length"));
  if (stats.eval_without_targets > 0)
    log::warn("{} of {} eval examples keep no answer token after truncation to {}: the eval loss leaves them out",
              stats.eval_without_targets, stats.eval_examples, resolved.cite("context_length"));
  plan.footprint = model_footprint(plan.trained_model, c.quantized_base(), c.hqq_base() ? static_cast<int>(c.n_bits) : 0,
                                   c.full_finetune(), c.llama_pro() ? c.llama_pro_num_new_blocks : 0,
                                   c.is_lora() ? c.lora_rank : 0,
                                   c.is_lora() ? c.lora_target_modules : std::vector<std::string>{}, c.dora());
  return plan;
}

std::string format_dry_run(const ResolvedConfig& resolved, const RunPlan& plan, const World& world,
                           const GpuInfo& gpu) {
  const TrainConfig& c = resolved.config;
  const LlamaConfig& m = plan.model.config;
  const ModelFootprint& f = plan.footprint;
  const auto& s = plan.dataset.stats;
  const BatchPlan& b = plan.batches;
  std::string out;
  auto line = [&](const std::string& text) { out += text + "\n"; };

  line(fmt::format("== fsdpq dry run: {}", resolved.config_path.empty() ? "(no config file)" : resolved.config_path));
  line("");
  line("-- resolved config");
  out += format_resolved_config(resolved);
  line("");
  line("-- runtime");
  line(fmt::format("ranks {} ({}), nodes {}, ranks on this node {}", world.size, world.launcher, world.num_nodes,
                   world.local_size));
  line(gpu.has_gpu() ? fmt::format("GPU {} on rank 0: {} ({})", gpu.device, gpu.name, human_bytes(gpu.total_memory))
                     : fmt::format("no GPU ({}): CPU backend", gpu.name));
  line("");
  line("-- model");
  const std::string layers =
      plan.trained_model.num_hidden_layers == m.num_hidden_layers
          ? std::to_string(m.num_hidden_layers)
          : fmt::format("{} ({} with Llama-Pro's new blocks)", m.num_hidden_layers, plan.trained_model.num_hidden_layers);
  line(fmt::format("{} ({}): {}, hidden {}, intermediate {}, layers {}, heads {} (kv {}), head_dim {}, vocab {}",
                   plan.model.name, plan.model.is_preset() ? "random-initialised preset" : "HF directory",
                   m.model_type, m.hidden_size, m.intermediate_size, layers, m.num_attention_heads,
                   m.num_key_value_heads, m.head_dim, m.vocab_size));
  line(fmt::format("rope_theta {:g}{}, rms_norm_eps {:g}, tied embeddings {}", m.rope_theta,
                   m.rope_scaling.type.empty() ? "" : fmt::format(" ({} scaling x{:g})", m.rope_scaling.type,
                                                                  m.rope_scaling.factor),
                   m.rms_norm_eps, m.tie_word_embeddings ? "yes" : "no"));
  line(fmt::format("{:<22}{:>18}{:>16}", "parameters", "count", ""));
  auto row = [&](const char* what, int64_t n) { line(fmt::format("  {:<20}{:>18}{:>16}", what, n, human_count(n))); };
  row("embedding", f.params.embedding);
  row("attention q,k,v,o", f.params.attention);
  row("mlp gate,up,down", f.params.mlp);
  row("norms", f.params.norms);
  row("lm_head", f.params.lm_head);
  row("total", f.params.total);
  if (c.is_lora()) {
    row("LoRA adapters", f.lora_params);
    line(fmt::format("  LoRA r={} alpha={:g} dropout={:g} on {} ({:.3f}% of the base)", c.lora_rank, c.lora_alpha,
                     c.lora_dropout, join(c.lora_target_modules, ","),
                     100.0 * static_cast<double>(f.lora_params) / static_cast<double>(f.params.total)));
  }
  if (c.llama_pro()) {
    const BlockExpansion expansion(m.num_hidden_layers, c.llama_pro_num_new_blocks);
    std::vector<std::string> at;
    for (int64_t layer : expansion.new_layers()) at.push_back(std::to_string(layer));
    line(fmt::format("  Llama-Pro: {} new blocks at layers {} of {} (each a copy of the layer before it, o_proj and "
                     "down_proj zero), the only weights that train",
                     expansion.new_blocks(), join(at, ","), expansion.layers()));
  }
  line(fmt::format("base weights: {} in {} ({} params), {} in bf16 ({} params); trainable {} ({} fp32 masters)",
                   human_bytes(static_cast<double>(f.quantized_bytes)),
                   c.hqq_base() ? fmt::format("HQQ {}-bit", c.n_bits) : std::string("NF4"),
                   human_count(static_cast<double>(f.quantized_params)),
                   human_bytes(static_cast<double>(f.bf16_bytes)), human_count(static_cast<double>(f.bf16_base_params)),
                   human_count(static_cast<double>(f.trainable_params)),
                   human_bytes(static_cast<double>(f.trainable_fp32_bytes))));
  line("");
  line("-- tokenizer and dataset");
  line(fmt::format("tokenizer: {} (bos {}, eos {}, pad {})", plan.tokenizer->description(), plan.tokenizer->bos_id(),
                   plan.tokenizer->eos_id(), plan.tokenizer->pad_id()));
  out += data::summarize(s);
  if (out.back() != '\n') out += "\n";
  line("");
  line("-- batch plan");
  line(fmt::format("examples {} → {} per rank ({} rank(s)), batch_size {}, accumulation {}", b.examples,
                   b.examples_per_rank, b.world_size, c.batch_size, c.gradient_accumulation_steps));
  line(fmt::format("per epoch: {} micro-batches, {} optimizer steps per rank; {} epoch(s) → {} steps{}",
                   b.micro_batches_per_epoch, b.steps_per_epoch, c.num_epochs, b.total_steps,
                   c.max_steps > 0 ? fmt::format(" (max_steps {})", c.max_steps) : ""));
  if (!b.packing) {
    line(fmt::format("per optimizer step: {} examples, ≤ {} tokens (context {}), ≈ {:.0f} tokens on average",
                     b.global_batch, b.max_tokens_per_step, c.context_length, b.mean_tokens_per_step));
    const int64_t padded = b.unpacked_padded_slots - b.unpacked_tokens;
    const double share = b.unpacked_padded_slots > 0
                             ? 100.0 * static_cast<double>(padded) / static_cast<double>(b.unpacked_padded_slots)
                             : 0.0;
    const std::string counted = fmt::format("rank 0's micro-batches of epoch 1 that the run reads: {} real tokens; "
                                            "rows padded to each one's longest example would hold {} slots, {} "
                                            "of them padding ({:.1f}%)",
                                            b.unpacked_tokens, b.unpacked_padded_slots, padded, share);
    if (c.padding_free)
      line("padding_free: each micro-batch's examples laid end to end in one row, no padding computed" +
           (b.unpacked_padded_slots > 0 ? fmt::format(" ({})", counted) : std::string()));
    else if (b.unpacked_padded_slots > 0)
      line(fmt::format("padding: {}{}", counted,
                       share >= 10.0 ? "; padding_free = true computes none of it (the same batches and loss, "
                                       "docs/packing.md)"
                                     : ""));
    return out;
  }
  // Packing: batch_size counts rows of up to context_length tokens.
  const int64_t rows = b.rows_per_epoch.empty() ? 0 : b.rows_per_epoch[0];
  line(fmt::format("packing: epoch 1's {} examples fill {} rows of {} slots: {} real tokens in {} slots, {} padded "
                   "(packing efficiency {:.1f}%, {:.1f} examples per row)",
                   b.examples, rows, c.context_length, b.packed_tokens, b.packed_slots, b.packed_slots - b.packed_tokens,
                   b.packed_slots > 0 ? 100.0 * static_cast<double>(b.packed_tokens) / static_cast<double>(b.packed_slots) : 0.0,
                   rows > 0 ? static_cast<double>(b.examples) / static_cast<double>(rows) : 0.0));
  line(fmt::format("per optimizer step: {} rows, ≤ {} tokens (context {}), ≈ {:.0f} real tokens on average",
                   b.global_batch, b.max_tokens_per_step, c.context_length, b.mean_tokens_per_step));
  return out;
}

}  // namespace fsdpq
