// FSDP over the model's units (docs/sharding.md): each unit's frozen base-weight bytes (NF4 codes
// and statistics, or bf16) and trainable fp32 parameters are flattened, padded and split over the
// shard group. Each rank keeps only its shard: frozen bytes, the fp32 master, the compute-dtype
// copy it contributes to gathers, the fp32 gradient shard and the optimizer state of that shard.
//
// As the model announces units (UnitHooks), the engine all-gathers a unit's parameters into the
// model's tensors just before use — prefetching the next unit's gather, one in flight — and frees
// them after (full_shard: after forward, and again after backward with a second gather; the
// shard_grad_op kinds: only after backward). When a unit's backward is done its gradients are
// reduce-scattered over the shard group, all-reduced over the replicate group, averaged over the
// world and added to the rank's gradient shard; `no_sync` micro-batches keep the full gradients
// locally instead and reduce them with the last micro-batch of the step.
//
// A shard group of one rank (ddp, or a single process) keeps the model resident: nothing is
// gathered or freed, and the optimizer's results are copied back into the model after each step.
#pragma once
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dist/frozen_layout.h"
#include "backend/cuda_backend.h"
#include "backend/side_stream.h"
#include "dist/process_groups.h"
#include "model/llama_model.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "util/dtype.h"
#include "util/worker_thread.h"

namespace fsdpq {

struct FsdpOptions {
  DType compute_dtype = DType::BF16;  // what trainable parameters are gathered and computed in
  Device device = Device::CPU;        // where the model computes: gathered tensors and gradients live there
  // Where the shards' fp32 masters, gradients and optimizer state live and are stepped: the GPU,
  // or host memory (the CPU backend, and use_cpu_offload).
  Device state_device = Device::CPU;
  OptimizerConfig optimizer;
  // use_cpu_offload on a rank that holds whole units (a shard group of one): the layers' frozen
  // base weights wait in host memory and are copied in on a side stream one unit ahead of use
  // (dist/frozen_offload.h). Shard groups of more ranks gather each unit anyway.
  bool offload_frozen = false;
  // With the state on the host and a world of one rank: each unit's gradients are copied out on a side
  // stream as its backward ends and accumulated on a worker thread; a step begun with
  // step_during_backward also runs each unit's optimizer there, while the GPU computes the
  // backward of the units before it.
  bool overlap_host_optimizer = false;
};

// One trainable tensor and this rank's part of it: elements [offset, offset + master.size()) of
// the tensor, flat (master is empty where the rank holds none of it); `state` in
// optimizer_state_names order, the same range.
struct TrainableShard {
  const std::string& name;
  const Shape& shape;
  int64_t offset;
  std::span<float> master;
  std::vector<std::span<float>> state;
};

// What a rank holds, in bytes (the equivalence test checks total / world under full_shard).
struct ShardBytes {
  int64_t frozen = 0;     // this rank's share of the frozen base weights
  int64_t trainable = 0;  // fp32 masters of this rank's shard
  int64_t model_frozen = 0, model_trainable = 0;  // the whole model's, for comparison
};

// Seconds this rank spent blocked on communication since the last take_times(): waiting for
// parameter all-gathers (what prefetching did not hide) and reducing gradients; and copying
// between host and GPU when the shards' state lives on the host.
struct CommTimes {
  double gather_wait = 0;
  double reduce = 0;
  double offload_copies = 0;  // host⇄device copies of gradients and compute copies (state on the host)
  double host_worker = 0;     // the worker thread's accumulation and optimizer steps (overlapped)
};

// What a step asks of the optimizer (FsdpEngine::step): its learning rate, clipping to a global
// norm (none: measure only), and fp16's dynamic loss scaler (none in the other precisions).
struct StepRequest {
  double lr = 0;
  std::optional<double> clip_to_norm;
  DynamicLossScaler* scaler = nullptr;
};

// What the step did. A diverged step (a NaN or infinite gradient norm, not fp16's overflow, which
// the scaler skips) updates nothing and names where the first bad gradient is.
struct StepOutcome {
  bool skipped = false;     // fp16: a gradient overflowed; the scale backed off
  double grad_norm = 0;     // before clipping; NaN when skipped
  std::string diverged_at;  // empty unless the norm is not finite
};

class FsdpEngine final : public UnitHooks {
 public:
  FsdpEngine(ProcessGroups& groups, FsdpOptions options, int num_units);
  ~FsdpEngine() override;
  FsdpEngine(const FsdpEngine&) = delete;
  FsdpEngine& operator=(const FsdpEngine&) = delete;

