// The sharded parameters (docs/sharding.md): FSDP's side of the model's UnitHooks. Each unit's
// frozen base-weight bytes (NF4 codes and statistics, or bf16) and trainable parameters are
// flattened, padded and split over the shard group; per unit a rank keeps its frozen shard and
// the compute-dtype copy of its fp32 master shard, [frozen shard | compute shard]: what it sends
// to the unit's all-gather.
//
// As the model announces units, a unit is all-gathered into the model's tensors just before use
// — prefetching the next unit's gather, one in flight — and freed after (full_shard: after
// forward, and again after backward with a second gather; the shard_grad_op kinds: only after
// backward). When a unit's backward is done its gradients are reduce-scattered over the shard
// group, all-reduced over the replicate group, averaged over the world and added to the training
// state's gradient shard (sharded_training_state.h); `no_sync` micro-batches keep the full
// gradients instead and reduce them with the last micro-batch of the step.
//
// A shard group of one rank (ddp, or a single process) keeps its units resident: nothing is
// gathered or freed, the model computes with its own tensors, and with offload_frozen the layers'
// frozen weights wait in host memory and are fetched one unit ahead of use (frozen_offload.h).
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/side_stream.h"
#include "fsdp/comm_times.h"
#include "fsdp/frozen_layout.h"
#include "fsdp/process_groups.h"
#include "fsdp/sharded_training_state.h"
#include "model/llama_model.h"
#include "model/llama_weights.h"
#include "util/dtype.h"

namespace fsdpq {

struct ParameterOptions {
  DType compute_dtype = DType::BF16;  // what trainable parameters are gathered and computed in
  Device device = Device::CPU;        // where the model computes: gathered tensors and gradients live there
  // use_cpu_offload on a rank that holds whole units: the layers' frozen base weights wait in
  // host memory and are copied in on a side stream one unit ahead of use.
  bool offload_frozen = false;
};

// What a rank holds, in bytes (the equivalence test checks total / world under full_shard).
struct ShardBytes {
  int64_t frozen = 0;     // this rank's share of the frozen base weights
  int64_t trainable = 0;  // fp32 masters of this rank's shard
  int64_t model_frozen = 0, model_trainable = 0;  // the whole model's, for comparison
};

// A unit's trainable tensor and its elements in the unit's flat layout.
struct TrainableEntry {
  TrainableTensor* tensor = nullptr;
  std::string name;
  Shape shape;
  int64_t offset = 0, numel = 0;
};

class ShardedParameters final : public UnitHooks {
 public:
  // `state` receives the reduced gradients and holds the masters the compute copies are made of.
  ShardedParameters(ProcessGroups& groups, ParameterOptions options, ShardedTrainingState& state, int num_units);
  ~ShardedParameters() override;
  ShardedParameters(const ShardedParameters&) = delete;
  ShardedParameters& operator=(const ShardedParameters&) = delete;

  // A unit this rank holds. Resident (a shard group of one): `contents` is the built unit, which
  // the model keeps computing with, and `frozen_shard` is empty. Sharded: `contents` is a skeleton
  // (unallocated tensors) and `frozen_shard` this rank's frozen_shard_bytes of the layout.
  // `master`: this rank's fp32 masters of the unit, of which the compute shard is made.
  void adopt(int unit, ParamUnit& contents, const UnitLayout& layout, std::vector<uint8_t> frozen_shard,
             std::span<const float> master);
  // Once the model exists: binds to its tensors (the root's moved with the model). Every unit
  // must have been adopted.
  void attach(LlamaModel& model);

  // UnitHooks
  void forward_begin(int unit) override;
  void forward_end(int unit, bool backward_follows) override;
  bool frozen_weights_stay_in_place() const override { return resident() && !options_.offload_frozen; }
  void backward_begin(int unit) override;
  void backward_end(int unit) override;

  // false during the micro-batches of a step that defer their gradient reduction (no_sync).
  void set_sync_gradients(bool sync) { sync_gradients_ = sync; }
  bool syncs_gradients() const { return sync_gradients_; }
  // A step must not begin while a unit holds gradients it has not reduced.
  void expect_gradients_reduced() const;

  // After the masters changed: the compute copies (the model's tensors when resident, else the
  // shards the gathers send) of every unit, or of those `wanted` names.
  void write_compute_copies(const std::function<bool(int unit)>& wanted = {});
  // Makes every trainable tensor's full fp32 master present in the model (for saving or
  // generation); collective over the shard group. Frees nothing: call when training is over.
  void gather_masters_into_model();

  // A resident unit's trainable tensors, for the host-offload scheduler: their gradients are
  // copied out from, and their compute copies written to, the model's tensors.
  std::span<const TrainableEntry> trainables(int unit) const;
  Tensor& compute_tensor(const TrainableEntry& entry) const;
  bool holds_gradients(int unit) const;
  // The unit's gradients were taken (copied out): frees the model's gradient tensors.
  void free_gradients(int unit);
  const std::string& unit_name(int unit) const;
  DType compute_dtype() const { return options_.compute_dtype; }

  bool resident() const;
  ShardBytes shard_bytes() const;
  // This rank's frozen bytes of a unit (a copy; empty when resident), for tests.
  std::vector<uint8_t> frozen_shard(int unit) const;
  CommTimes take_times();
  void set_event_sink(EventSink sink) { event_sink_ = std::move(sink); }
  // Called when a training pass's forward is complete (its backward is about to begin): where
  // fsdp_qlora takes its "after forward" memory reading.
  void set_forward_done_callback(std::function<void()> callback) { forward_done_ = std::move(callback); }

  struct Unit;

 private:
  Unit& unit(int index);
  const Unit& unit(int index) const;
  void record_layout(Unit& u, ParamUnit& contents, const UnitLayout& layout);
  void adopt_resident(Unit& u, ParamUnit& contents);
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
  // Packs, reduce-scatters and all-reduces the unit's gradients; returns the rank's summed shard,
  // on the state's device.
  float* reduce_to_shard(Unit& u);
  void write_unit_compute_copies(int index);
  // One GPU's resident unit: its compute copies made blocks of one buffer the optimizer's update
  // writes (FSDPQ_FUSED_COMPUTE_COPIES), where they all live on the GPU; false where they cannot be.
  bool compute_copies_in_one_buffer(Unit& u);

  ProcessGroups& groups_;
  ParameterOptions options_;
  ShardedTrainingState& state_;
  // Host buffers of the gradient reduction (CPU backend), of a reduced shard coming to the host
  // (use_cpu_offload) and of host⇄GPU tensor writes (pinned on a GPU).
  HostStaging packed_staging_, reduced_staging_, offload_staging_, write_staging_;
  EventSink event_sink_;
  std::function<void()> forward_done_;
  std::vector<std::unique_ptr<Unit>> units_;
  bool sync_gradients_ = true;
  CommTimes times_;
  const bool reshard_after_forward_;
  const int last_layer_unit_;
  // Declared last: destroyed first, so no copy outlives the units' buffers.
  std::unique_ptr<SideStream> frozen_copies_;
};

}  // namespace fsdpq
