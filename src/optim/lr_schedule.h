// Learning-rate schedules exactly as fsdp_qlora builds them (train.py get_lr_scheduler), with
// torch's LambdaLR semantics: optimizer step k (0-based) runs at base_lr * lambda(k), so with a
// warm-up the very first step runs at lr 0. Formulas in docs/optim.md.
#pragma once
#include <cstdint>
#include <string_view>

namespace fsdpq {

enum class LrScheduleKind { constant, linear, cosine };

// Parses an `lr_scheduler` option value; throws UserError naming the allowed values otherwise.
LrScheduleKind parse_lr_schedule(std::string_view name);
std::string_view lr_schedule_name(LrScheduleKind kind);

// num_epochs * len(dataloader) // gradient_accumulation_steps (Python floor division).
int64_t num_training_steps(int64_t num_epochs, int64_t batches_per_epoch,
                           int64_t gradient_accumulation_steps);
// int(num_training_steps * 0.1), in double as Python computes it.
int64_t num_warmup_steps(int64_t total_steps);

class LrSchedule {
 public:
  // constant ignores total_steps; linear and cosine warm up over num_warmup_steps(total_steps).
  LrSchedule(LrScheduleKind kind, double base_lr, int64_t total_steps,
             double min_lr_fraction = 0.1);

  // The multiplier LambdaLR applies at optimizer step `step` (0-based).
  double lambda_at(int64_t step) const;
  // The learning rate of optimizer step `step` (0-based): base_lr * lambda_at(step).
  double lr_at(int64_t step) const;

  LrScheduleKind kind() const { return kind_; }
  double base_lr() const { return base_lr_; }
  int64_t total_steps() const { return total_steps_; }
  int64_t warmup_steps() const { return warmup_steps_; }

 private:
  LrScheduleKind kind_;
  double base_lr_;
  int64_t total_steps_;
  int64_t warmup_steps_;
  double min_lr_fraction_;
};

}  // namespace fsdpq
