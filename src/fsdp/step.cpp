#include "fsdp/step.h"

#include <cmath>

#include "optim/clip.h"

namespace fsdpq {

StepOutcome run_step(const StepRequest& request, StepActions& actions) {
  StepOutcome out;
  // fp16: unscale, and skip the step when any gradient overflowed (the scale backs off).
  if (request.scaler) out.skipped = !request.scaler->update(actions.unscale(*request.scaler));
  out.grad_norm = out.skipped ? std::nan("") : actions.grad_norm();
  if (!out.skipped && !std::isfinite(out.grad_norm)) {
    out.diverged_at = actions.first_non_finite_gradient();
    return out;
  }
  if (out.skipped) {
    actions.skip();
    return out;
  }
  std::optional<float> clip;
  if (request.clip_to_norm) {
    const double coefficient = clip_coefficient(out.grad_norm, *request.clip_to_norm);
    if (coefficient < 1.0) clip = static_cast<float>(coefficient);
  }
  actions.update(request.lr, clip);
  return out;
}

}  // namespace fsdpq
