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

namespace {

// The hint's one line: what the run needs now, and what keeping `layers` more of `what` would cost
// (`then`, the plan's figure with them) and save.
void offer(const char* key, int64_t layers, const char* what, const char* instead, int64_t now, int64_t then,
           uint64_t gpu_total) {
  log::info("GPU memory: this run needs about {} of the GPU's {}; {} = {} would keep the last {} layers' {} ({} more) "
            "instead of {} (docs/model.md; `fsdpq plan` weighs it against the batch size)",
            human_bytes(static_cast<double>(now)), human_bytes(static_cast<double>(gpu_total)), key, layers, layers, what,
            human_bytes(static_cast<double>(then - now)), instead);
}

}  // namespace

void hint_kept_dense_layers(const World& world, const ResolvedConfig& resolved, const RunPlan& plan, const GpuInfo& gpu) {
  if (!gpu.has_gpu() || gpu.shared) return;  // ranks sharing a GPU share its memory too: no figure to offer
  const TrainConfig& c = resolved.config;
  PlanInput input = plan_input_from(c, plan.model.config, world.size);
  input.on_gpu = true;
  const int64_t now = predict_memory(input).gpu_required;
  // Layers not recomputed first (a layer's forward saved each), else dense ones; the same memory is
  // not offered twice.
  if (const int64_t layers = activation_layers_to_suggest(c, input, gpu.total_memory); layers > 0) {
    input.setting.keep_activation_layers = layers;
    offer("keep_activation_layers", layers, "activations for their backward", "recomputing their forward each step", now,
          predict_memory(input).gpu_required, gpu.total_memory);
  } else if (const int64_t kept = kept_layers_to_suggest(c, input, gpu.total_memory); kept > 0) {
    input.setting.keep_dequantized_layers = kept;
    offer("keep_dequantized_layers", kept, "base weights dense for every pass", "dequantising them in every pass", now,
          predict_memory(input).gpu_required, gpu.total_memory);
  }
}

}  // namespace fsdpq
