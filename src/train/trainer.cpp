#include "train/trainer.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>

#include "io/model_files.h"
#include "optim/clip.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "runtime/log.h"
#include "train/epoch_batches.h"
#include "train/metrics_log.h"
#include "train/progress.h"
#include "train/save_model.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0;
}

nlohmann::json run_header(const ResolvedConfig& resolved, const RunPlan& plan, const World& world,
                          const GpuInfo& gpu, int64_t total_steps) {
  nlohmann::json config = nlohmann::json::object();
  for (const auto& [key, value] : resolved.text) config[key] = value;
  const auto& m = plan.model.config;
  return {
      {"type", "header"},
      {"fsdpq_version", FSDPQ_VERSION},
      {"config_file", resolved.config_path},
      {"config", config},
      {"model",
       {{"name", plan.model.name},
        {"hidden_size", m.hidden_size},
        {"intermediate_size", m.intermediate_size},
        {"num_hidden_layers", m.num_hidden_layers},
        {"num_attention_heads", m.num_attention_heads},
        {"num_key_value_heads", m.num_key_value_heads},
        {"vocab_size", m.vocab_size},
        {"parameters", plan.footprint.params.total},
        {"trainable_parameters", plan.footprint.trainable_params}}},
      {"dataset",
       {{"train_examples", plan.dataset.train.size()},
        {"eval_examples", plan.dataset.eval.size()},
        {"target_tokens", plan.dataset.stats.target_tokens}}},
      {"world_size", world.size},
      {"nodes", world.num_nodes},
      {"launcher", world.launcher},
      {"host", world.hostname},
      {"device", gpu.has_gpu() ? gpu.name : "cpu"},
      {"total_steps", total_steps},
      {"start_unix_time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
  };
}

}  // namespace

ModelOptions model_options_from(const TrainConfig& c) {
  ModelOptions o;
  o.quantize_base = c.quantized_base();
  o.train_base = !c.is_lora();
  o.lora_rank = c.lora_rank;
  o.lora_alpha = c.lora_alpha;
  o.lora_dropout = c.lora_dropout;
  if (c.is_lora()) o.lora_targets = c.lora_target_modules;
  o.precision = parse_precision(c.precision);
  o.gradient_checkpointing = c.use_gradient_checkpointing;
  o.seed = static_cast<uint64_t>(c.seed);
  return o;
}

LlamaModel build_model(const RunPlan& plan, const ModelOptions& options) {
  if (plan.model.is_preset()) return LlamaModel::random(plan.model.config, 0, options);
  ModelWeights weights = ModelWeights::open(plan.model.directory);
  return LlamaModel::load(plan.model.config, weights, options);
}

double evaluate_loss(LlamaModel& model, const std::vector<data::Example>& examples, int64_t batch_size,
                     int32_t pad_id, int64_t context_length) {
  LossSum total;
  for (const auto& batch : sequential_batches(examples, batch_size, pad_id, context_length)) {
    LossSum l = model.evaluate(batch);
    total.loss_sum += l.loss_sum;
    total.tokens += l.tokens;
  }
  return total.mean();
}

