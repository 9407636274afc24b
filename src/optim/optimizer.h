// Optimizers over flat fp32 buffers, with torch.optim semantics (formulas in docs/optim.md).
// A step touches one contiguous range of (param, grad, state) and nothing else, so a rank steps
// exactly the shard it owns, on the GPU's host copy or in CPU offload, with no gathering.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/optimizer_config.h"  // OptimizerKind, OptimizerConfig: shared with the kernels
#include "util/dtype.h"

namespace fsdpq {

// fsdp_qlora's optimizer for an `optimizer` option value: adamw / fused_adamw =
// AdamW(lr, betas=(0.9, 0.95), eps=1e-5, weight_decay=wd); adam / fused_adam = Adam(lr);
// sgd = SGD(lr); adadelta = Adadelta(lr). The fused variants have the same math. Throws
// UserError naming the allowed values for anything else.
OptimizerConfig optimizer_config(std::string_view name, double lr, double weight_decay);
// The same from the kind; parse_optimizer maps a value to it (UserError as above).
OptimizerConfig optimizer_config(OptimizerKind kind, double lr, double weight_decay);
OptimizerKind parse_optimizer(std::string_view name);

std::string_view optimizer_kind_name(OptimizerKind kind);

// torch's names for the per-element state buffers, in the order optimizer_step expects them:
// adam(w): exp_avg, exp_avg_sq; adadelta: square_avg, acc_delta; sgd: none.
std::vector<std::string> optimizer_state_names(OptimizerKind kind);

// One step over elements [0, n) of a flat shard. `state` has one buffer per state name (all
// zeros before the first step); `step` is torch's state['step'] after its increment (1 on the
// first step); `lr` is the scheduled learning rate for this step.
void optimizer_step(const OptimizerConfig& config, double lr, int64_t step, float* param,
                    const float* grad, float* const* state, int64_t n);

// What a host step may do in the same pass over the shard. CPU offload's worker updates are
// bound by memory bandwidth (fsdp/host_offload_scheduler.cpp), so each pass saved is time. The results are
// bit for bit those of the separate passes: scale the gradient, step, zero the gradient, store
// the compute copy.
struct StepFusion {
  float grad_scale = 1.0f;  // each gradient element is multiplied by this first (clipping's factor)
  bool zero_grad = false;   // each gradient element is zeroed once read
  void* compute = nullptr;  // the new parameters [0, compute_numel), stored in compute_dtype
  DType compute_dtype = DType::BF16;
  int64_t compute_numel = 0;
};
void optimizer_step(const OptimizerConfig& config, double lr, int64_t step, float* param, float* grad,
                    float* const* state, int64_t n, const StepFusion& fusion);

// A shard optimizer's scalar state as checkpoints store it ({"optimizer", "step", "numel"}), and
// its reading: the step count, or a UserError when the state is of another optimizer or size.
// Host (ShardOptimizer) and GPU (DeviceShardOptimizer) shards share these, so either loads the other's.
nlohmann::json optimizer_state_json(OptimizerKind kind, int64_t step, int64_t numel);
int64_t optimizer_step_from_json(OptimizerKind kind, int64_t numel, const nlohmann::json& state);

// The state of one shard, owned: buffers plus the step count.
class ShardOptimizer {
 public:
  ShardOptimizer(OptimizerConfig config, int64_t numel);

  // Increments the step count, then updates param in place from grad.
  void step(float* param, const float* grad, double lr);
  void step(float* param, float* grad, double lr, const StepFusion& fusion);

  const OptimizerConfig& config() const { return config_; }
  int64_t numel() const { return numel_; }
  int64_t step_count() const { return step_count_; }

  // Checkpointing: the named state buffers (torch's names) to save or to fill on load, and the
  // scalar state as JSON ({"optimizer", "step", "numel"}).
  struct NamedBuffer {
    std::string name;
    std::span<float> data;
  };
  std::vector<NamedBuffer> state_buffers();
  nlohmann::json state_json() const;
  // Restores the step count; throws UserError when the checkpoint is of another optimizer or size.
  void load_state_json(const nlohmann::json& state);

 private:
  OptimizerConfig config_;
  int64_t numel_;
  int64_t step_count_ = 0;
  std::vector<std::string> names_;
  std::vector<std::vector<float>> buffers_;
};

}  // namespace fsdpq
