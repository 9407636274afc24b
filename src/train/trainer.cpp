#include "train/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <omp.h>
#include <thread>

#include "backend/cuda_backend.h"
#include "backend/section_times.h"
#include "dist/device_collectives.h"
#include "dist/fsdp_engine.h"
#include "dist/process_groups.h"
#include "dist/shard_loader.h"
#include "io/model_files.h"
#include "optim/clip.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "runtime/agreed_errors.h"
#include "runtime/exit_codes.h"
#include "runtime/fault_injection.h"
#include "runtime/host_memory.h"
#include "runtime/host_out_of_memory.h"
#include "runtime/log.h"
#include "runtime/preemption.h"
#include "train/epoch_batches.h"
#include "train/metrics_log.h"
#include "train/progress.h"
#include "train/run_directory.h"
#include "train/save_model.h"
#include "train/trace_writer.h"
#include "train/train_checkpoint.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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
        // All of them, or those the run reads (only those are tokenized): the target tokens are theirs.
        {"train_examples_tokenized", plan.dataset.train.tokenized()},
        {"eval_examples", plan.dataset.eval.size()},
        {"target_tokens", plan.dataset.stats.target_tokens}}},
      {"world_size", world.size},
      {"nodes", world.num_nodes},
      {"launcher", world.launcher},
      {"host", world.hostname},
      // What the host's parallel loops (the CPU-offload update above all) run on: the OpenMP
      // team size and the CPUs this process may use.
      {"host_threads", omp_get_max_threads()},
      {"host_cpus", std::thread::hardware_concurrency()},
      {"device", gpu.has_gpu() ? gpu.name : "cpu"},
      {"total_steps", total_steps},
      {"start_unix_time", std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count()},
  };
}

// fsdp_qlora's memory checkpoints: host memory, and on a GPU the allocator's numbers (this rank's).
nlohmann::json memory_record(const char* at, int64_t step, Device device) {
  const HostMemory host = host_memory();
  nlohmann::json r = {{"type", "memory"},
                      {"at", at},
                      {"step", step},
                      {"host_private_bytes", host.private_now},
                      {"host_peak_resident_bytes", host.peak_resident}};
  if (device == Device::CUDA) {
    const MemoryStats m = cuda_memory_stats();
    r["allocated_bytes"] = m.allocated;
    r["reserved_bytes"] = m.reserved;
    r["peak_allocated_bytes"] = m.peak_allocated;
    r["peak_reserved_bytes"] = m.peak_reserved;
  }
  return r;
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
  o.activation_offload = c.use_activation_cpu_offload;
  o.seed = static_cast<uint64_t>(c.seed);
  return o;
}

namespace {

template <class Receiver>
LlamaModel build_model_with(const RunPlan& plan, const ModelOptions& options, const Receiver& receiver,
                            uint64_t* bytes_read) {
  if (bytes_read) *bytes_read = 0;
  if (plan.model.is_preset()) return LlamaModel::random(plan.model.config, 0, options, receiver);
  ModelWeights weights = ModelWeights::open(plan.model.directory);
  LlamaModel model = LlamaModel::load(plan.model.config, weights, options, receiver);
  if (bytes_read) *bytes_read = weights.bytes_read();
  return model;
}

}  // namespace

LlamaModel build_model(const RunPlan& plan, const ModelOptions& options, const UnitBuiltCallback& on_unit_built,
                       uint64_t* bytes_read) {
  return build_model_with(plan, options, on_unit_built, bytes_read);
}

LlamaModel build_model(const RunPlan& plan, const ModelOptions& options, const UnitLoader& load_unit,
                       uint64_t* bytes_read) {
  return build_model_with(plan, options, load_unit, bytes_read);
}

