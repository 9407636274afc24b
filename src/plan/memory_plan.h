// The memory planner (`fsdpq plan`, docs/planner.md): per-GPU and per-host bytes of a training
// run predicted from the model's shape, counting the tensors fsdpq itself allocates — frozen
// weights by kind, LoRA / trainable parameters, fp32 masters, gradients and optimizer state, the
// units gathered for compute, the activations of one training pass (with or without
// checkpointing), and fixed overheads stated as constants. Pure functions: no file, no device.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "fsdp/sharding_strategy.h"
#include "model/llama_config.h"
#include "optim/optimizer.h"
#include "util/dtype.h"

namespace fsdpq {

struct TrainConfig;

// The CUDA context, cuBLAS handles and workspace of one GPU rank, which the caching allocator
// never sees (H200, CUDA 12: ~0.5 GiB resident before the first tensor).
inline constexpr int64_t kCudaContextBytes = int64_t{512} << 20;
// Reserved above allocated: blocks cached by the caching allocator for reuse (the 7B run
// measured 7.99 vs 7.94 GiB); the fit test adds this fraction of the peak.
inline constexpr double kAllocatorSlack = 0.03;
// One rank's process outside its tensors: binary, libraries, MPI, the CUDA driver's host side.
inline constexpr int64_t kHostProcessBytes = int64_t{1} << 30;

// What the practical guide changes between its steps.
struct PlanSetting {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  bool gradient_checkpointing = true;
  bool cpu_offload = false;
  bool activation_offload = false;  // checkpointed layer inputs kept in host memory
  int64_t batch_size = 1;
  int64_t checkpoint_every = 1;  // with checkpointing: every k-th layer recomputed, the rest kept
  int64_t keep_activation_layers = 0;  // with checkpointing: the last n layers never recomputed
  bool recompute_elementwise = false;  // kept layers recompute n1, n2, h (model/llama_layer.h)
  int64_t keep_dequantized_layers = 0;  // the last k layers keep their dense base weights (model/llama_model.h)
};

struct PlanInput {
  LlamaConfig model;        // the model that trains (with Llama-Pro's new blocks)
  bool quantized = true;    // quantised base linears: NF4 (qlora) or HQQ (hqq_lora)
  int hqq_bits = 0;         // HQQ of this many bits (n_bits); 0: NF4
  bool train_base = false;  // full fine-tuning
  int64_t new_blocks = 0;   // Llama-Pro: of model's layers, this many are new blocks (bf16, trainable)
  int64_t lora_rank = 64;
  std::vector<std::string> lora_targets;  // q_proj ... down_proj
  double lora_dropout = 0.1;
  bool dora = false;  // DoRA adapters (bnb_dora, hqq_dora): magnitudes, their saved tensors and norm scratch
  DType activation = DType::BF16;  // activation_dtype(precision)
  OptimizerKind optimizer = OptimizerKind::adamw;
  int64_t context_length = 512;  // tokens per sequence (batches padded to it: the worst case)
  int world_size = 1;            // ranks = GPUs
  int ranks_per_node = 0;        // 0: every rank on one node
  bool on_gpu = true;            // false: the CPU backend (everything in host memory, no rounding)
  // The trainer's engine allocates a unit's fp32 gradients at its backward and frees them once
  // reduced; false: a bare LlamaModel, whose gradients exist all the time (tests).
  bool grads_per_unit = true;
  PlanSetting setting;
};

// Bytes of the activations of one training pass on its compute device, each tensor as fsdpq
// allocates it (rounded to the caching allocator's granules on the GPU).
struct ActivationBytes {
  int64_t layer = 0;            // one LayerActivations (n1 … h, xa, lse, rstd; n1, n2, h not with
                                // recompute_elementwise)
  int64_t checkpointed_xa = 0;  // the recomputed layers' xa (LayerActivations::xa_kept), but for the one
                                // kept_layers counts
  int64_t shared_elementwise = 0;  // recompute_elementwise: the buffers the layers share for n1 / n2, h
  int64_t kept_layers = 0;      // LayerActivations alive: L without checkpointing, else the layers not
                                // recomputed + the one buffer the recomputed share
  int64_t stream = 0;           // the residual stream: L + 1 layer inputs (+ the token ids)
  int64_t stream_on_device = 0; // of which on the compute device (activation offload: at most 3 at a
                                // time, model/activation_offload.h)
  int64_t offloaded = 0;        // activation offload: in host memory, the layer inputs (all but the last)
                                // and some layers' att, lse, x2 (CheckpointPolicy::offloads_attention_output)
  int64_t offload_spare = 0;    // activation offload: the att, lse, x2 a copy moves beyond those the layers hold
  int64_t kept_offloaded = 0;   // activation offload: of kept_layers × layer, the att, lse, x2 in host memory
  int64_t dequantized = 0;      // one layer's NF4 weights made dense, and keep_dequantized_layers
                                // more (all kept between passes)
  int64_t rope = 0;             // cos / sin tables (kept between passes)
  int64_t lm_head = 0;          // final norm output, its rstd, d_normed and one chunk of logits
  int64_t grad_scratch = 0;     // LayerGradScratch + d_resid + the recompute's output + final rstd
  int64_t op_temporary = 0;     // the largest buffer an op allocates for itself (LoRA dropout, GEMM casts)
  int64_t unit_grads = 0;       // fp32 gradients of the unit in backward (layer + root)
  int64_t forward_peak = 0, head_peak = 0, backward_peak = 0;
  int64_t peak = 0;             // the largest of the three phases (rope and dequantized included)
  int64_t transient_peak = 0;   // peak minus what stays between passes (rope, dequantized)
};

struct MemoryItem {
  std::string what;
  int64_t gpu = 0;   // per GPU
  int64_t host = 0;  // per rank
};

struct MemoryPrediction {
  int shard_size = 1;  // ranks a unit is split over (1: resident)
  std::vector<MemoryItem> items;  // at the peak, what lives where
  ActivationBytes activations;
  int64_t gpu_after_load = 0;   // allocated once the model is placed (what fsdp_qlora prints after load)
  int64_t gpu_peak = 0;         // peak allocated during a step
  int64_t gpu_required = 0;     // peak × (1 + slack) + CUDA context: what the card must have
  int64_t host_per_rank = 0;    // peak resident of one rank, process overhead included
  int64_t host_per_node = 0;    // ranks on a node × host_per_rank
  int ranks_per_node = 1;
};

// A run's settings (train_type, LoRA, precision, optimizer, context, sharding, checkpointing,
// offload, batch size) on `world_size` GPUs; `model` is the checkpoint's config (Llama-Pro's
// expansion is applied here).
PlanInput plan_input_from(const TrainConfig& config, const LlamaConfig& model, int world_size);

ActivationBytes activation_bytes(const PlanInput& input);
MemoryPrediction predict_memory(const PlanInput& input);

// The practical guide of fsdp_qlora's benchmark report, one step after another.
struct GuideStep {
  std::string name;  // "DDP", "+ gradient checkpointing", ...
  PlanSetting setting;   // batch_size: the largest that fits (or 1 when none does)
  bool fits = false;
  MemoryPrediction prediction;  // at that batch size
};

struct GuideResult {
  std::vector<GuideStep> steps;
  int recommended = -1;  // index of the first step that fits, -1 when none does
};

// Walks DDP → + gradient checkpointing → shard_grad_op → full_shard → CPU offload → activation
// offload; at each step the largest batch size of 1, 2, 4 … max_batch whose gpu_required fits in
// gpu_bytes and whose host_per_node fits in host_bytes (0: host not checked).
GuideResult walk_guide(const PlanInput& base, int64_t gpu_bytes, int64_t host_bytes, int64_t max_batch);

// The most layers `input` (a quantised base) may keep dense (keep_dequantized_layers) with its
// gpu_required within gpu_bytes, up to every layer; 0 when none fits more or the base is dense.
// Memory grows with the count, so the search stops at the first that fits, from the most down.
int64_t most_kept_dense_layers(PlanInput input, int64_t gpu_bytes);

// The most of the last layers `input` (with checkpointing) may leave unrecomputed
// (keep_activation_layers) with its GPU figure within gpu_bytes; 0 where none fits.
int64_t most_kept_activation_layers(PlanInput input, int64_t gpu_bytes);

}  // namespace fsdpq
