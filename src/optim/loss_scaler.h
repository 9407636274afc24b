// Dynamic loss scaling for fp16 training, as torch.amp.GradScaler with its defaults: the loss is
// multiplied by scale() before backward; unscale() divides the gradients back and reports
// inf/NaN; update() skips the step on overflow and halves the scale, and doubles it after
// growth_interval clean steps in a row.
#pragma once
#include <cstdint>

#include <nlohmann/json.hpp>

namespace fsdpq {

struct LossScalerConfig {
  float init_scale = 65536.0f;  // 2^16
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int64_t growth_interval = 2000;
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(LossScalerConfig config = {});

  float scale() const { return scale_; }
  // 1/scale rounded to fp32 from double, as GradScaler's scale.double().reciprocal().float().
  float inv_scale() const;

  // Multiplies grad by inv_scale() in place; returns true when any value is inf or NaN. A
  // sharded caller ORs this flag across ranks before update().
  bool unscale(float* grad, int64_t n) const;
  static bool has_nonfinite(const float* values, int64_t n);

  // Once per optimizer step, with the (global) overflow flag. Returns true when the optimizer
  // step must run, false when it must be skipped (overflow: the scale was backed off).
  bool update(bool found_inf);

  int64_t growth_tracker() const { return growth_tracker_; }

  // Checkpointing: {"scale", "growth_tracker"} (the config comes from the run's settings).
  nlohmann::json state_json() const;
  void load_state_json(const nlohmann::json& state);

 private:
  LossScalerConfig config_;
  float scale_;
  int64_t growth_tracker_ = 0;
};

}  // namespace fsdpq