double evaluate_loss(LlamaModel& model, const std::vector<data::Example>& examples, int64_t batch_size,
                     int32_t pad_id, int64_t context_length, Communicator* world) {
  const HostMemoryPurpose purpose("evaluating");
  const std::vector<data::Batch> batches = sequential_batches(examples, batch_size, pad_id, context_length);
  const int64_t ranks = world ? world->size() : 1, rank = world ? world->rank() : 0;
  const int64_t n = static_cast<int64_t>(batches.size());
  // Batches go round-robin over the ranks; a rank without one in the last round runs batch 0
  // and discards it, so every rank makes the same passes (and the same gathers).
  double sums[2] = {0, 0};  // loss sum, tokens
  for (int64_t round = 0; round * ranks < n; ++round) {
    const int64_t i = round * ranks + rank;
    LossSum l = model.evaluate(batches[static_cast<size_t>(i < n ? i : 0)]);
    if (i >= n) continue;
    sums[0] += l.loss_sum;
    sums[1] += static_cast<double>(l.tokens);
  }
  if (world) world->all_reduce(sums, 2, CommType::F64, ReduceOp::Sum).wait();
  // A mean over no token is undefined, not 0 (JSON writes NaN as null).
  return sums[1] > 0 ? sums[0] / sums[1] : std::nan("");
}

std::string describe_eval(double loss, const std::vector<data::Example>& examples) {
  size_t scored = 0;
  for (const data::Example& e : examples)
    scored += std::any_of(e.labels.begin() + (e.labels.empty() ? 0 : 1), e.labels.end(),
                          [](int32_t label) { return label != data::kIgnoreIndex; });
  const std::string left_out =
      scored < examples.size()
          ? fmt::format(" ({} of {} keep no target token after truncation and are left out)", examples.size() - scored,
                        examples.size())
          : "";
  if (scored == 0 || !std::isfinite(loss))
    return fmt::format("eval: no loss, no eval example keeps a target token after truncation{}", left_out);
  return fmt::format("eval loss {:.4f} (perplexity {:.2f}) on {} examples{}", loss, std::exp(loss), scored, left_out);
}

