// FSDP over the model's units (docs/sharding.md), assembled from its three parts, each one job:
//   - ShardedParameters (sharded_parameters.h): the model's UnitHooks — each unit's frozen bytes
//     and compute copies sharded over the shard group, gathered before use, released after, its
//     gradients reduced into the training state;
//   - ShardedTrainingState (sharded_training_state.h): the fp32 masters, gradients and optimizer
//     state of this rank's shards — the step (unscale, norm, clip, update) and what checkpoints
//     read and write;
//   - HostOffloadScheduler (host_offload_scheduler.h), with use_cpu_offload on one rank: what
//     runs on the host during the backward, between the model and the parameters.
// Fsdp builds them, adopts the units the model builder hands over, installs the hooks and routes
// the training loop's calls; it keeps nothing of the training itself.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "fsdp/comm_times.h"
#include "fsdp/frozen_layout.h"
#include "fsdp/host_offload_scheduler.h"
#include "fsdp/process_groups.h"
#include "fsdp/sharded_parameters.h"
#include "fsdp/sharded_training_state.h"
#include "fsdp/step.h"
#include "model/llama_model.h"
#include "optim/optimizer.h"

namespace fsdpq {

struct FsdpOptions {
  DType compute_dtype = DType::BF16;  // what trainable parameters are gathered and computed in
  Device device = Device::CPU;        // where the model computes: gathered tensors and gradients live there
  // Where the shards' fp32 masters, gradients and optimizer state live and are stepped: the GPU,
  // or host memory (the CPU backend, and use_cpu_offload).
  Device state_device = Device::CPU;
  OptimizerConfig optimizer;
  // use_cpu_offload on a rank that holds whole units (a shard group of one): the layers' frozen
  // base weights wait in host memory and are copied in one unit ahead of use (fsdp/frozen_offload.h).
  // Shard groups of more ranks gather each unit anyway.
  bool offload_frozen = false;
  // With the state on the host and a world of one rank: the host-offload scheduler adds up, and
  // updates, each unit's gradients on a worker thread during the backward.
  bool overlap_host_optimizer = false;
};

class Fsdp {
 public:
  Fsdp(ProcessGroups& groups, FsdpOptions options, int num_units);
  ~Fsdp();
  Fsdp(const Fsdp&) = delete;
  Fsdp& operator=(const Fsdp&) = delete;

  // The model builder's hand-over of each unit. A shard group of one rank keeps whole units:
  // adopt_whole_unit (the builder's UnitBuiltCallback). A larger one adopts what the shard loader
  // built of its shard (fsdp/shard_loader.h): the skeleton's tensors are unallocated,
  // `frozen_shard` is this rank's frozen_shard_bytes of the layout and `master_shard` its
  // shard_numel fp32 masters. Both go the same way: the parameters keep the frozen bytes and make
  // the compute copies, the training state keeps the masters.
  void adopt_whole_unit(int unit, ParamUnit& contents);
  void adopt_unit(int unit, ParamUnit& contents, const UnitLayout& layout, std::vector<uint8_t> frozen_shard,
                  std::vector<float> master_shard);
  // Once the model exists: binds to its tensors and installs the hooks. Every unit must have been adopted.
  void attach(LlamaModel& model);

  // The training loop. set_sync_gradients(false) during the micro-batches of a step that defer
  // their gradient reduction (no_sync). Before the step's last micro-batch, before_last_micro_batch
  // lets the host-offload scheduler plan its backward (nothing without it); after it, step unscales
  // or skips (fp16), measures, clips and updates.
  void set_sync_gradients(bool sync) { parameters_.set_sync_gradients(sync); }
  void before_last_micro_batch(const StepRequest& request);
  StepOutcome step(const StepRequest& request);

  // The training state with no update in flight: checkpoints read and write it, tests measure it.
  ShardedTrainingState& state();
  // After a checkpoint's masters and optimizer state were loaded into state().
  void masters_loaded(int64_t optimizer_steps);
  // Makes every trainable tensor's full fp32 master present in the model (for saving or
  // generation); collective over the shard group. Frees nothing: call when training is over.
  void gather_masters_into_model();

  const ShardedParameters& parameters() const { return parameters_; }
  const ProcessGroups& groups() const { return groups_; }
  CommTimes take_times();
  void set_event_sink(EventSink sink);
  void set_forward_done_callback(std::function<void()> callback) {
    parameters_.set_forward_done_callback(std::move(callback));
  }

 private:
  void settle();

  ProcessGroups& groups_;
  FsdpOptions options_;
  ShardedTrainingState state_;
  ShardedParameters parameters_;
  EventSink event_sink_;
  // Declared last: destroyed first, so no worker job outlives the state and the parameters.
  std::unique_ptr<HostOffloadScheduler> offload_;
};

}  // namespace fsdpq
