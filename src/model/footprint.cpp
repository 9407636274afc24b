#include "model/footprint.h"

#include "model/llama_weights.h"
#include "quant/frozen_format.h"

namespace fsdpq {

uint64_t nf4_tensor_bytes(int64_t numel, bool double_quant) {
  // The format's segments (codes, then the absmax or its codes and group scales), and the
  // double quantisation's fp32 offset.
  return stored_bytes(nf4_format(double_quant), numel) + (double_quant ? sizeof(float) : 0);
}

ModelFootprint model_footprint(const LlamaConfig& config, bool quantized, int hqq_bits, bool trainable_base,
                               int64_t new_blocks, int64_t lora_rank, const std::vector<std::string>& lora_targets,
                               bool dora) {
  ModelFootprint f;
  f.params = count_params(config);
  const int64_t frozen_layers = config.num_hidden_layers - new_blocks;
  int64_t linear_params = 0, layer_params = 2 * config.hidden_size;  // a layer's: its norms, then its linears
  uint64_t quantized_bytes = 0;
  for (const auto& module : linear_module_names()) {
    auto [out, in] = linear_shape(config, module);
    linear_params += out * in * frozen_layers;
    layer_params += out * in;
    // HQQ keeps nothing beside its segments; its zero points and scales are 16-bit in any dtype.
    const uint64_t bytes = hqq_bits == 0 ? nf4_tensor_bytes(out * in, true)
                                         : stored_bytes(quantized_linear_format(hqq_bits, DType::BF16), out * in);
    quantized_bytes += bytes * static_cast<uint64_t>(frozen_layers);
  }
  for (const auto& module : lora_targets) {
    auto [out, in] = linear_shape(config, module);
    f.lora_params += (lora_rank * (in + out) + (dora ? out : 0)) * config.num_hidden_layers;
  }
  if (quantized) {
    f.quantized_params = linear_params;
    f.quantized_bytes = quantized_bytes;
    f.bf16_base_params = f.params.total - linear_params;
  } else {
    f.bf16_base_params = f.params.total;
  }
  f.bf16_bytes = static_cast<uint64_t>(f.bf16_base_params) * 2;
  f.trainable_params = trainable_base ? f.params.total : f.lora_params + new_blocks * layer_params;
  f.trainable_fp32_bytes = static_cast<uint64_t>(f.trainable_params) * 4;
  return f;
}

}  // namespace fsdpq