TrainingOutcome train(const World& world, const ResolvedConfig& resolved, RunPlan& plan, const GpuInfo& gpu) {
  const TrainConfig& c = resolved.config;
  const auto start = Clock::now();

  // Ranks, groups and the sharded model: each rank keeps its shards as the units are built.
  const ShardingStrategy strategy = parse_sharding_strategy(c.sharding_strategy);
  const bool hybrid = strategy == ShardingStrategy::HybridFullShard || strategy == ShardingStrategy::HybridShardGradOp;
  ProcessGroups groups = make_process_groups(world, strategy, hybrid ? c.ranks_per_node : 0);
  const ModelOptions options = model_options_from(c);
  const OptimizerConfig optimizer = optimizer_config(c.optimizer, c.lr, c.wd);
  // A rank with a GPU computes there (CUDA_VISIBLE_DEVICES= keeps it on the CPU backend).
  const Device device = gpu.has_gpu() ? Device::CUDA : Device::CPU;
  if (device == Device::CUDA) {
    run_on_all_ranks(world, [&] { cuda_init(gpu.device); });
    // The gathers and gradient reductions over GPU memory: NCCL, or MPI staged through the host.
    const DeviceTransport transport = add_device_collectives(groups, world, gpu);
    if (world.size > 1) log::info("collectives over GPU memory: {}", device_transport_name(transport));
  }
  // use_cpu_offload keeps the shards' masters, gradients and optimizer state in host memory and
  // steps them on the CPU; otherwise they live (and are stepped) where the model computes.
  const Device state_device = c.use_cpu_offload ? Device::CPU : device;
  // What an out-of-memory message says the run was doing.
  std::optional<HostMemoryPurpose> doing;
  doing.emplace("loading the model (this rank's weights, fp32 masters and optimizer state)");
  FsdpEngine engine(groups,
                    {.compute_dtype = activation_dtype(options.precision),
                     .device = device,
                     .state_device = state_device,
                     .optimizer = optimizer,
                     .offload_frozen = c.use_cpu_offload,
                     .overlap_host_optimizer = c.use_cpu_offload},
                    static_cast<int>(plan.model.config.num_hidden_layers) + 1);
  auto load_start = Clock::now();
  std::optional<LlamaModel> model_slot;
  uint64_t read_bytes = 0;
  run_on_all_ranks(world, [&] {
    // One rank keeps whole units; a rank of a larger shard group reads and builds only its shards.
    if (engine.resident())
      model_slot.emplace(build_model(
          plan, options, [&](int unit, ParamUnit& contents) { engine.adopt_unit(unit, contents); }, &read_bytes));
    else
      model_slot.emplace(build_model(plan, options, shard_loader(world, engine), &read_bytes));
  });
  LlamaModel& model = *model_slot;
  engine.attach(model);
  if (device == Device::CUDA) {
    run_on_all_ranks(world, [&] { model.place_on(device); });
    log::info("GPU {} ({}): {}", gpu.device, gpu.name, format_memory_stats(cuda_memory_stats()));
  }
  const ShardBytes held = engine.shard_bytes();
  const HostMemory memory = host_memory();
  const double peak_host = groups.world->all_reduce_max(static_cast<double>(memory.peak_resident));
  const double private_host = groups.world->all_reduce_max(static_cast<double>(memory.private_now));
  std::vector<int64_t> read_per_rank(static_cast<size_t>(world.size), 0);
  read_per_rank[static_cast<size_t>(world.rank)] = static_cast<int64_t>(read_bytes);
  groups.world->all_reduce(read_per_rank.data(), read_per_rank.size(), CommType::I64, ReduceOp::Sum).wait();
  log::info("model ready in {:.1f} s ({} on {} rank{}): this rank holds {} of {} frozen and {} of {} trainable; host "
            "memory per rank (largest): {} private now, peak resident {} (incl. mapped model files); read {} of the "
            "model files on this rank",
            seconds_since(load_start), sharding_strategy_name(groups.strategy), world.size, world.size == 1 ? "" : "s",
            human_bytes(static_cast<double>(held.frozen)), human_bytes(static_cast<double>(held.model_frozen)),
            human_bytes(static_cast<double>(held.trainable)), human_bytes(static_cast<double>(held.model_trainable)),
            human_bytes(private_host), human_bytes(peak_host), human_bytes(static_cast<double>(read_bytes)));

  maybe_inject_fault(world, "after_load");
  const BatchPlan& bp = plan.batches;
  const int64_t gas = c.gradient_accumulation_steps;
  LrSchedule schedule(parse_lr_schedule(c.lr_scheduler), c.lr,
                      num_training_steps(c.num_epochs, bp.micro_batches_per_epoch, gas), c.min_lr_fraction);
  const int64_t total_steps = bp.total_steps;
  if (total_steps == 0)
    fail("the run has no optimizer step: {} micro-batches per epoch and gradient_accumulation_steps = {}",
         bp.micro_batches_per_epoch, gas);

  // What the checkpoints record of the base, and what a resumed one must match.
  const nlohmann::json fingerprint = run_base_fingerprint(world, plan);
  TrainingPosition position;
  std::optional<std::filesystem::path> resume_from;
  run_on_all_ranks(world, [&] { resume_from = checkpoint_to_resume(c); });
  if (resume_from) {
    // Its errors are the same on every rank (the reader agrees them): report them once.
    run_on_all_ranks(world, [&] { position = load_training_checkpoint(world, *resume_from, engine, resolved, plan, fingerprint); });
  } else if (c.resume == "auto") {
    log::info("resume = auto: no checkpoint in {} yet, starting from step 0", c.checkpoint_dir);
  }
  // fp16_autocast: dynamic loss scaling (torch.amp.GradScaler's defaults), carried by checkpoints.
  std::optional<DynamicLossScaler> scaler;
  if (options.precision == Precision::FP16Autocast) {
    LossScalerConfig scaling;
    scaling.init_scale = static_cast<float>(c.loss_scale_init);
    scaling.growth_interval = c.loss_scale_growth_interval;
    scaler.emplace(scaling);
    if (!position.loss_scaler.is_null()) run_on_all_ranks(world, [&] { scaler->load_state_json(position.loss_scaler); });
  }

  // A continued run appends to the metrics of the run it continues, whose records of the steps
  // after `position.step` are marked superseded first: they are redone now.
  const bool continuing = !c.resume.empty();
  const std::filesystem::path metrics_path = std::filesystem::path(c.output_dir) / "metrics.jsonl";
  bool continues_metrics = false;
  run_on_all_ranks(world, [&] {
    if (!world.is_root() || !continuing) return;
    std::error_code ec;
    continues_metrics = std::filesystem::file_size(metrics_path, ec) > 0 && !ec;
    if (const int64_t n = supersede_records_after(metrics_path, position.step))
      log::info("{}: {} record(s) of the steps after step {} marked superseded (the run redoes them)",
                metrics_path.string(), n, position.step);
  });
  MetricsLog metrics = world.is_root() ? MetricsLog(metrics_path, continuing) : MetricsLog();
  nlohmann::json header = run_header(resolved, plan, world, gpu, total_steps);
  header["sharding_strategy"] = sharding_strategy_name(groups.strategy);
  header["shard_bytes"] = {{"frozen", held.frozen}, {"trainable", held.trainable},
                           {"model_frozen", held.model_frozen}, {"model_trainable", held.model_trainable}};
  header["peak_host_memory_after_load_bytes"] = peak_host;
  header["private_host_memory_after_load_bytes"] = private_host;
  header["load_read_bytes_per_rank"] = read_per_rank;  // of the model files (none for a preset)
  if (resume_from || continues_metrics)
    header["resumed_from"] = {{"checkpoint", resume_from ? nlohmann::json(resume_from->string()) : nlohmann::json(nullptr)},
                              {"step", position.step}};
  metrics.write(header);
  metrics.write(memory_record("after_load", position.step, device));
  Progress progress = world.is_root() ? Progress(c.log_to, c.output_dir) : Progress();
  // Shared with the engine's sink: the CPU-offload worker may still write spans of the last
  // step's queued updates after this function's loop, until the engine is gone.
  auto trace_owner = std::make_shared<TraceWriter>();
  TraceWriter& trace = *trace_owner;
  if (c.profile) {
    std::filesystem::create_directories(c.output_dir);
    trace = TraceWriter(std::filesystem::path(c.output_dir) / fmt::format("trace.rank{}.json", world.rank), world.rank);
    engine.set_event_sink([trace_owner](const char* what, const std::string& unit, TraceWriter::Clock::time_point begin,
                                   TraceWriter::Clock::time_point end) {
      // The CPU-offload worker's own spans get a lane of their own (they come from its thread).
      const bool worker = std::string_view(what).starts_with("host ");
      trace_owner->span(fmt::format("{} ({})", what, unit), worker ? "host worker" : "comm", begin, end);
    });
  }
  // profile_memory: a memory record around every micro-batch's pass and optimizer step, not only
  // at fsdp_qlora's checkpoints (the records come from rank 0, as the metrics do).
  auto memory_point = [&](const char* at, int64_t at_step) {
    if (c.profile_memory) metrics.write(memory_record(at, at_step, device));
  };
  bool first_pass = position.step == 0;  // fsdp_qlora's "after first forward" reading
  engine.set_forward_done_callback([&] {
    if (first_pass) metrics.write(memory_record("after_first_forward", 0, device));
    first_pass = false;
    memory_point("after_forward", position.step);
  });
  const int32_t pad_id = plan.tokenizer->pad_id();
  data::DistributedSampler sampler(static_cast<int64_t>(plan.dataset.train.size()), world.size, world.rank,
                                   static_cast<uint64_t>(c.seed));
  preemption_checkpoints_from_now();  // before: a notice exits at once (nothing to checkpoint)
  Communicator& all = *groups.world;

  TrainingOutcome outcome;
  outcome.first_loss = position.first_loss;
  outcome.last_loss = position.last_loss;
  int64_t& step = position.step;  // optimizer steps done
  const int64_t first_step = step;  // where this process began (after a resume, not 0)
  doing.reset();
  doing.emplace("training (activations, gradients and the optimizer's updates)");
  for (; position.epoch < c.num_epochs && step < total_steps; ++position.epoch, position.samples_in_epoch = 0) {
    const int64_t epoch = position.epoch;
    EpochBatches batches(plan.dataset.train, sampler, epoch, c.batch_size, pad_id, c.context_length,
                         c.pad_to_context_length, position.samples_in_epoch / world.size);
    // Micro-batches past the last whole accumulation step of the epoch would never be stepped.
    const int64_t usable = batches.size() / gas * gas;
    // Per step, summed over ranks: loss × batch size, samples, tokens, target tokens, and the
    // samples of the micro-batches that had target tokens (the loss is their mean: a micro-batch
    // whose answers were all truncated away has no loss, not a loss of 0).
    double sums[5] = {0, 0, 0, 0, 0};
    auto step_start = Clock::now();
    double forward_backward_seconds = 0;
    for (int64_t i = 0; i < usable && step < total_steps; ++i) {
      data::Batch batch = batches.batch(i);
      const bool last_of_step = (i + 1) % gas == 0;
      engine.set_sync_gradients(!c.no_sync || last_of_step);
      // fsdp_qlora: loss = output.loss / gradient_accumulation_steps, output.loss the micro-batch mean.
      const double normalizer = static_cast<double>(std::max<int64_t>(batch.target_tokens, 1)) * static_cast<double>(gas);
      const float loss_scale = scaler ? scaler->scale() : 1.0f;
      // With offload, the last micro-batch's backward steps each unit on the CPU as its gradients
      // arrive, unless clipping or loss scaling needs all of them first.
      if (last_of_step && engine.can_step_during_backward()) {
        if (!scaler && !c.apply_gradient_clipping)
          engine.step_during_backward(schedule.lr_at(step));
        else  // each unit unscaled and measured as it completes; the updates follow in the next pass
          engine.measure_during_backward(scaler ? &*scaler : nullptr);
      }
      memory_point("before_forward_backward", step);
      const auto fb_start = Clock::now();
      LossSum l = model.forward_backward(batch, normalizer, loss_scale, static_cast<uint64_t>(step * gas + i % gas));
      if (device == Device::CUDA) cuda_synchronize();  // the phase's time is the GPU's, not the queueing's
      forward_backward_seconds += seconds_since(fb_start);
      trace.span("forward_backward", "compute", fb_start, Clock::now(), {{"step", step + 1}, {"micro_batch", i % gas}});
      memory_point("after_forward_backward", step);
      if (step == 0 && i == 0)
        metrics.write(memory_record("after_first_forward_backward", step, device));
      if (l.tokens > 0) {
        sums[0] += l.mean() * static_cast<double>(batch.batch_size);
        sums[4] += static_cast<double>(batch.batch_size);
      }
      sums[1] += static_cast<double>(batch.batch_size);
      sums[2] += static_cast<double>(batch.batch_size * batch.seq_len);
      sums[3] += static_cast<double>(l.tokens);
      if (!last_of_step) continue;

      // Optimizer step: global grad norm (always measured; clipping when enabled), update, schedule.
      const auto optimizer_start = Clock::now();
      all.all_reduce(sums, 5, CommType::F64, ReduceOp::Sum).wait();
      const double loss = sums[4] > 0 ? sums[0] / sums[4] : std::nan("");  // NaN: no target token (null in JSON)
      // fp16: unscale, and skip the step when any gradient overflowed (the scale backs off).
      bool skipped = false;
      if (scaler) skipped = !scaler->update(engine.unscale_grads(*scaler));
      const double grad_norm = skipped ? std::nan("") : engine.grad_norm();
      if (!skipped && !std::isfinite(grad_norm)) {
        const std::string where = engine.first_non_finite_gradient();
        fail("step {}: the gradient norm is {} (loss {}): training diverged; the first NaN or infinite gradient is in "
             "{}; lower lr or check the data", step + 1, grad_norm, loss, where);
      }
      if (!skipped && c.apply_gradient_clipping) {
        const double coefficient = clip_coefficient(grad_norm, c.grad_norm);
        if (coefficient < 1.0) engine.scale_grads(coefficient);
      }
      // The schedule advances over skipped steps too, as fsdp_qlora's lr_scheduler.step() does.
      const double lr = schedule.lr_at(step);
      if (skipped)
        engine.skip_step();
      else
        engine.optimizer_step(lr);
      if (device == Device::CUDA) cuda_synchronize();
      const double optimizer_seconds = seconds_since(optimizer_start);
      trace.span(skipped ? "skipped step (fp16 overflow)" : "optimizer", "compute", optimizer_start, Clock::now(),
                 {{"step", step + 1}});
      trace.span(fmt::format("step {}", step + 1), "step", step_start, Clock::now(), {{"loss", loss}});
      memory_point("after_optimizer", step + 1);
      ++step;
      position.samples_in_epoch += static_cast<int64_t>(c.batch_size * gas) * world.size;
      if (step == 1) metrics.write(memory_record("after_first_step", step, device));
      if (step == first_step + 1 && section_times_enabled()) reset_section_times();  // the first step warms up

      const double seconds = seconds_since(step_start);
      if (step == 1) outcome.first_loss = position.first_loss = loss;
      outcome.last_loss = position.last_loss = loss;
      StepReport report{step, total_steps, epoch, loss, lr, grad_norm, sums[2] / seconds};
      report.skipped = skipped;
      nlohmann::json record = {{"type", "step"},
                               {"step", step},
                               {"epoch", epoch},
                               {"loss", loss},
                               {"lr", lr},
                               {"grad_norm", skipped ? nlohmann::json(nullptr) : nlohmann::json(grad_norm)},
                               {"tokens", static_cast<int64_t>(sums[2])},
                               {"target_tokens", static_cast<int64_t>(sums[3])},
                               {"samples", sums[1]},
                               {"step_seconds", seconds},
                               {"tokens_per_second", sums[2] / seconds}};
      const CommTimes comm = engine.take_times();  // this rank's (rank 0 writes the metrics)
      record["gather_wait_seconds"] = comm.gather_wait;
      record["reduce_seconds"] = comm.reduce;
      // Where the step went (seconds, this rank): forward_backward includes the gathers' waits and
      // the reductions it triggered (also given on their own); optimizer is the all-reduce of the
      // loss, unscaling, the norm, clipping and the update; offload_copies the host⇄device copies
      // of gradients and compute copies when the optimizer state lives on the host.
      record["phase_seconds"] = {{"forward_backward", forward_backward_seconds},
                                 {"gather_wait", comm.gather_wait},
                                 {"reduce", comm.reduce},
                                 {"optimizer", optimizer_seconds},
                                 {"offload_copies", comm.offload_copies},
                                 {"host_optimizer_overlapped", comm.host_worker}};
      if (scaler) {
        record["loss_scale"] = loss_scale;  // the scale this step's backward used
        record["skipped"] = skipped;
      }
      if (c.eval_every_steps > 0 && step % c.eval_every_steps == 0 && !plan.dataset.eval.empty()) {
        double eval_loss = evaluate_loss(model, plan.dataset.eval, c.batch_size, pad_id, c.context_length, &all);
        record["eval_loss"] = eval_loss;
        record["eval_perplexity"] = std::exp(eval_loss);
        report.eval_loss = eval_loss;
        engine.take_times();  // evaluation's gathers are not the next step's
      }
      metrics.write(record);
      progress.step(report);
      maybe_inject_fault(world, fmt::format("after_step_{}", step));

      // Checkpoints: on schedule, and when any rank was told to stop (then exit to be requeued).
      const int signal = static_cast<int>(all.all_reduce_max(static_cast<double>(preemption_signal())));
      const bool scheduled = c.save_every_steps > 0 && step % c.save_every_steps == 0;
      if (scheduled || signal != 0) {
        // The position after this step: the next epoch's start when the epoch has no whole step left.
        TrainingPosition at = position;
        if (scaler) at.loss_scaler = scaler->state_json();
        if (i + 1 + gas > usable) {
          ++at.epoch;
          at.samples_in_epoch = 0;
        }
        save_training_checkpoint(world, engine, at, resolved, plan, fingerprint);
      }
      if (signal != 0) {
        progress.finish();
        log::info("{} received: checkpoint of step {} written; exiting with code {} so the job can be requeued",
                  signal_name(signal), step, kExitCheckpointed);
        metrics.write({{"type", "preempted"}, {"step", step}, {"signal", signal_name(signal)}});
        outcome.steps = step;
        outcome.preempted = true;
        outcome.seconds = seconds_since(start);
        return outcome;
      }
      std::fill(std::begin(sums), std::end(sums), 0.0);
      forward_backward_seconds = 0;
      step_start = Clock::now();
    }
  }
  progress.finish();
  outcome.steps = step;
  if (step == first_step)
    log::info("nothing left to train: the run is at step {} and ends at step {}{}", step, total_steps,
              c.max_steps > 0 ? fmt::format(" (max_steps = {})", c.max_steps) : "");

  if (!plan.dataset.eval.empty()) {
    outcome.eval_loss = evaluate_loss(model, plan.dataset.eval, c.batch_size, pad_id, c.context_length, &all);
    metrics.write({{"type", "eval"}, {"step", step}, {"eval_loss", *outcome.eval_loss},
                   {"eval_perplexity", std::exp(*outcome.eval_loss)}});
    log::info("{}", describe_eval(*outcome.eval_loss, plan.dataset.eval));
  }
  if (c.save_model) {
    const HostMemoryPurpose purpose("saving the model");
    engine.gather_masters_into_model();
    model.place_on(Device::CPU);  // the savers read host tensors; training is over
    if (world.is_root()) {
      std::string where = save_trained_model(model, resolved, plan);
      log::info("saved {}", where);
    }
    MPI_Barrier(world.comm);
  }
  outcome.seconds = seconds_since(start);
  const double peak = all.all_reduce_max(static_cast<double>(host_memory().peak_resident));
  nlohmann::json summary = {{"type", "summary"},
                            {"steps", step},
                            {"first_loss", outcome.first_loss},
                            {"last_loss", outcome.last_loss},
                            {"seconds", outcome.seconds},
                            {"world_size", world.size},
                            {"peak_host_memory_bytes", peak}};
  if (device == Device::CUDA) {
    // The largest rank's, as fsdp_qlora reports torch.cuda.max_memory_allocated / reserved.
    const MemoryStats gpu_memory = cuda_memory_stats();
    summary["peak_device_allocated_bytes"] = all.all_reduce_max(static_cast<double>(gpu_memory.peak_allocated));
    summary["peak_device_reserved_bytes"] = all.all_reduce_max(static_cast<double>(gpu_memory.peak_reserved));
    log::info("GPU memory (this rank): {}", format_memory_stats(gpu_memory));
  }
  if (section_times_enabled()) {
    // FSDPQ_SECTION_TIMES=1: the compute stream's time by section over this process's steps
    // after its first (this rank).
    const std::vector<SectionTotal> sections = section_totals();
    double timed = 0;
    for (const SectionTotal& t : sections) timed += t.seconds;
    const int64_t steps_timed = std::max<int64_t>(1, step - first_step - 1);
    nlohmann::json by_name = nlohmann::json::object();
    for (const SectionTotal& t : sections) {
      by_name[t.name] = t.seconds;
      log::info("section {:<26} {:9.2f} ms/step {:5.1f}%  ({} spans)", t.name, 1e3 * t.seconds / steps_timed,
                timed > 0 ? 100 * t.seconds / timed : 0.0, t.count);
    }
    summary["section_seconds"] = by_name;
  }
  metrics.write(memory_record("end", step, device));
  metrics.write(summary);
  auto loss_text = [](double loss) { return std::isfinite(loss) ? fmt::format("{:.4f}", loss) : std::string("?"); };
  log::info("trained {} steps in {}: loss {} → {}; metrics in {}", step, format_duration(outcome.seconds),
            loss_text(outcome.first_loss), loss_text(outcome.last_loss), metrics.path().string());
  return outcome;
}

}  // namespace fsdpq
