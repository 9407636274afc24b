#include "model/footprint.h"

namespace fsdpq {

uint64_t nf4_tensor_bytes(int64_t numel, bool double_quant) {
  const uint64_t n = static_cast<uint64_t>(numel);
  const uint64_t blocks = (n + 63) / 64;
  const uint64_t codes = (n + 1) / 2;
  if (!double_quant) return codes + blocks * 4;
  const uint64_t absmax_blocks = (blocks + 255) / 256;
  return codes + blocks /* uint8 absmax */ + absmax_blocks * 4 /* fp32 scales */ + 4 /* offset */;
}

ModelFootprint model_footprint(const LlamaConfig& config, bool quantized, bool trainable_base, int64_t lora_rank,
                               const std::vector<std::string>& lora_targets) {
  ModelFootprint f;
  f.params = count_params(config);
  int64_t linear_params = 0;
  uint64_t nf4 = 0;
  for (const auto& module : linear_module_names()) {
    auto [out, in] = linear_shape(config, module);
    linear_params += out * in * config.num_hidden_layers;
    nf4 += nf4_tensor_bytes(out * in, true) * static_cast<uint64_t>(config.num_hidden_layers);
  }
  for (const auto& module : lora_targets) {
    auto [out, in] = linear_shape(config, module);
    f.lora_params += lora_rank * (in + out) * config.num_hidden_layers;
  }
  if (quantized) {
    f.quantized_params = linear_params;
    f.nf4_bytes = nf4;
    f.bf16_base_params = f.params.total - linear_params;
  } else {
    f.bf16_base_params = f.params.total;
  }
  f.bf16_bytes = static_cast<uint64_t>(f.bf16_base_params) * 2;
  f.trainable_params = trainable_base ? f.params.total : f.lora_params;
  f.trainable_fp32_bytes = static_cast<uint64_t>(f.trainable_params) * 4;
  return f;
}

}  // namespace fsdpq