TrainingOutcome train(const World& world, const ResolvedConfig& resolved, RunPlan& plan, const GpuInfo& gpu) {
  const TrainConfig& c = resolved.config;
  if (world.size > 1)
    fail("training on {} ranks needs sharded data parallelism, which this build does not have yet; "
         "run one rank (the dry run works on any number)", world.size);
  const auto start = Clock::now();

  auto load_start = Clock::now();
  LlamaModel model = build_model(plan, model_options_from(c));
  std::vector<TrainableParameter> params = model.trainable_parameters();
  log::info("model ready in {:.1f} s: {} trainable tensors, peak host memory {}", seconds_since(load_start),
            params.size(), human_bytes(peak_rss_bytes()));

  OptimizerConfig optimizer = optimizer_config(c.optimizer, c.lr, c.wd);
  std::vector<ShardOptimizer> optimizers;
  optimizers.reserve(params.size());
  for (const auto& p : params) optimizers.emplace_back(optimizer, p.master->numel());

  const BatchPlan& bp = plan.batches;
  const int64_t gas = c.gradient_accumulation_steps;
  LrSchedule schedule(parse_lr_schedule(c.lr_scheduler), c.lr,
                      num_training_steps(c.num_epochs, bp.micro_batches_per_epoch, gas), c.min_lr_fraction);
  const int64_t total_steps = bp.total_steps;
  if (total_steps == 0)
    fail("the run has no optimizer step: {} micro-batches per epoch and gradient_accumulation_steps = {}",
         bp.micro_batches_per_epoch, gas);

  MetricsLog metrics = world.is_root() ? MetricsLog(std::filesystem::path(c.output_dir) / "metrics.jsonl", false)
                                       : MetricsLog();
  metrics.write(run_header(resolved, plan, world, gpu, total_steps));
  Progress progress = world.is_root() ? Progress(c.log_to, c.output_dir) : Progress();
  const int32_t pad_id = plan.tokenizer->pad_id();
  data::DistributedSampler sampler(static_cast<int64_t>(plan.dataset.train.size()), world.size, world.rank,
                                   static_cast<uint64_t>(c.seed));

  TrainingOutcome outcome;
  int64_t step = 0;  // optimizer steps done
  for (int64_t epoch = 0; epoch < c.num_epochs && step < total_steps; ++epoch) {
    EpochBatches batches(plan.dataset.train, sampler, epoch, c.batch_size, pad_id, c.context_length,
                         c.pad_to_context_length);
    model.zero_grads();
    double loss_weighted = 0, samples = 0;  // fsdp_qlora's logged loss: micro-batch means weighted by batch size
    int64_t step_tokens = 0, step_targets = 0;
    auto step_start = Clock::now();
    for (int64_t i = 0; i < batches.size() && step < total_steps; ++i) {
      data::Batch batch = batches.batch(i);
      // fsdp_qlora: loss = output.loss / gradient_accumulation_steps, output.loss the micro-batch mean.
      const double normalizer = static_cast<double>(std::max<int64_t>(batch.target_tokens, 1)) * static_cast<double>(gas);
      LossSum l = model.forward_backward(batch, normalizer, 1.0f, static_cast<uint64_t>(step * gas + i % gas));
      loss_weighted += l.mean() * static_cast<double>(batch.batch_size);
      samples += static_cast<double>(batch.batch_size);
      step_tokens += batch.batch_size * batch.seq_len;
      step_targets += l.tokens;
      if ((i + 1) % gas != 0) continue;

      // Optimizer step: grad norm (always measured; clipping when enabled), update, schedule.
      std::vector<GradBuffer> grads;
      for (const auto& p : params) grads.push_back({p.grad->data<float>(), p.grad->numel()});
      const double grad_norm = std::sqrt(grad_sq_sum(grads));
      if (!std::isfinite(grad_norm))
        fail("step {}: the gradient norm is {} (loss {}): training diverged; lower lr or check the data",
             step + 1, grad_norm, loss_weighted / samples);
      if (c.apply_gradient_clipping) clip_grads_to_norm(grads, grad_norm, c.grad_norm);
      const double lr = schedule.lr_at(step);
      for (size_t k = 0; k < params.size(); ++k)
        optimizers[k].step(params[k].master->data<float>(), params[k].grad->data<float>(), lr);
      model.masters_updated();
      model.zero_grads();
      ++step;

      const double seconds = seconds_since(step_start);
      const double loss = loss_weighted / samples;
      if (step == 1) outcome.first_loss = loss;
      outcome.last_loss = loss;
      StepReport report{step, total_steps, epoch, loss, lr, grad_norm, static_cast<double>(step_tokens) / seconds};
      nlohmann::json record = {{"type", "step"},
                               {"step", step},
                               {"epoch", epoch},
                               {"loss", loss},
                               {"lr", lr},
                               {"grad_norm", grad_norm},
                               {"tokens", step_tokens},
                               {"target_tokens", step_targets},
                               {"samples", samples},
                               {"step_seconds", seconds},
                               {"tokens_per_second", static_cast<double>(step_tokens) / seconds}};
      if (c.eval_every_steps > 0 && step % c.eval_every_steps == 0 && !plan.dataset.eval.empty()) {
        double eval_loss = evaluate_loss(model, plan.dataset.eval, c.batch_size, pad_id, c.context_length);
        record["eval_loss"] = eval_loss;
        record["eval_perplexity"] = std::exp(eval_loss);
        report.eval_loss = eval_loss;
      }
      metrics.write(record);
      progress.step(report);
      loss_weighted = samples = 0;
      step_tokens = step_targets = 0;
      step_start = Clock::now();
    }
  }
  progress.finish();
  outcome.steps = step;

  if (!plan.dataset.eval.empty()) {
    outcome.eval_loss = evaluate_loss(model, plan.dataset.eval, c.batch_size, pad_id, c.context_length);
    metrics.write({{"type", "eval"}, {"step", step}, {"eval_loss", *outcome.eval_loss},
                   {"eval_perplexity", std::exp(*outcome.eval_loss)}});
    log::info("eval loss {:.4f} (perplexity {:.2f}) on {} examples", *outcome.eval_loss,
              std::exp(*outcome.eval_loss), plan.dataset.eval.size());
  }
  if (c.save_model && world.is_root()) {
    std::string where = save_trained_model(model, resolved, plan);
    log::info("saved {}", where);
  }
  outcome.seconds = seconds_since(start);
  metrics.write({{"type", "summary"},
                 {"steps", step},
                 {"first_loss", outcome.first_loss},
                 {"last_loss", outcome.last_loss},
                 {"seconds", outcome.seconds},
                 {"peak_host_memory_bytes", peak_rss_bytes()}});
  log::info("trained {} steps in {}: loss {:.4f} → {:.4f}; metrics in {}", step, format_duration(outcome.seconds),
            outcome.first_loss, outcome.last_loss, metrics.path().string());
  return outcome;
}

}  // namespace fsdpq
