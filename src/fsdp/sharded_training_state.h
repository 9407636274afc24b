// The sharded training state (docs/sharding.md): per FSDP unit, this rank's slice of the unit's
// flat fp32 masters, their gradient and the optimizer's state of that slice — on the GPU, or in
// host memory (the CPU backend, use_cpu_offload). It is what a step changes and what checkpoints
// read and write. As torchtitan's optimizer and clipping work on sharded tensors, it unscales,
// measures the global norm (one all-reduce of the shards' sums of squares), clips and updates
// shards only (StepActions, fsdp/step.h).
//
// It knows nothing of gathers or of the model: the sharded parameters add each unit's reduced
// gradient here and make their compute copies from the masters here (sharded_parameters.h); the
// host-offload scheduler drives single units from its worker thread (the unit-by-unit part below).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/tensor.h"
#include "fsdp/frozen_layout.h"
#include "fsdp/process_groups.h"
#include "fsdp/step.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "util/dtype.h"

namespace fsdpq {

struct ParamUnit;

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

class ShardedTrainingState final : public StepActions {
 public:
  // `device`: where the shards live and are stepped.
  ShardedTrainingState(ProcessGroups& groups, OptimizerConfig optimizer, Device device, int num_units);
  ~ShardedTrainingState() override;
  ShardedTrainingState(const ShardedTrainingState&) = delete;
  ShardedTrainingState& operator=(const ShardedTrainingState&) = delete;

  // This rank's fp32 masters of a unit (layout.shard_numel; zeros past its tensors), and the
  // unit's trainable tensors' names and places in the layout. Allocates the gradient and the
  // optimizer state.
  void adopt(int unit, const ParamUnit& contents, const UnitLayout& layout, std::vector<float> master);

  bool on_device() const { return device_ == Device::CUDA; }
  // Adds values × scale to the unit's gradient shard from element `offset` on; `values` (fp32)
  // lives where the state does.
  void add_to_gradient(int unit, int64_t offset, const TensorView& values, float scale);
  // The unit's masters, for the compute copies: on the GPU (state on the GPU only), or on the
  // host (copied from the GPU first when the state lives there).
  TensorView master_on_device(int unit);
  // The unit's gradient shard where it lives on the GPU (state on the GPU only), for the model to
  // accumulate into directly while it is zero (ShardedParameters, one rank): `gradient_written`
  // then says it no longer is.
  TensorView gradient_on_device(int unit);
  void gradient_written(int unit);
  std::span<const float> master_on_host(int unit);

  // StepActions: the whole step over every shard.
  bool unscale(const DynamicLossScaler& scaler) override;
  double grad_norm() override;
  // "tensor 'NAME'", the first in unit order whose gradient (on whichever rank's shard) is NaN or
  // Inf. Collective over the shard group.
  std::string first_non_finite_gradient() override;
  void skip() override;
  void update(double lr, std::optional<float> clip) override;
  // Every gradient × factor (clipping's scale, before the update).
  void scale_gradients(float factor);

  // Unit by unit, on the host (the host-offload scheduler; a unit's calls from one thread at a time).
  // The sum of squares of the unit's gradient, as grad_norm adds it up.
  double grad_sq(int unit);
  // fp16: the unit's gradient divided by the scale; true when it held inf or NaN.
  bool unscale_unit(int unit, const DynamicLossScaler& scaler);
  // gradient += staged × scale over the unit's trainable elements.
  void accumulate(int unit, const float* staged, float scale);
  // The same, then (fp16, with `scaler`) unscaled, in one pass; returns the sum of squares of the
  // result and says whether any value was inf or NaN (accumulate_and_sq_sum).
  double accumulate_and_measure(int unit, const float* staged, float scale, const DynamicLossScaler* scaler,
                                bool* found_nonfinite);
  // A zero gradient plus `staged` is `staged`: the unit's gradient is read from there until its
  // update (saves writing, reading and zeroing the gradient). Returns its sum of squares.
  double take_gradient(int unit, float* staged);
  bool gradient_is_zero(int unit) const;
  // The unit's update with `lr` (its gradient scaled by `grad_scale` first), its new masters also
  // written to `compute` in `compute_dtype` (the unit's trainable elements), in one pass.
  void update_with_compute_copies(int unit, double lr, float grad_scale, void* compute, DType compute_dtype);
  // The unit's update with `lr`, as update() does it.
  void update_unit(int unit, double lr);
  // A device buffer of the unit's shard_numel elements in `dtype` that each GPU update of the unit
  // also writes its new masters to, in the same pass (DeviceShardOptimizer's fused step); null
  // stops that. compute_written says whether the updates since it was last asked wrote it.
  void write_compute_copies_on_update(int unit, void* compute_device, DType dtype);
  bool compute_written(int unit);
  // first_non_finite_gradient when some units were updated already (their gradient is gone; only
  // its sum of squares, `updated_sq[unit]`, tells): for those "one of unit K's N tensors (the first
  // 'NAME'; it was updated during backward)".
  std::string first_non_finite_gradient(const std::vector<std::optional<double>>& updated_sq);
  // The global norm from this rank's sum of squares (collective over the shard group), and
  // whether any rank overflowed (collective over the world).
  double global_norm(double local_sq);
  bool overflow_anywhere(bool local);

  // Checkpoints: every trainable tensor, in the same order on every rank, with this rank's part
  // of its master and optimizer state. `is_writer` ranks (replicate rank 0) write their parts;
  // every rank loads its own.
  void for_each_trainable(const std::function<void(TrainableShard&)>& visit);
  bool is_writer() const;
  int64_t optimizer_steps() const;
  // After the masters and the optimizer state were loaded, `optimizer_steps` into the step.
  void set_optimizer_steps(int64_t optimizer_steps);

  int num_units() const { return static_cast<int>(units_.size()); }
  int64_t trainable_numel(int unit) const;
  int64_t shard_numel(int unit) const;

  struct Unit;

 private:
  Unit& unit(int index);
  const Unit& unit(int index) const;
  // The shard's gradient buffer and optimizer, once its master is set.
  void allocate_state(Unit& u);
  void zero_gradient(Unit& u);

  ProcessGroups& groups_;
  OptimizerConfig optimizer_;
  Device device_;
  std::vector<std::unique_ptr<Unit>> units_;
};

}  // namespace fsdpq
