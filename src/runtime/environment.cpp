#include "runtime/environment.h"

#include <algorithm>
#include <cstdlib>

#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {

const std::vector<EnvironmentKnob>& environment_knobs() {
  static const std::vector<EnvironmentKnob> knobs = {
      {"FSDPQ_SHARE_GPUS", {"0", "1"}, "let several ranks share a GPU"},
      {"FSDPQ_COLLECTIVES", {"nccl", "mpi"}, "the transport of the collectives over GPU memory"},
      {"FSDPQ_ATTENTION", {"auto", "mma", "simt", "cudnn", "cudnn-nondeterministic", "wgmma"}, "the GPU attention kernels"},
      {"FSDPQ_SECTION_TIMES", {"0", "1"}, "log the compute stream's time per section of the pass"},
      {"FSDPQ_LORA_KERNELS", {"auto", "separate", "fused"}, "the GPU kernels of LoRA adapters with dropout"},
      {"FSDPQ_DORA_NORM", {"direct", "expanded"}, "how the GPU computes DoRA's weight norms"},
      {"FSDPQ_LORA_RANK_SLOTS", {"1", "0"}, "on Hopper, LoRA ranks other than 64 run the wgmma kernels as slots of rank 64 (1, the default), or take the mma kernels or separate products (0)"},
      {"FSDPQ_LORA_FOLD", {"0", "1"}, "fold the LoRA B products into their base GEMMs (quantised bases): one rounding"},
      {"FSDPQ_GEMM_ACCUMULATE", {"output-type", "pedantic"}, "how cuBLAS adds a product into a 16-bit output: the product rounded before C is added (fast), or one rounding of the sum (COMPUTE_32F_PEDANTIC, ~24x slower)"},
      {"FSDPQ_DEQUANTIZE_STREAM", {"side", "compute"}, "the GPU stream that makes a layer's quantised weights dense"},
      {"FSDPQ_ADAPTER_STREAM", {"normal", "high", "off"}, "the stream of the LoRA adapters' dB, d(xa) and dA in backward: a side stream of this priority beside the base GEMMs, or off (the compute stream); the same bits"},
      {"FSDPQ_HQQ_SOLVER", {"auto", "cpu", "gpu"}, "where HQQ's quantisation solver runs (the same bytes either way)"},
      {"FSDPQ_GRADIENTS_IN_STATE", {"1", "0"}, "one GPU: the model accumulates a zero gradient shard's gradients in place (the same bits)"},
      {"FSDPQ_FUSED_COMPUTE_COPIES", {"1", "0"}, "state on the GPU: the optimizer's pass also writes the unit's compute copies (the same bits)"},
  };
  return knobs;
}

void check_environment(const std::function<const char*(const char*)>& get) {
  for (const EnvironmentKnob& knob : environment_knobs()) {
    const char* value = get(knob.name.c_str());
    if (value == nullptr || *value == '\0') continue;
    if (std::find(knob.values.begin(), knob.values.end(), value) != knob.values.end()) continue;
    fail("environment: {} = '{}' is not a value it takes (expected {}; {}); unset it for the default", knob.name,
         value, join(knob.values, " or "), knob.meaning);
  }
}

void check_environment() {
  check_environment([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

}  // namespace fsdpq
