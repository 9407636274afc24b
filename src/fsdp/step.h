// One optimizer step over sharded gradients, as the training loop asks for it and in the order it
// always runs: fp16's unscale (or skip, when a gradient overflowed), the global norm, clipping,
// the update. The training state runs it over its gradient shards (sharded_training_state.h); the
// host-offload scheduler runs the same order over the units it measured or updated during the
// backward (host_offload_scheduler.h).
#pragma once
#include <optional>
#include <string>

#include "optim/loss_scaler.h"

namespace fsdpq {

// What a step asks of the optimizer: its learning rate, clipping to a global norm (none: measure
// only), and fp16's dynamic loss scaler (none in the other precisions).
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

  bool updated() const { return !skipped && diverged_at.empty(); }
};

// The parts of a step, over gradients wherever they are. Each collective part is collective over
// the ranks that share the gradients.
class StepActions {
 public:
  virtual ~StepActions() = default;
  // fp16: divides every gradient by the loss scale; true when any rank's held inf or NaN.
  virtual bool unscale(const DynamicLossScaler& scaler) = 0;
  // The global gradient L2 norm.
  virtual double grad_norm() = 0;
  // After a non-finite norm: where the first NaN or Inf gradient is (docs in ShardedTrainingState).
  virtual std::string first_non_finite_gradient() = 0;
  // An overflowed step: the gradients are zeroed; masters and optimizer state stay.
  virtual void skip() = 0;
  // Scales the gradients by `clip` (when given), updates the masters with `lr` and zeroes the gradients.
  virtual void update(double lr, std::optional<float> clip) = 0;
};

StepOutcome run_step(const StepRequest& request, StepActions& actions);

}  // namespace fsdpq
