#include "train/trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <omp.h>
#include <thread>

#include "backend/cuda_backend.h"
#include "backend/section_times.h"
#include "fsdp/device_collectives.h"
#include "fsdp/fsdp.h"
#include "fsdp/process_groups.h"
#include "fsdp/shard_loader.h"
#include "io/model_files.h"
#include "optim/clip.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "model/unit_build.h"
#include "quant/hqq_solve.h"
#include "runtime/agreed_errors.h"
#include "runtime/exit_codes.h"
#include "runtime/fault_injection.h"
#include "runtime/host_memory.h"
#include "runtime/host_out_of_memory.h"
#include "runtime/log.h"
#include "runtime/preemption.h"
#include "runtime/watchdog.h"
#include "train/epoch_batches.h"
#include "train/metrics_log.h"
#include "train/progress.h"
#include "train/run_records.h"
#include "train/run_directory.h"
#include "train/save_model.h"
#include "train/trace_writer.h"
#include "train/train_checkpoint.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

// A micro-batch's share of the step's loss, rounded to a multiple of 2^-32 so that adding shares is
// exact while the sum stays below 2^21: the step's loss then has the same bits whichever order the
// micro-batches and ranks add up in — at any world size, and after resuming onto another one.
double exactly_summable(double share) { return std::ldexp(std::nearbyint(std::ldexp(share, 32)), -32); }

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

ModelOptions model_options_from(const TrainConfig& c) {
  ModelOptions o;
  o.quantize_base = c.quantized_base();
  o.hqq_bits = c.hqq_base() ? static_cast<int>(c.n_bits) : 0;
  o.train_base = c.full_finetune();
  o.llama_pro_new_blocks = c.llama_pro() ? c.llama_pro_num_new_blocks : 0;
  o.lora_rank = c.lora_rank;
  o.lora_alpha = c.lora_alpha;
  o.lora_dropout = c.lora_dropout;
  if (c.is_lora()) o.lora_targets = c.lora_target_modules;
  o.use_dora = c.dora();
  o.precision = c.choice.precision;
  o.gradient_checkpointing = c.use_gradient_checkpointing;
  o.checkpoint_every = c.checkpoint_every;
  o.keep_activation_layers = c.keep_activation_layers;
  o.recompute_elementwise = c.recompute_elementwise;
  o.keep_dequantized_layers = c.keep_dequantized_layers;
  o.activation_offload = c.use_activation_cpu_offload;
  o.seed = static_cast<uint64_t>(c.seed);
  return o;
}

