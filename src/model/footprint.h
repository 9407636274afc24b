// How many parameters of each kind a run has and how many bytes they take: the model report of
// the dry run, and later the memory planner's starting point.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/llama_config.h"

namespace fsdpq {

struct ModelFootprint {
  ParamCounts params;
  int64_t quantized_params = 0;  // linear weights stored quantised (NF4 under qlora, HQQ under hqq_lora)
  int64_t bf16_base_params = 0;  // frozen or trainable weights kept in bf16
  int64_t lora_params = 0;       // LoRA A and B (and DoRA's magnitudes)
  int64_t trainable_params = 0;
  uint64_t quantized_bytes = 0;  // their bytes: NF4 codes + absmax, or HQQ codes + zero points + scales
  uint64_t bf16_bytes = 0;       // base weights kept in bf16
  uint64_t trainable_fp32_bytes = 0;  // fp32 master copies of what trains
};

// `quantized`: base linear weights in NF4 (blocksize 64, double-quantised absmax, as fsdp_qlora),
// or in HQQ of `hqq_bits` bits when that is not 0; `lora_rank` 0 and empty targets for full
// fine-tuning. `new_blocks`: of config's layers, this many are Llama-Pro's new blocks (bf16, every
// weight trainable) and only they train. `dora`: each adapter also trains a magnitude vector of its
// linear's output width.
ModelFootprint model_footprint(const LlamaConfig& config, bool quantized, int hqq_bits, bool trainable_base,
                               int64_t new_blocks, int64_t lora_rank, const std::vector<std::string>& lora_targets,
                               bool dora = false);

// Bytes of one NF4 tensor of `numel` weights with bitsandbytes' blocksize 64 and, when
// double_quant, its absmax quantised to 8 bits in blocks of 256 (+ one fp32 scale per block and the offset).
uint64_t nf4_tensor_bytes(int64_t numel, bool double_quant);

}  // namespace fsdpq
