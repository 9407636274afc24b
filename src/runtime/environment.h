// The environment variables that change what fsdpq does, checked once at start-up: a mistyped
// value is an error naming the variable and what it takes, not a setting silently ignored.
// (FSDPQ_INJECT_FAULT, the tests' fault injection, checks its own value.)
//   FSDPQ_SHARE_GPUS     0 | 1          let ranks share GPUs (runtime/gpu.h)
//   FSDPQ_COLLECTIVES    nccl | mpi     the GPU-memory collectives' transport (fsdp/device_collectives.h)
//   FSDPQ_ATTENTION      auto | mma | simt | cudnn | cudnn-nondeterministic | wgmma
//                                       the GPU attention kernels (ops/attention.h)
//   FSDPQ_SECTION_TIMES  0 | 1          per-section timing of the pass (backend/section_times.h)
//   FSDPQ_LORA_KERNELS   auto | separate | fused  LoRA with dropout on the GPU (ops/lora.h)
//   FSDPQ_HQQ_SOLVER     auto | cpu | gpu  where HQQ's solver runs (quant/hqq_solve.h)
//   FSDPQ_DORA_NORM      direct | expanded  DoRA's weight norms on the GPU (ops/dora.h)
//   FSDPQ_LORA_RANK_SLOTS  1 | 0        on Hopper, other LoRA ranks than 64 as rank-64 slots of the
//                                       wgmma kernels (ops/cuda/lora_fused.cpp; 1, the default)
//   FSDPQ_LORA_FOLD      1 | 0          fold the LoRA B products into the base GEMMs on quantised
//                                       bases (model/llama_model.h; 1, the default)
//   FSDPQ_GEMM_ACCUMULATE  output-type | pedantic  cuBLAS's accumulate into 16 bits: fast, or one
//                                       rounding at ~24x the time (ops/cuda_ops.h, GemmAccumulate)
//   FSDPQ_DEQUANTIZE_STREAM  side | compute  where the GPU dequantises a layer's base weights
//                                       (model/llama_model.cpp: side overlaps it with the products)
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace fsdpq {

struct EnvironmentKnob {
  std::string name;
  std::vector<std::string> values;  // what it accepts; unset and empty mean the default
  std::string meaning;
};

const std::vector<EnvironmentKnob>& environment_knobs();

// Throws UserError for the first knob whose value `get(name)` (nullptr: unset) is not one it
// accepts.
void check_environment(const std::function<const char*(const char*)>& get);
void check_environment();  // the process's environment

}  // namespace fsdpq
