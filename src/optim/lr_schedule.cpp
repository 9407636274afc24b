#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>

#include "util/error.h"

namespace fsdpq {

LrScheduleKind parse_lr_schedule(std::string_view name) {
  if (name == "constant") return LrScheduleKind::constant;
  if (name == "linear") return LrScheduleKind::linear;
  if (name == "cosine") return LrScheduleKind::cosine;
  fail("lr_scheduler: unknown value '{}' (allowed: constant, linear, cosine)", name);
}

std::string_view lr_schedule_name(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::constant: return "constant";
    case LrScheduleKind::linear: return "linear";
    case LrScheduleKind::cosine: return "cosine";
  }
  throw std::logic_error("unknown LrScheduleKind");
}

int64_t num_training_steps(int64_t num_epochs, int64_t batches_per_epoch,
                           int64_t gradient_accumulation_steps) {
  if (gradient_accumulation_steps <= 0)
    throw std::logic_error("num_training_steps: gradient_accumulation_steps must be > 0");
  const int64_t batches = num_epochs * batches_per_epoch;
  // Python's // floors; batches is never negative here, but keep the floor explicit.
  int64_t q = batches / gradient_accumulation_steps;
  if (batches % gradient_accumulation_steps != 0 && batches < 0) --q;
  return q;
}

int64_t num_warmup_steps(int64_t total_steps) {
  return static_cast<int64_t>(static_cast<double>(total_steps) * 0.1);  // int() truncates
}

LrSchedule::LrSchedule(LrScheduleKind kind, double base_lr, int64_t total_steps,
                       double min_lr_fraction)
    : kind_(kind),
      base_lr_(base_lr),
      total_steps_(total_steps),
      warmup_steps_(kind == LrScheduleKind::constant ? 0 : num_warmup_steps(total_steps)),
      min_lr_fraction_(min_lr_fraction) {}

double LrSchedule::lambda_at(int64_t step) const {
  const auto as_double = [](int64_t v) { return static_cast<double>(v); };
  switch (kind_) {
    case LrScheduleKind::constant: return 1.0;  // fsdp_qlora builds no scheduler at all
    case LrScheduleKind::linear:
      // transformers.get_linear_schedule_with_warmup
      if (step < warmup_steps_)
        return as_double(step) / as_double(std::max<int64_t>(1, warmup_steps_));
      return std::max(0.0, as_double(total_steps_ - step) /
                               as_double(std::max<int64_t>(1, total_steps_ - warmup_steps_)));
    case LrScheduleKind::cosine: {
      // fsdp_qlora's _get_cosine_one_cycle_lr_lambda (no clamp past the last step, as there)
      if (step < warmup_steps_)
        return as_double(step) / as_double(std::max<int64_t>(1, warmup_steps_));
      const double scale_term = 1.0 - min_lr_fraction_;
      const double progress = as_double(step - warmup_steps_) /
                              as_double(std::max<int64_t>(1, total_steps_ - warmup_steps_));
      return (std::cos(std::numbers::pi * progress) + 1.0) * 0.5 * scale_term + min_lr_fraction_;
    }
  }
  throw std::logic_error("unknown LrScheduleKind");
}

double LrSchedule::lr_at(int64_t step) const { return base_lr_ * lambda_at(step); }

}  // namespace fsdpq
