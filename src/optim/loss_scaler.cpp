#include "optim/loss_scaler.h"

#include <cmath>
#include <stdexcept>

#include "util/error.h"

namespace fsdpq {

DynamicLossScaler::DynamicLossScaler(LossScalerConfig config)
    : config_(config), scale_(config.init_scale) {
  if (!(config.init_scale > 0.0f) || !(config.growth_factor > 1.0f) ||
      !(config.backoff_factor > 0.0f && config.backoff_factor < 1.0f) ||
      config.growth_interval <= 0)
    throw std::logic_error("DynamicLossScaler: invalid configuration");
}

float DynamicLossScaler::inv_scale() const {
  return static_cast<float>(1.0 / static_cast<double>(scale_));
}

bool DynamicLossScaler::has_nonfinite(const float* values, int64_t n) {
  int found = 0;
#pragma omp parallel for schedule(static) reduction(| : found)
  for (int64_t i = 0; i < n; ++i) found |= std::isfinite(values[i]) ? 0 : 1;
  return found != 0;
}

bool DynamicLossScaler::unscale(float* grad, int64_t n) const {
  // torch._amp_foreach_non_finite_check_and_unscale_: check each value, then multiply.
  const float inv = inv_scale();
  int found = 0;
#pragma omp parallel for schedule(static) reduction(| : found)
  for (int64_t i = 0; i < n; ++i) {
    found |= std::isfinite(grad[i]) ? 0 : 1;
    grad[i] *= inv;
  }
  return found != 0;
}

bool DynamicLossScaler::update(bool found_inf) {
  // torch._amp_update_scale_
  if (found_inf) {
    scale_ *= config_.backoff_factor;
    growth_tracker_ = 0;
    return false;
  }
  const int64_t successful = growth_tracker_ + 1;
  if (successful == config_.growth_interval) {
    const float grown = scale_ * config_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;  // never grow into inf
    growth_tracker_ = 0;
  } else {
    growth_tracker_ = successful;
  }
  return true;
}

nlohmann::json DynamicLossScaler::state_json() const {
  return {{"scale", scale_}, {"growth_tracker", growth_tracker_}};
}

void DynamicLossScaler::load_state_json(const nlohmann::json& state) {
  const float scale = state.at("scale").get<float>();
  const int64_t tracker = state.at("growth_tracker").get<int64_t>();
  if (!(scale > 0.0f) || !std::isfinite(scale) || tracker < 0 ||
      tracker >= config_.growth_interval)
    fail("checkpoint loss-scaler state is invalid (scale {}, growth_tracker {})", scale, tracker);
  scale_ = scale;
  growth_tracker_ = tracker;
}

}  // namespace fsdpq