  // The model builder's UnitBuilt callback: records the unit's layout, keeps this rank's shard and
  // frees the rest (unless resident), so a rank never holds more than one whole unit.
  void adopt_unit(int unit, ParamUnit& contents);
  // A unit this rank built only its shard of (dist/shard_loader.h): the skeleton's tensors are
  // unallocated, `frozen_shard` is this rank's frozen_shard_bytes of the layout and `master_shard`
  // its shard_numel fp32 masters.
  // Shard groups of more than one rank only.
  void adopt_unit_shard(int unit, ParamUnit& skeleton, const UnitLayout& layout, std::vector<uint8_t> frozen_shard,
                        std::vector<float> master_shard);
  // Once the model exists: binds to its tensors (the root's moved with the model) and installs the
  // hooks. Every unit must have been adopted.
  void attach(LlamaModel& model);

  // UnitHooks
  void forward_begin(int unit) override;
  void forward_end(int unit, bool backward_follows) override;
  void backward_begin(int unit) override;
  void backward_end(int unit) override;

  // false during the micro-batches of a step that defer their gradient reduction (no_sync).
  void set_sync_gradients(bool sync) { sync_gradients_ = sync; }

  // The training loop's two calls per step. Before the step's last micro-batch: with CPU offload,
  // lets the host update (or, when the step clips or scales the loss, measure) each unit during its
  // backward; elsewhere nothing. After it: unscale or skip (fp16), measure, clip, update.
  void before_last_micro_batch(const StepRequest& request);
  StepOutcome step(const StepRequest& request);

  // The global gradient L2 norm over every shard (collective over the shard group).
  double grad_norm();
  // After a non-finite norm: where the first NaN or Inf gradient is, in unit order — "tensor 'NAME'",
  // or for a unit already updated during backward (its gradient is gone, only its measured sum of
  // squares tells) "one of unit K's N tensors (the first 'NAME')". Collective over the shard group.
  std::string first_non_finite_gradient();
  int64_t optimizer_steps() const;

  // Makes every trainable tensor's full fp32 master present in the model (for saving or
  // generation); collective over the shard group. Frees nothing: call when training is over.
  void gather_masters_into_model();

  // Checkpointing: every trainable tensor, in the same order on every rank, with this rank's part
  // of its master and optimizer state. `is_writer` ranks (replicate rank 0) write their parts;
  // every rank loads its own.
  void for_each_trainable(const std::function<void(TrainableShard&)>& visit);
  bool is_writer() const;
  // After the masters or the optimizer state were loaded from a checkpoint.
  void masters_loaded(int64_t optimizer_steps);

  ShardBytes shard_bytes() const;
  // This rank's frozen bytes (a copy; empty when resident) and fp32 masters of a unit, for tests.
  std::vector<uint8_t> frozen_shard(int unit);
  std::span<const float> master_shard(int unit);
  CommTimes take_times();
  // Profiling (profile = true): called after each all-gather wait and gradient reduction with
  // what it was ("gather wait", "reduce"), the unit's name ("layer 3") and when it ran. With the
  // CPU-offload worker also for what it does ("host copy-out wait", "host accumulate", "host
  // update"; from the worker thread: the sink must be thread-safe) and for the main thread's
  // waits on it ("update wait": a forward waiting for a unit's queued update; "norm wait": the
  // gradient norm waiting for the last measurements).
  using EventSink = std::function<void(const char* what, const std::string& unit,
                                       std::chrono::steady_clock::time_point begin,
                                       std::chrono::steady_clock::time_point end)>;
  void set_event_sink(EventSink sink) { event_sink_ = std::move(sink); }
  // Called when a training pass's forward is complete (its backward is about to begin): where
  // fsdp_qlora takes its "after forward" memory reading.
  void set_forward_done_callback(std::function<void()> callback) { forward_done_ = std::move(callback); }
  const ProcessGroups& groups() const { return groups_; }
  bool resident() const;

  struct Unit;

