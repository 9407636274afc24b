#include "app/kept_layers_hint.h"

#include "runtime/log.h"
#include "util/strings.h"

namespace fsdpq {

int64_t kept_layers_to_suggest(const TrainConfig& c, const PlanInput& input, uint64_t gpu_total_bytes) {
  if (!c.quantized_base() || c.keep_dequantized_layers > 0 || gpu_total_bytes == 0) return 0;
  return most_kept_dense_layers(input, static_cast<int64_t>(kKeptLayersHintShare * static_cast<double>(gpu_total_bytes)));
}

int64_t activation_layers_to_suggest(const TrainConfig& c, const PlanInput& input, uint64_t gpu_total_bytes) {
  if (!c.use_gradient_checkpointing || c.checkpoint_every != 1 || c.keep_activation_layers > 0 || gpu_total_bytes == 0)
    return 0;
  return most_kept_activation_layers(input,
                                     static_cast<int64_t>(kKeptLayersHintShare * static_cast<double>(gpu_total_bytes)));
}

void hint_kept_dense_layers(const World& world, const ResolvedConfig& resolved, const RunPlan& plan, const GpuInfo& gpu) {
  if (!gpu.has_gpu() || gpu.shared) return;  // ranks sharing a GPU share its memory too: no figure to offer
  const TrainConfig& c = resolved.config;
  PlanInput input = plan_input_from(c, plan.model.config, world.size);
  input.on_gpu = true;
  const int64_t now = predict_memory(input).gpu_required;
  if (const int64_t layers = activation_layers_to_suggest(c, input, gpu.total_memory); layers > 0) {
    input.setting.keep_activation_layers = layers;
    const int64_t then = predict_memory(input).gpu_required;
    log::info("GPU memory: this run needs about {} of the GPU's {}; keep_activation_layers = {} would keep the last {} "
              "layers' activations for their backward ({} more) instead of recomputing their forward each step "
              "(docs/model.md; `fsdpq plan` weighs it against the batch size)",
              human_bytes(static_cast<double>(now)), human_bytes(static_cast<double>(gpu.total_memory)), layers, layers,
              human_bytes(static_cast<double>(then - now)));
    return;  // the same memory is not offered twice
  }
  const int64_t kept = kept_layers_to_suggest(c, input, gpu.total_memory);
  if (kept == 0) return;
  input.setting.keep_dequantized_layers = kept;
  const int64_t then = predict_memory(input).gpu_required;
  log::info("GPU memory: this run needs about {} of the GPU's {}; keep_dequantized_layers = {} would keep the last {} "
            "layers' dequantised weights for their backward ({} more) instead of dequantising them again each step "
            "(docs/model.md, \"Kept dense layers\"; `fsdpq plan` weighs it against the batch size)",
            human_bytes(static_cast<double>(now)), human_bytes(static_cast<double>(gpu.total_memory)), kept, kept,
            human_bytes(static_cast<double>(then - now)));
}

}  // namespace fsdpq