namespace {

template <class Receiver>
LlamaModel build_model_with(const RunPlan& plan, const ModelOptions& options, const Receiver& receiver,
                            uint64_t* bytes_read) {
  if (bytes_read) *bytes_read = 0;
  if (plan.model.is_preset()) return LlamaModel::random(plan.model.config, kPresetInitSeed, options, receiver);
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

namespace {

// A step's sums over its micro-batches, then over the ranks (one all-reduce of the array).
enum StepSum : int {
  kLossSum,        // each micro-batch's mean loss × its batch size, over those with target tokens
  kSamples,        // every micro-batch's batch size (rows, when packed)
  kExamples,       // the examples in them (batch size unpacked; more per row when packed)
  kTokens,         // batch size × sequence length (padding included, as fsdp_qlora counts)
  kRealTokens,     // the examples' own tokens (padding is not work)
  kTargetTokens,   // the tokens the loss counted
  kScoredSamples,  // the batch sizes of the micro-batches with target tokens: the loss's weight
  kStepSums
};

// What one optimizer step did.
struct StepResult {
  double loss = 0;  // NaN when no micro-batch had a target token (null in JSON)
  double lr = 0;
  double grad_norm = 0;  // NaN on a skipped fp16 step
  bool skipped = false;
  double optimizer_seconds = 0;
};

// The training loop of one process: set-up in the constructor, then run(). Each method is one
// stage a reader can hold: loading, resuming, the outputs, a micro-batch, an optimizer step, its
// record, checkpoint or preemption, and the end of the run.
class Trainer {
 public:
  Trainer(const World& world, const ResolvedConfig& resolved, RunPlan& plan, const GpuInfo& gpu)
      : world_(world),
        resolved_(resolved),
        c_(resolved.config),
        plan_(plan),
        gpu_(gpu),
        device_(gpu.has_gpu() ? Device::CUDA : Device::CPU),  // CUDA_VISIBLE_DEVICES= keeps the CPU backend
        options_(model_options_from(c_)),
        groups_(make_groups()),
        fsdp_(groups_, fsdp_options(), static_cast<int>(plan.trained_model.num_hidden_layers) + 1),
        gas_(c_.gradient_accumulation_steps),
        total_steps_(plan.batches.total_steps),
        schedule_(c_.choice.lr_scheduler, c_.lr,
                  plan.batches.schedule_steps, c_.min_lr_fraction),
        sampler_(static_cast<int64_t>(plan.dataset.train.size()), world.size, world.rank,
                 static_cast<uint64_t>(c_.seed)) {
    doing_.emplace("loading the model (this rank's weights, fp32 masters and optimizer state)");
    load_model();
    maybe_inject_fault(world_, "after_load");
    if (total_steps_ == 0)
      fail("the run has no optimizer step: {} micro-batches per epoch and gradient_accumulation_steps = {}",
           plan_.batches.micro_batches_per_epoch, gas_);
    // What the checkpoints record of the base, and what a resumed one must match.
    fingerprint_ = run_base_fingerprint(world_, plan_);
    resume();
    open_outputs();
  }

  TrainingOutcome run() {
    preemption_checkpoints_from_now();  // before: a notice exits at once (nothing to checkpoint)
    outcome_.first_loss = position_.first_loss;
    outcome_.last_loss = position_.last_loss;
    first_step_ = position_.step;
    doing_.reset();
    doing_.emplace("training (activations, gradients and the optimizer's updates)");
    for (; position_.epoch < c_.num_epochs && position_.step < total_steps_;
         ++position_.epoch, position_.samples_in_epoch = 0)
      if (!train_epoch()) return outcome_;  // preempted: checkpointed, to be requeued
    progress_.finish();
    outcome_.steps = position_.step;
    if (position_.step == first_step_)
      log::info("nothing left to train: the run is at step {} and ends at step {}{}", position_.step, total_steps_,
                c_.max_steps > 0 ? fmt::format(" (max_steps = {})", c_.max_steps) : "");
    finish();
    return outcome_;
  }

 private:
  // ---- Set-up ----------------------------------------------------------------------------------

  ProcessGroups make_groups() {
    ProcessGroups groups = make_process_groups(world_, c_.choice.sharding, c_.hybrid() ? c_.ranks_per_node : 0);
    if (device_ == Device::CUDA) {
      run_on_all_ranks(world_, [&] { cuda_init(gpu_.device); });
      // The gathers and gradient reductions over GPU memory: NCCL, or MPI staged through the host.
      const DeviceTransport transport = add_device_collectives(groups, world_, gpu_);
      if (world_.size > 1) log::info("collectives over GPU memory: {}", device_transport_name(transport));
    }
    return groups;
  }

  FsdpOptions fsdp_options() const {
    // use_cpu_offload keeps the shards' masters, gradients and optimizer state in host memory and
    // steps them on the CPU; otherwise they live (and are stepped) where the model computes.
    return {.compute_dtype = activation_dtype(options_.precision),
            .device = device_,
            .state_device = c_.use_cpu_offload ? Device::CPU : device_,
            .optimizer = optimizer_config(c_.choice.optimizer, c_.lr, c_.wd),
            .offload_frozen = c_.use_cpu_offload,
            .overlap_host_optimizer = c_.use_cpu_offload};
  }

  // Builds the sharded model (each rank keeps its shards as the units are built) and reports what
  // the ranks hold and read.
  void load_model() {
    const auto load_start = Clock::now();
    watchdog_phase("loading the model");
    uint64_t read_bytes = 0;
    run_on_all_ranks(world_, [&] {
      // One rank keeps whole units; a rank of a larger shard group reads and builds only its shards.
      if (fsdp_.parameters().resident())
        model_.emplace(build_model(
            plan_, options_, [&](int unit, ParamUnit& contents) { fsdp_.adopt_whole_unit(unit, contents); },
            &read_bytes));
      else
        model_.emplace(build_model(plan_, options_, shard_loader(world_, fsdp_), &read_bytes));
    });
    fsdp_.attach(*model_);
    if (device_ == Device::CUDA) {
      run_on_all_ranks(world_, [&] { model_->place_on(device_); });
      log::info("GPU {} ({}): {}", gpu_.device, gpu_.name, format_memory_stats(cuda_memory_stats()));
    }
    held_ = fsdp_.parameters().shard_bytes();
    const HostMemory memory = host_memory();
    peak_host_after_load_ = groups_.world->all_reduce_max(static_cast<double>(memory.peak_resident));
    private_host_after_load_ = groups_.world->all_reduce_max(static_cast<double>(memory.private_now));
    read_per_rank_.assign(static_cast<size_t>(world_.size), 0);
    read_per_rank_[static_cast<size_t>(world_.rank)] = static_cast<int64_t>(read_bytes);
    groups_.world->all_reduce(read_per_rank_.data(), read_per_rank_.size(), CommType::I64, ReduceOp::Sum).wait();
    log::info("model ready in {:.1f} s ({} on {} rank{}): this rank holds {} of {} frozen and {} of {} trainable; host "
              "memory per rank (largest): {} private now, peak resident {} (incl. mapped model files); read {} of the "
              "model files on this rank",
              seconds_since(load_start), sharding_strategy_name(groups_.strategy), world_.size,
              world_.size == 1 ? "" : "s", human_bytes(static_cast<double>(held_.frozen)),
              human_bytes(static_cast<double>(held_.model_frozen)), human_bytes(static_cast<double>(held_.trainable)),
              human_bytes(static_cast<double>(held_.model_trainable)), human_bytes(private_host_after_load_),
              human_bytes(peak_host_after_load_), human_bytes(static_cast<double>(read_bytes)));
    const UnitBuildTimes build = unit_build_times();
    log::info("frozen weights (this rank): values read in {:.1f} s, encoded in {:.1f} s", build.read_seconds,
              build.encode_seconds);
    if (const HqqSolverWork hqq = hqq_solver_work(); hqq.groups > 0)
      log::info("hqq: the solver quantised {} groups of {} values in {:.1f} s on {}", hqq.groups, kHqqGroupSize,
                hqq.seconds, hqq.gpu_groups == hqq.groups ? "the GPU" : hqq.gpu_groups == 0 ? "the CPU" : "the GPU and the CPU");
  }

  // The position to continue from (a checkpoint's, or step 0) and fp16's loss scaler.
  void resume() {
    run_on_all_ranks(world_, [&] { resume_from_ = checkpoint_to_resume(c_); });
    if (resume_from_) {
      watchdog_phase("reading the checkpoint to resume");
      // Its errors are the same on every rank (the reader agrees them): report them once.
      run_on_all_ranks(world_, [&] {
        position_ = load_training_checkpoint(world_, *resume_from_, fsdp_, resolved_, plan_, fingerprint_);
      });
    } else if (c_.resume == "auto") {
      log::info("resume = auto: no checkpoint in {} yet, starting from step 0", c_.checkpoint_dir);
    }
    // fp16_autocast: dynamic loss scaling (torch.amp.GradScaler's defaults), carried by checkpoints.
    if (options_.precision == Precision::FP16Autocast) {
      LossScalerConfig scaling;
      scaling.init_scale = static_cast<float>(c_.loss_scale_init);
      scaling.growth_interval = c_.loss_scale_growth_interval;
      scaler_.emplace(scaling);
      if (!position_.loss_scaler.is_null())
        run_on_all_ranks(world_, [&] { scaler_->load_state_json(position_.loss_scaler); });
    }
  }

  // The metrics (a continued run's rewound and appended to), the progress line and the trace.
  void open_outputs() {
    const bool continuing = !c_.resume.empty();
    const std::filesystem::path metrics_path = std::filesystem::path(c_.output_dir) / "metrics.jsonl";
    bool continues_metrics = false;
    // The records of the steps after the position are marked superseded first: they are redone now.
    run_on_all_ranks(world_, [&] {
      if (!world_.is_root() || !continuing) return;
      std::error_code ec;
      continues_metrics = std::filesystem::file_size(metrics_path, ec) > 0 && !ec;
      if (const int64_t n = supersede_records_after(metrics_path, position_.step))
        log::info("{}: {} record(s) of the steps after step {} marked superseded (the run redoes them)",
                  metrics_path.string(), n, position_.step);
    });
    if (world_.is_root()) metrics_ = MetricsLog(metrics_path, continuing);
    nlohmann::json header = run_header(resolved_, plan_, world_, gpu_, total_steps_);
    header["sharding_strategy"] = sharding_strategy_name(groups_.strategy);
    header["shard_bytes"] = {{"frozen", held_.frozen}, {"trainable", held_.trainable},
                             {"model_frozen", held_.model_frozen}, {"model_trainable", held_.model_trainable}};
    header["peak_host_memory_after_load_bytes"] = peak_host_after_load_;
    header["private_host_memory_after_load_bytes"] = private_host_after_load_;
    header["load_read_bytes_per_rank"] = read_per_rank_;  // of the model files (none for a preset)
    if (resume_from_ || continues_metrics)
      header["resumed_from"] = {
          {"checkpoint", resume_from_ ? nlohmann::json(resume_from_->string()) : nlohmann::json(nullptr)},
          {"step", position_.step}};
    metrics_.write(header);
    metrics_.write(memory_record("after_load", position_.step, device_));
    if (world_.is_root()) progress_ = Progress(c_.log_to, c_.output_dir);
    if (c_.profile) {
      std::filesystem::create_directories(c_.output_dir);
      *trace_ = TraceWriter(std::filesystem::path(c_.output_dir) / fmt::format("trace.rank{}.json", world_.rank),
                            world_.rank);
      // Shared with FSDP's sink: the CPU-offload worker may still write spans of the last
      // step's queued updates after the loop, until FSDP is gone.
      fsdp_.set_event_sink([trace = trace_](const char* what, const std::string& unit,
                                              TraceWriter::Clock::time_point begin, TraceWriter::Clock::time_point end) {
        // The CPU-offload worker's own spans get a lane of their own (they come from its thread).
        const bool worker = std::string_view(what).starts_with("host ");
        trace->span(fmt::format("{} ({})", what, unit), worker ? "host worker" : "comm", begin, end);
      });
    }
    first_pass_ = position_.step == 0;  // fsdp_qlora's "after first forward" reading
    fsdp_.set_forward_done_callback([this] {
      if (first_pass_) metrics_.write(memory_record("after_first_forward", 0, device_));
      first_pass_ = false;
      memory_point("after_forward", position_.step);
    });
  }

  // profile_memory: a memory record around every micro-batch's pass and optimizer step, not only
  // at fsdp_qlora's checkpoints (the records come from rank 0, as the metrics do).
  void memory_point(const char* at, int64_t at_step) {
    if (c_.profile_memory) metrics_.write(memory_record(at, at_step, device_));
  }

  // ---- The loop --------------------------------------------------------------------------------

  // The epoch's micro-batches from the position on; false when a preemption stopped the run.
  bool train_epoch() {
    const BatchShape shape{.batch_size = c_.batch_size,
                           .pad_id = plan_.tokenizer->pad_id(),
                           .context_length = c_.context_length,
                           .pad_to_context_length = c_.pad_to_context_length,
                           .packing = c_.packing,
                           .padding_free = c_.padding_free};
    EpochBatches batches(plan_.dataset.train, sampler_, position_.epoch, shape, position_.samples_in_epoch);
    // Micro-batches past the last whole accumulation step of the epoch would never be stepped.
    const int64_t usable = batches.size() / gas_ * gas_;
    double sums[kStepSums] = {};
    double forward_backward_seconds = 0;
    auto step_start = Clock::now();
    for (int64_t i = 0; i < usable && position_.step < total_steps_; ++i) {
      forward_backward_seconds += micro_batch(batches.batch(i), i, sums);
      if ((i + 1) % gas_ != 0) continue;
      const StepResult result = optimizer_step(sums);
      record_step(result, sums, forward_backward_seconds, step_start);
      if (checkpoint_or_stop(/*epoch_ends=*/i + 1 + gas_ > usable)) return false;
      std::fill(std::begin(sums), std::end(sums), 0.0);
      forward_backward_seconds = 0;
      step_start = Clock::now();
    }
    return true;
  }

  // The forward and backward of micro-batch `i` of the epoch; adds to the step's sums and returns
  // its seconds.
  double micro_batch(const data::Batch& batch, int64_t i, double sums[]) {
    const int64_t step = position_.step;
    watchdog_phase("training", step + 1);
    const bool last_of_step = (i + 1) % gas_ == 0;
    fsdp_.set_sync_gradients(!c_.no_sync || last_of_step);
    // fsdp_qlora: loss = output.loss / gradient_accumulation_steps, output.loss the micro-batch mean.
    const double normalizer = static_cast<double>(std::max<int64_t>(batch.target_tokens, 1)) * static_cast<double>(gas_);
    loss_scale_ = scaler_ ? scaler_->scale() : 1.0f;
    // With offload, the last micro-batch's backward may update (or measure) each unit as its
    // gradients arrive: FSDP's host-offload scheduler decides.
    if (last_of_step) fsdp_.before_last_micro_batch(step_request(step));
    memory_point("before_forward_backward", step);
    const auto start = Clock::now();
    const LossSum l = model_->forward_backward(batch, normalizer, loss_scale_, static_cast<uint64_t>(step * gas_ + i % gas_));
    if (device_ == Device::CUDA) cuda_synchronize();  // the phase's time is the GPU's, not the queueing's
    const double seconds = seconds_since(start);
    trace_->span("forward_backward", "compute", start, Clock::now(), {{"step", step + 1}, {"micro_batch", i % gas_}});
    memory_point("after_forward_backward", step);
    if (step == 0 && i == 0) metrics_.write(memory_record("after_first_forward_backward", step, device_));
    // The micro-batch's rows, or with padding_free the examples its one row holds (the rows they
    // would fill unpacked): the weight of its mean loss in the step's.
    const double samples = static_cast<double>(c_.padding_free ? batch.examples : batch.batch_size);
    if (l.tokens > 0) {
      sums[kLossSum] += exactly_summable(l.mean() * samples);
      sums[kScoredSamples] += samples;
    }
    sums[kSamples] += samples;
    sums[kExamples] += static_cast<double>(batch.examples);
    sums[kTokens] += static_cast<double>(batch.batch_size * batch.seq_len);
    sums[kRealTokens] += static_cast<double>(batch.real_tokens);
    sums[kTargetTokens] += static_cast<double>(l.tokens);
    return seconds;
  }

  // The global gradient norm (always measured; clipping when enabled), fp16's unscale-or-skip, the
  // update and the schedule. Sums the step's numbers over the ranks.
  StepResult optimizer_step(double sums[]) {
    const int64_t step = position_.step;
    StepResult r;
    const auto start = Clock::now();
    groups_.world->all_reduce(sums, kStepSums, CommType::F64, ReduceOp::Sum).wait();
    r.loss = sums[kScoredSamples] > 0 ? sums[kLossSum] / sums[kScoredSamples] : std::nan("");
    // The schedule advances over skipped steps too, as fsdp_qlora's lr_scheduler.step() does.
    const StepRequest request = step_request(step);
    r.lr = request.lr;
    const StepOutcome outcome = fsdp_.step(request);
    r.skipped = outcome.skipped;
    r.grad_norm = outcome.grad_norm;
    if (!outcome.diverged_at.empty())
      fail("step {}: the gradient norm is {} (loss {}): training diverged; the first NaN or infinite gradient is in "
           "{}; lower lr or check the data", step + 1, r.grad_norm, r.loss, outcome.diverged_at);
    if (device_ == Device::CUDA) cuda_synchronize();
    r.optimizer_seconds = seconds_since(start);
    trace_->span(r.skipped ? "skipped step (fp16 overflow)" : "optimizer", "compute", start, Clock::now(),
                 {{"step", step + 1}});
    return r;
  }

  // Advances the position past the step and writes its metrics record and progress line (and, on
  // schedule, its evaluation).
  void record_step(const StepResult& r, const double sums[], double forward_backward_seconds,
                   Clock::time_point step_start) {
    trace_->span(fmt::format("step {}", position_.step + 1), "step", step_start, Clock::now(), {{"loss", r.loss}});
    memory_point("after_optimizer", position_.step + 1);
    const int64_t step = ++position_.step;
    // Examples, or rows with packing: what EpochBatches skips when a run resumes mid-epoch.
    position_.samples_in_epoch += static_cast<int64_t>(c_.batch_size * gas_) * world_.size;
    if (step == 1) metrics_.write(memory_record("after_first_step", step, device_));
    if (step == first_step_ + 1 && section_times_enabled()) reset_section_times();  // the first step warms up
    const double seconds = seconds_since(step_start);
    if (step == 1) outcome_.first_loss = position_.first_loss = r.loss;
    outcome_.last_loss = position_.last_loss = r.loss;

    StepReport report{step, total_steps_, position_.epoch, r.loss, r.lr, r.grad_norm, sums[kTokens] / seconds};
    report.skipped = r.skipped;
    nlohmann::json record = {{"type", "step"},
                             {"step", step},
                             {"epoch", position_.epoch},
                             {"loss", r.loss},
                             {"lr", r.lr},
                             {"grad_norm", r.skipped ? nlohmann::json(nullptr) : nlohmann::json(r.grad_norm)},
                             {"tokens", static_cast<int64_t>(sums[kTokens])},
                             {"target_tokens", static_cast<int64_t>(sums[kTargetTokens])},
                             {"samples", sums[kSamples]},
                             {"examples", static_cast<int64_t>(sums[kExamples])},
                             {"real_tokens", static_cast<int64_t>(sums[kRealTokens])},
                             {"padded_slots", static_cast<int64_t>(sums[kTokens] - sums[kRealTokens])},
                             {"packing_efficiency", sums[kTokens] > 0 ? sums[kRealTokens] / sums[kTokens] : 0.0},
                             {"step_seconds", seconds},
                             {"tokens_per_second", sums[kTokens] / seconds},
                             {"real_tokens_per_second", sums[kRealTokens] / seconds}};
    totals_.tokens += sums[kTokens];
    totals_.real_tokens += sums[kRealTokens];
    totals_.seconds += seconds;
    const CommTimes comm = fsdp_.take_times();  // this rank's (rank 0 writes the metrics)
    record["gather_wait_seconds"] = comm.gather_wait;
    record["reduce_seconds"] = comm.reduce;
    // Where the step went (seconds, this rank): forward_backward includes the gathers' waits and
    // the reductions it triggered (also given on their own); optimizer is the all-reduce of the
    // loss, unscaling, the norm, clipping and the update; offload_copies the host⇄device copies
    // of gradients and compute copies when the optimizer state lives on the host.
    record["phase_seconds"] = {{"forward_backward", forward_backward_seconds},
                               {"gather_wait", comm.gather_wait},
                               {"reduce", comm.reduce},
                               {"optimizer", r.optimizer_seconds},
                               {"offload_copies", comm.offload_copies},
                               {"host_optimizer_overlapped", comm.host_worker}};
    if (scaler_) {
      record["loss_scale"] = loss_scale_;  // the scale this step's backward used
      record["skipped"] = r.skipped;
    }
    if (c_.eval_every_steps > 0 && step % c_.eval_every_steps == 0 && !plan_.dataset.eval.empty()) {
      const double eval_loss = evaluate();
      record["eval_loss"] = eval_loss;
      record["eval_perplexity"] = std::exp(eval_loss);
      report.eval_loss = eval_loss;
      fsdp_.take_times();  // evaluation's gathers are not the next step's
    }
    metrics_.write(record);
    progress_.step(report);
    maybe_inject_fault(world_, fmt::format("after_step_{}", step));
  }

  // A checkpoint on schedule, and when any rank was told to stop; true when the run must stop to
  // be requeued. `epoch_ends`: the epoch has no whole step left after this one.
  bool checkpoint_or_stop(bool epoch_ends) {
    const int64_t step = position_.step;
    const int signal = static_cast<int>(groups_.world->all_reduce_max(static_cast<double>(preemption_signal())));
    const bool scheduled = c_.save_every_steps > 0 && step % c_.save_every_steps == 0;
    if (scheduled || signal != 0) {
      // The position after this step: the next epoch's start when the epoch has no whole step left.
      TrainingPosition at = position_;
      if (scaler_) at.loss_scaler = scaler_->state_json();
      if (epoch_ends) {
        ++at.epoch;
        at.samples_in_epoch = 0;
      }
      watchdog_phase("writing a checkpoint", step);
      save_training_checkpoint(world_, fsdp_, at, resolved_, plan_, fingerprint_);
    }
    if (signal == 0) return false;
    progress_.finish();
    log::info("{} received: checkpoint of step {} written; exiting with code {} so the job can be requeued",
              signal_name(signal), step, kExitCheckpointed);
    metrics_.write({{"type", "preempted"}, {"step", step}, {"signal", signal_name(signal)}});
    outcome_.steps = step;
    outcome_.preempted = true;
    outcome_.seconds = seconds_since(start_);
    return true;
  }

  // What step `step` (0-based) asks of the optimizer.
  StepRequest step_request(int64_t step) {
    StepRequest request;
    request.lr = schedule_.lr_at(step);
    if (c_.apply_gradient_clipping) request.clip_to_norm = c_.grad_norm;
    request.scaler = scaler_ ? &*scaler_ : nullptr;
    return request;
  }

  double evaluate() {
    return evaluate_loss(*model_, plan_.dataset.eval, c_.batch_size, plan_.tokenizer->pad_id(), c_.context_length,
                         groups_.world.get(), c_.padding_free);
  }

  // ---- The end ---------------------------------------------------------------------------------

  // The final evaluation, the saved model and the summary.
  void finish() {
    const int64_t step = position_.step;
    if (!plan_.dataset.eval.empty()) {
      outcome_.eval_loss = evaluate();
      metrics_.write({{"type", "eval"}, {"step", step}, {"eval_loss", *outcome_.eval_loss},
                      {"eval_perplexity", std::exp(*outcome_.eval_loss)}});
      log::info("{}", describe_eval(*outcome_.eval_loss, plan_.dataset.eval));
    }
    if (c_.save_model) save_model();
    outcome_.seconds = seconds_since(start_);
    metrics_.write(memory_record("end", step, device_));
    metrics_.write(summary());
    auto loss_text = [](double loss) { return std::isfinite(loss) ? fmt::format("{:.4f}", loss) : std::string("?"); };
    log::info("trained {} steps in {}: loss {} → {}; metrics in {}", step, format_duration(outcome_.seconds),
              loss_text(outcome_.first_loss), loss_text(outcome_.last_loss), metrics_.path().string());
  }

  void save_model() {
    const HostMemoryPurpose purpose("saving the model");
    watchdog_phase("saving the model", position_.step);
    fsdp_.gather_masters_into_model();
    model_->place_on(Device::CPU);  // the savers read host tensors; training is over
    if (world_.is_root()) log::info("saved {}", save_trained_model(*model_, resolved_, plan_));
    const WaitScope waiting("waiting for rank 0 to save the model");
    MPI_Barrier(world_.comm);
  }

  nlohmann::json summary() {
    Communicator& all = *groups_.world;
    const double peak = all.all_reduce_max(static_cast<double>(host_memory().peak_resident));
    nlohmann::json s = {{"type", "summary"},
                        {"steps", position_.step},
                        {"first_loss", outcome_.first_loss},
                        {"last_loss", outcome_.last_loss},
                        {"seconds", outcome_.seconds},
                        {"world_size", world_.size},
                        {"peak_host_memory_bytes", peak},
                        {"tokens", totals_.tokens},
                        {"real_tokens", totals_.real_tokens},
                        {"tokens_per_second", totals_.seconds > 0 ? totals_.tokens / totals_.seconds : 0.0},
                        {"real_tokens_per_second", totals_.seconds > 0 ? totals_.real_tokens / totals_.seconds : 0.0}};
    if (device_ == Device::CUDA) {
      // The largest rank's, as fsdp_qlora reports torch.cuda.max_memory_allocated / reserved.
      const MemoryStats gpu_memory = cuda_memory_stats();
      s["peak_device_allocated_bytes"] = all.all_reduce_max(static_cast<double>(gpu_memory.peak_allocated));
      s["peak_device_reserved_bytes"] = all.all_reduce_max(static_cast<double>(gpu_memory.peak_reserved));
      log::info("GPU memory (this rank): {}", format_memory_stats(gpu_memory));
    }
    if (section_times_enabled()) s["section_seconds"] = section_summary();
    return s;
  }

  // FSDPQ_SECTION_TIMES=1: the compute stream's time by section over this process's steps after
  // its first (this rank), logged and returned by name.
  nlohmann::json section_summary() const {
    const std::vector<SectionTotal> sections = section_totals();
    double timed = 0;
    for (const SectionTotal& t : sections) timed += t.seconds;
    const int64_t steps_timed = std::max<int64_t>(1, position_.step - first_step_ - 1);
    nlohmann::json by_name = nlohmann::json::object();
    for (const SectionTotal& t : sections) {
      by_name[t.name] = t.seconds;
      log::info("section {:<26} {:9.2f} ms/step {:5.1f}%  ({} spans)", t.name, 1e3 * t.seconds / steps_timed,
                timed > 0 ? 100 * t.seconds / timed : 0.0, t.count);
    }
    return by_name;
  }

  const World& world_;
  const ResolvedConfig& resolved_;
  const TrainConfig& c_;
  RunPlan& plan_;
  const GpuInfo& gpu_;
  const Clock::time_point start_ = Clock::now();
  const Device device_;
  const ModelOptions options_;
  ProcessGroups groups_;
  Fsdp fsdp_;
  const int64_t gas_;
  const int64_t total_steps_;
  LrSchedule schedule_;
  data::DistributedSampler sampler_;
  std::optional<LlamaModel> model_;
  // What loading found, for the header.
  ShardBytes held_;
  double peak_host_after_load_ = 0, private_host_after_load_ = 0;
  std::vector<int64_t> read_per_rank_;
  nlohmann::json fingerprint_;
  std::optional<std::filesystem::path> resume_from_;
  TrainingPosition position_;
  std::optional<DynamicLossScaler> scaler_;
  float loss_scale_ = 1.0f;  // the scale the current step's backward uses
  MetricsLog metrics_;       // rank 0's; the others' write nothing
  Progress progress_;
  std::shared_ptr<TraceWriter> trace_ = std::make_shared<TraceWriter>();
  bool first_pass_ = false;
  int64_t first_step_ = 0;  // where this process began (after a resume, not 0)
  TrainingOutcome outcome_;
  // This process's steps: their tokens (padding included), real tokens and seconds, for the summary.
  struct {
    double tokens = 0, real_tokens = 0, seconds = 0;
  } totals_;
  std::optional<HostMemoryPurpose> doing_;  // what an out-of-memory message says the run was doing
};

}  // namespace

TrainingOutcome train(const World& world, const ResolvedConfig& resolved, RunPlan& plan, const GpuInfo& gpu) {
  Trainer trainer(world, resolved, plan, gpu);
  return trainer.run();
}

}  // namespace fsdpq
