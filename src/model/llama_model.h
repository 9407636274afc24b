// The Llama decoder with LoRA adapters over a frozen bf16 or NF4 base (or, for full fine-tuning,
// a trainable base), written once over the ops of src/ops/: explicit forward and backward per
// decoder layer, activation checkpointing, cross-entropy loss, and a KV-cached inference path.
// The model knows nothing of sharding or the training loop: it exposes its trainable
// parameters as flat fp32 masters + gradients that the trainer (and later FSDP) steps.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/side_stream.h"
#include "backend/tensor.h"
#include "data/collate.h"
#include "io/model_files.h"
#include "model/checkpoint_policy.h"
#include "model/llama_config.h"
#include "model/precision.h"

namespace fsdpq {


struct ModelOptions {
  bool quantize_base = true;  // quantised base linears: NF4 (bitsandbytes layout, double-quantised absmax) or HQQ
  int hqq_bits = 0;           // HQQ base linears of this many bits (hqq_lora's n_bits); 0: NF4
  bool train_base = false;    // full fine-tuning: every weight trains (fp32 masters)
  // Llama-Pro (model/block_expansion.h): decoder layers added to the checkpoint's, every weight of
  // theirs trainable (fp32 masters), the only weights that train; 0: none.
  int64_t llama_pro_new_blocks = 0;
  int64_t lora_rank = 64;
  double lora_alpha = 16;
  double lora_dropout = 0.1;
  std::vector<std::string> lora_targets;  // q_proj ... down_proj; empty: no adapters
  bool use_dora = false;  // DoRA (bnb_dora, hqq_dora): each adapter also trains a magnitude vector (ops/dora.h)
  Precision precision = Precision::BF16;
  bool gradient_checkpointing = true;
  // With gradient_checkpointing: layers i with i % checkpoint_every == 0 are recomputed in backward,
  // except the last keep_activation_layers; the others keep their activations from the forward
  // (model/checkpoint_policy.h).
  int64_t checkpoint_every = 1;
  int64_t keep_activation_layers = 0;
  CheckpointPolicy checkpoint_policy() const {
    return CheckpointPolicy{gradient_checkpointing, checkpoint_every, keep_activation_layers};
  }
  // The layers that keep their activations drop the two norm outputs and the SwiGLU product and
  // recompute them in the backward (model/llama_layer.h, ElementwiseScratch): the same bits, ~30%
  // less activation memory per kept layer for two RMSNorms and a SwiGLU each.
  bool recompute_elementwise = false;
  // Training passes: the last keep_dequantized_layers layers make their quantised base weights dense
  // into buffers of their own in the forward, and their backward reads them there instead of
  // dequantising again (the buffers stay allocated between steps). 0: every pass dequantises into
  // the one layer's buffers the layers share.
  int64_t keep_dequantized_layers = 0;
  // use_activation_cpu_offload (with checkpointing): each layer's input, kept for its backward,
  // waits in host memory between the layer's forward and backward instead of on the device.
  bool activation_offload = false;
  uint64_t seed = 42;  // LoRA A init and dropout masks
};

// One trainable tensor: the fp32 master the optimizer steps and its fp32 gradient (same shape).
// `name` is the PEFT / HF name, e.g. "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
// for an adapter, or "model.layers.0.self_attn.q_proj.weight" for full fine-tuning.
struct TrainableParameter {
  std::string name;
  Tensor* master = nullptr;  // F32
  Tensor* grad = nullptr;    // F32, accumulated by forward_backward
};

struct LossSum {
  double loss_sum = 0;  // summed over counted tokens
  int64_t tokens = 0;   // tokens the loss counted (labels != -100 after the shift)
  double mean() const { return tokens ? loss_sum / static_cast<double>(tokens) : 0.0; }
};

// Cached keys and values for generation, one [max_tokens, kv_heads, head_dim] block per layer.
struct KvCache {
  int64_t max_tokens = 0;
  int64_t length = 0;  // tokens already in the cache
  std::vector<Tensor> keys, values;
};

struct ParamUnit;  // model/llama_weights.h: the tensors of one FSDP unit

// How sharding hooks into a pass without the model knowing more of it (torchtitan's rule): the
// model announces when each unit (kRootUnit, then layer_unit(i)) is about to be used and when it is
// done with it. Forward runs root, layers 0..L-1; backward layers L-1..0, then the root ends.
// The root is special: in a training pass its backward begins before the loss (the head's
// gradient is computed with it) and it gets no forward_end; other passes end it after the head.
// Where the GPU makes a layer's quantised base weights dense: Side (the default), on a stream
// beside the compute stream, overlapping the products (docs/model.md, "NF4"); Compute, in line.
// The same bits either way. The environment's FSDPQ_DEQUANTIZE_STREAM (side, compute) sets it at
// start-up; tests set it here.
enum class GpuDequantizeStream { Side, Compute };
GpuDequantizeStream gpu_dequantize_stream();
void set_gpu_dequantize_stream(GpuDequantizeStream stream);
// Where the GPU runs a layer's LoRA dB, d(xa) and dA products in backward (LayerCompute::
// adapter_stream, model/llama_layer.h): on a side stream of this priority (the default: Normal),
// beside the base input-gradient GEMMs and the rest of the layer, which fill the SMs those leave
// idle; nullopt, on the compute stream. The same bits either way (bench/RESULTS.md, stop 49: +1.1%
// on the 7B step). The environment's FSDPQ_ADAPTER_STREAM (normal, high, off) sets it at start-up;
// tests set it here.
std::optional<StreamPriority> gpu_adapter_stream();
void set_gpu_adapter_stream(std::optional<StreamPriority> priority);
// Whether each group (q/k/v, o, gate/up, down) folds its LoRA adapters' B products into the base
// GEMMs where every module of the group is plain LoRA on a quantised base (LayerCompute,
// model/llama_layer.h; the same values up to rounding, on every device). On by default: on the GPU
// it is the one way base + adapter round once at full speed (cuBLAS's in-place accumulate rounds
// the product first, cuda_ops.h's GemmAccumulate); its speed against the separate products is in
// bench/RESULTS.md (stop 38). The environment's FSDPQ_LORA_FOLD (0, 1) sets it at start-up; tests
// set it here.
bool lora_fold();
void set_lora_fold(bool fold);

class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void forward_begin(int unit) = 0;  // the unit's weights must be present on return
  // `backward_follows`: a training pass will come back to this unit's backward.
  virtual void forward_end(int unit, bool backward_follows) = 0;
  virtual void backward_begin(int unit) = 0;  // weights present, gradient tensors allocated
  virtual void backward_end(int unit) = 0;    // the unit's gradients of this micro-batch are complete
  // True when no unit's frozen weights ever move or change between its hooks (one rank, nothing
  // offloaded): the model may then read a unit's frozen bytes ahead of its forward_begin, as the
  // GPU's dequantisation does to overlap the layer before (model/llama_model.cpp).
  virtual bool frozen_weights_stay_in_place() const { return false; }
};