 private:
  // The parts of step() and before_last_micro_batch(), in the order a step runs them.
  void scale_grads(double factor);
  // fp16 loss scaling: multiplies every gradient shard by 1/scale and returns whether any rank's
  // shard holds inf or NaN (collective over the world, so every rank skips or steps alike).
  bool unscale_grads(const DynamicLossScaler& scaler);
  // An overflowed step is skipped: the gradient shards are zeroed, masters and optimizer untouched.
  void skip_step();
  // Steps every unit's shard with `lr`, refreshes the compute copies and zeroes the gradient shards.
  // After step_during_backward it only finishes that step (units whose backward never ran are
  // stepped here).
  void optimizer_step(double lr);
  // Whether step_during_backward / measure_during_backward are available (overlap_host_optimizer, state
  // on the host, a world of one rank).
  bool can_step_during_backward() const;
  // Called before the last micro-batch's forward_backward of a step that needs no clipping and no
  // loss scaling (both need every gradient before any update): each unit is stepped with `lr` as
  // soon as its gradients are complete. grad_norm() then reports the norm the step used.
  void step_during_backward(double lr);
  // Called instead before the last micro-batch of a step that clips or scales the loss: each
  // unit's gradients are unscaled (when `scaler` is given) and measured on the worker as they
  // complete, so unscale_grads and grad_norm need no pass of their own. optimizer_step then queues
  // each unit's update on the worker in forward order, and the next pass waits for a unit's update
  // only when it reaches that unit.
  void measure_during_backward(const DynamicLossScaler* scaler);
  Unit& unit(int index);
  void record_layout(Unit& u, ParamUnit& contents, const UnitLayout& layout);
  // The gather's send buffer of a unit being adopted, filled with `chunk` (chunk_bytes).
  void keep_send(Unit& u, const std::vector<uint8_t>& chunk);
  // The collectives over buffers where the model computes: MPI's host groups on the CPU, the
  // device collectives (ProcessGroups::shard_device) on a GPU; replicate_comm is null for one replica.
  Communicator& gather_comm();
  Communicator* replicate_comm();
  // n floats of scratch where the collectives run: `host` on the CPU, else a device tensor in `holder`.
  float* comm_scratch(HostStaging& host, Tensor& holder, size_t n);
  void start_gather(Unit& u);
  void ensure_gathered(Unit& u);
  void release(Unit& u);
  void prefetch(int index);
  void fetch_frozen(int index);  // offload_frozen: unit `index`'s copy in, ahead of use
  void reduce_gradients(Unit& u);
  void zero_grad_shard(Unit& u);
  // The shard's gradient buffer and optimizer (on options_.state_device), once its master is set.
  void init_shard_state(Unit& u);
  // After the masters changed: the compute copies (model tensors, or the shards gathers send).
  void refresh_compute_copies();
  // overlap_host_optimizer: copy out, then accumulate (and step) on the worker.
  void reduce_gradients_on_worker(Unit& u);
  void step_on_worker(Unit& u, double lr, float grad_scale);
  // Waits for the worker's jobs (rethrowing their errors); nothing without a worker.
  void drain_worker();
  bool stepped_during_backward() const;
  // A unit whose update is queued on the worker: wait for it, and let the compute stream see it.
  void wait_for_step(Unit& u);
  // drain_worker, and every queued update finished.
  void settle_steps();

  ProcessGroups& groups_;
  FsdpOptions options_;
  // Host buffers of the gradient reduction (CPU backend), of a reduced shard coming to the host
  // (use_cpu_offload) and of host⇄GPU tensor writes (pinned on a GPU).
  HostStaging packed_staging_, reduced_staging_, offload_staging_, write_staging_;
  EventSink event_sink_;
  std::function<void()> forward_done_;
  std::vector<std::unique_ptr<Unit>> units_;
  bool sync_gradients_ = true;
  CommTimes times_;
  bool reshard_after_forward_;
  int last_layer_unit_;
  bool overlap_ = false;
  bool step_in_backward_ = false;
  double step_lr_ = 0;
  bool measure_in_backward_ = false;
  const DynamicLossScaler* measure_scaler_ = nullptr;
  std::optional<float> clip_factor_;  // scale_grads' factor, applied by each queued update
  // Declared last: destroyed first, so no copy or job outlives the units' buffers.
  std::unique_ptr<SideStream> frozen_copies_, grad_copies_, upload_copies_;
  std::unique_ptr<WorkerThread> worker_;
};

}  // namespace fsdpq
