// use_cpu_offload on a world of one rank (docs/cuda.md, "CPU offload"): the host-offload
// scheduler, the one place that decides what runs during the backward. The shards' state lives in
// host memory; as each unit's backward ends its gradients are copied out on a side stream and
// added up on a worker thread, while the GPU computes the backward of the units before it.
//
// Before the step's last micro-batch it chooses what that backward does beyond adding up:
//   - update: a step that neither clips nor scales the loss updates each unit on the worker as
//     soon as its gradients are complete (and sends its new compute copies back to the GPU);
//   - measure: clipping and loss scaling need every gradient before any update, so each unit is
//     unscaled (fp16) and measured on the worker instead; the step then queues the updates on the
//     worker in forward order, and the next pass waits for a unit's update only when it reaches
//     that unit.
// The step itself runs in the usual order (fsdp/step.h), over what the worker measured.
//
// It stands between the model and the sharded parameters (both UnitHooks): a unit waits for its
// queued update before the parameters make it present, and its gradients go to the worker
// instead of the parameters' reduction (one rank: there is nothing to reduce). On the CPU backend
// the side streams copy at once, so the same code runs in the CPU tests.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/side_stream.h"
#include "fsdp/comm_times.h"
#include "fsdp/sharded_parameters.h"
#include "fsdp/sharded_training_state.h"
#include "fsdp/step.h"
#include "model/llama_model.h"
#include "util/worker_thread.h"

namespace fsdpq {

class HostOffloadScheduler final : public UnitHooks, private StepActions {
 public:
  // The state must live on the host, in a world of one rank; `device` is where the model computes.
  HostOffloadScheduler(ShardedParameters& parameters, ShardedTrainingState& state, Device device);
  ~HostOffloadScheduler() override;
  HostOffloadScheduler(const HostOffloadScheduler&) = delete;
  HostOffloadScheduler& operator=(const HostOffloadScheduler&) = delete;

  // UnitHooks: the parameters' own, around the worker's.
  void forward_begin(int unit) override;
  void forward_end(int unit, bool backward_follows) override;
  void backward_begin(int unit) override;
  void backward_end(int unit) override;

  // Before the step's last micro-batch: what its backward does (above). `step` must get the same request.
  void before_last_micro_batch(const StepRequest& request);
  StepOutcome step(const StepRequest& request);
  // Waits for every job of the worker (rethrowing their errors) and for every queued update.
  void settle();

  CommTimes take_times();
  void set_event_sink(EventSink sink) { event_sink_ = std::move(sink); }

 private:
  // What the last micro-batch's backward does with each unit's gradients, beyond adding them up.
  enum class BackwardWork { Accumulate, Measure, Update };
  struct UnitWork;

  // The unit's gradients: copied out behind its backward, then added up (measured, updated) on the worker.
  void take_gradients(int unit);
  void accumulate_on_worker(int unit, float* staged, BackwardWork work, const StepRequest& request);
  // On the worker thread: the unit's update (its gradient scaled by `grad_scale` first), then its
  // new compute copies into the model's tensors (which the GPU no longer reads this step: the
  // unit's backward is done). One pass over the shard's memory.
  void update_on_worker(int unit, double lr, float grad_scale);
  // A unit whose update is queued on the worker: wait for it, and let the compute stream see it.
  void wait_for_update(int unit);
  // After the updates: the compute copies of the units the worker did not update, and the
  // compute stream ordered after the copies the worker sent.
  void finish_updates();

  // StepActions, over the worker's measurements.
  bool unscale(const DynamicLossScaler& scaler) override;
  double grad_norm() override;
  std::string first_non_finite_gradient() override;
  void skip() override;
  void update(double lr, std::optional<float> clip) override;

  ShardedParameters& parameters_;
  ShardedTrainingState& state_;
  std::vector<std::unique_ptr<UnitWork>> units_;
  BackwardWork work_ = BackwardWork::Accumulate;
  StepRequest planned_;  // the request before_last_micro_batch planned the backward for
  EventSink event_sink_;
  CommTimes times_;
  // Declared last: destroyed first, so no copy or job outlives the buffers.
  std::unique_ptr<SideStream> grad_copies_, upload_copies_;
  std::unique_ptr<WorkerThread> worker_;
};

}  // namespace fsdpq