using UnitBuiltCallback = std::function<void(int unit, ParamUnit& contents)>;
// A loader that builds units itself from a skeleton and a reader of any element range of their
// tensors (model/llama_weights.h): a sharded loader reads only its shard of each unit.
class UnitReader;
using UnitLoader = std::function<void(int unit, ParamUnit& skeleton, const UnitReader& reader)>;

class LlamaModel {
 public:
  // Base weights from an HF directory (bf16/f16/f32 tensors; quantised to NF4 on load when
  // options.quantize_base), expanded by options.llama_pro_new_blocks (config() is the expanded one). Adapters start as PEFT initialises them (A kaiming-uniform, B zero).
  // With `on_unit_built`, each unit is handed over as soon as it is complete (a sharded loader
  // keeps its shard of it and frees the rest).
  static LlamaModel load(const LlamaConfig& config, const ModelWeights& weights, const ModelOptions& options,
                         const UnitBuiltCallback& on_unit_built = {});
  // A random-initialised preset, with exactly the values `fsdpq init-model --seed init_seed`
  // would write (so a preset and its init-model directory train identically).
  static LlamaModel random(const LlamaConfig& config, uint64_t init_seed, const ModelOptions& options,
                           const UnitBuiltCallback& on_unit_built = {});
  // The same models, each unit built by `load_unit` (which keeps what it builds: the model's
  // tensors stay unallocated until its unit hooks fill them).
  static LlamaModel load(const LlamaConfig& config, const ModelWeights& weights, const ModelOptions& options,
                         const UnitLoader& load_unit);
  static LlamaModel random(const LlamaConfig& config, uint64_t init_seed, const ModelOptions& options,
                           const UnitLoader& load_unit);

  LlamaModel(LlamaModel&&) noexcept;
  LlamaModel& operator=(LlamaModel&&) noexcept;
  ~LlamaModel();

  const LlamaConfig& config() const;
  const ModelOptions& options() const;

  // One training micro-batch: forward, loss, backward. Gradients are ADDED to the trainable
  // parameters' grad tensors, scaled so that the loss they differentiate is
  // loss_scale * (loss_sum / normalizer) — the trainer passes the token count of the whole
  // optimizer step as normalizer, so accumulation over micro-batches gives the step's mean.
  // `step_key` makes dropout differ per (step, micro-batch); returns the unscaled loss sum.
  LossSum forward_backward(const data::Batch& batch, double normalizer, float loss_scale, uint64_t step_key);
  // Forward and loss only (no dropout, no gradients): evaluation.
  LossSum evaluate(const data::Batch& batch);
  // Forward only: logits [B, T, vocab] in fp32 (tests and parity checks).
  Tensor logits(const data::Batch& batch);

  // Sharding: the units' tensors (pointers stay valid while the model lives), and the hooks a
  // pass calls (nullptr, the default: every weight is always present).
  std::vector<ParamUnit> param_units();
  int num_units() const;
  void set_unit_hooks(UnitHooks* hooks);

  // Moves what the ops read (frozen weights, NF4 bytes, compute copies) to `device` and runs
  // every later pass there (activations included). Loading always builds on the host; the
  // trainer places the model on its GPU once sharding has taken its share.
  void place_on(Device device);
  Device device() const;

  std::vector<TrainableParameter> trainable_parameters();
  void zero_grads();
  // After the optimizer updated the masters: refresh the compute copies (bf16, or NF4 never).
  void masters_updated();

  // LoRA adapters as PEFT names them → fp32 tensors (for export), and loading them back.
  std::vector<std::pair<std::string, const Tensor*>> adapter_tensors() const;
  void load_adapter_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors);

  // Generation: fills the cache with `tokens` (prefill) or appends one token (decode) and
  // returns the fp32 logits of the last position [vocab].
  KvCache make_cache(int64_t max_tokens) const;
  std::vector<float> forward_cached(const std::vector<int32_t>& tokens, KvCache& cache);

  struct Impl;

 private:
  explicit LlamaModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdpq
