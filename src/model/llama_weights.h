// The weights of a LlamaModel as it holds them (private to src/model/llama_*.cpp): every tensor
// of the HF checkpoint as a frozen weight in a storage format (quant/frozen_storage.h: dense, or
// NF4 under QLoRA, HQQ under hqq_lora) or a trainable fp32 master with its gradient and compute copy, plus the LoRA
// adapters. Built unit by unit from a WeightSource (an HF directory or the init-model generator)
// through one unit build (model/unit_build.h), so no second copy of the model ever exists while
// loading.
#pragma once
#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/tensor.h"
#include "io/model_files.h"
#include "model/llama_config.h"
#include "model/llama_model.h"
#include "quant/frozen_storage.h"

namespace fsdpq {

// The seven linear modules of a decoder layer, in HF order.
enum LinearModule : int { kQProj, kKProj, kVProj, kOProj, kGateProj, kUpProj, kDownProj };
inline constexpr int kLinearModules = 7;
const char* linear_module_name(int module);   // "q_proj"
const char* linear_module_group(int module);  // "self_attn" or "mlp"

// How quantised base linears are stored: NF4 with double-quantised absmax (qlora; hqq_bits 0) or
// HQQ of hqq_bits bits (hqq_lora), its zero points and scales in fsdp_qlora's compute dtype for
// the activation dtype: bf16, or fp16 (fp16_autocast; fp32, whose compute dtype fsdp_qlora sets
// to fp16). The model, the planner and the footprint all ask here.
const FrozenFormat& quantized_linear_format(int hqq_bits, DType activation);

// An fp32 master the optimizer steps, its fp32 gradient, and the copy the ops compute with.
struct TrainableTensor {
  std::string name;  // HF or PEFT name
  Shape shape;       // also known when the tensors are not allocated (a unit built by shards)
  Tensor master;     // F32
  Tensor grad;       // F32, same shape
  Tensor compute;    // activation dtype; left undefined when that is F32 (the master is used)

  TensorView compute_view() const { return compute.defined() ? compute.view() : master.view(); }
  // Rounds the master into the compute copy (after the optimizer or a load changed it).
  void refresh_compute();
  // Moves the tensors the ops compute with (the compute copy, or an fp32 master used directly)
  // and the gradient to `device`; an fp32 master beside a compute copy stays on the host.
  void place_on(Device device);
};

// One base weight of the checkpoint: frozen (its bytes in a storage format: dense, or NF4 under
// QLoRA) or trainable (full fine-tuning); exactly one of the two is set.
struct BaseWeight {
  std::string name;  // HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
  Shape shape;
  FrozenStorage frozen;                        // a frozen weight (defined() false when trainable)
  std::unique_ptr<TrainableTensor> trainable;  // full fine-tuning

  // Puts what the ops read on `device`: the frozen bytes (FrozenStorage::place_on), or the
  // trainable tensor's compute copy.
  void place_on(Device device);

  // The dense weight to compute with: a trainable's compute copy, a dense frozen weight in place,
  // or a quantised one dequantised into `scratch` in `dtype` (FrozenStorage::dense).
  TensorView dense(Tensor& scratch, DType dtype) const;
  // The fp32 gradient, or an empty view (data == nullptr) for a frozen weight.
  TensorView grad_view() const { return trainable ? trainable->grad.view() : TensorView{}; }
};

// PEFT LoRA on one linear: A [r, in] (kaiming-uniform), B [out, r] (zero); under DoRA also the
// magnitude m [out], initialised to the rows' norms of the (dequantised) base weight (ops/dora.h).
struct LoraAdapter {
  std::string prefix;  // "base_model.model.model.layers.0.self_attn.q_proj"
  TrainableTensor A, B;
  std::unique_ptr<TrainableTensor> magnitude;  // DoRA's "….lora_magnitude_vector"; null for LoRA

  // A, B and (DoRA) the magnitude, in PEFT's order.
  std::vector<TrainableTensor*> tensors();
  std::vector<const TrainableTensor*> tensors() const;
};

struct LayerWeights {
  BaseWeight input_norm, post_norm;
  std::array<BaseWeight, kLinearModules> linear;
  std::array<std::unique_ptr<LoraAdapter>, kLinearModules> lora;  // null where no adapter
};

// The weights sharding moves as one piece (an FSDP unit): unit 0 is the root (embedding, final
// norm, head: present for a whole step, as FSDP's root unit), unit i > 0 is decoder layer i - 1.
// `frozen` are the frozen base weights (any storage format), `trainable` every trainable tensor.
struct ParamUnit {
  std::string name;  // "root" or "layer 3"
  std::vector<BaseWeight*> frozen;
  std::vector<TrainableTensor*> trainable;
};
inline constexpr int kRootUnit = 0;
inline int layer_unit(int64_t layer) { return static_cast<int>(layer) + 1; }

struct LlamaWeights {
  DType activation = DType::BF16;
  BaseWeight embedding;
  std::vector<LayerWeights> layers;
  BaseWeight final_norm;
  BaseWeight lm_head;  // unused (name empty) when the head is tied to the embedding
  bool tied_head = false;

  const BaseWeight& head() const { return tied_head ? embedding : lm_head; }
  // Every trainable tensor in a fixed order: HF order for full fine-tuning, then per layer and
  // module (HF order) each adapter's A, B (and DoRA's magnitude).
  std::vector<TrainableTensor*> trainables();
  std::vector<LoraAdapter*> adapters();
  // The units in order (root first, then the layers); pointers into this object.
  std::vector<ParamUnit> units();
  ParamUnit unit(int index);
  // Every weight and adapter's compute tensors to `device` (see BaseWeight::place_on).
  void place_on(Device device);
};

// Fills `out` (F32, BF16 or F16) with elements [first, first + out.numel()) of HF tensor `spec`
// (flat, row-major), which is entry `spec_index` of hf_tensor_specs(config). A whole tensor is
// first = 0 with `out` of the spec's shape; a sharded loader asks for its part only.
using WeightSource =
    std::function<void(const TensorSpec& spec, size_t spec_index, int64_t first, TensorView out)>;
// Reads the tensor from an HF directory (BF16, F16 or F32 files), checking its shape.
WeightSource file_weight_source(const ModelWeights& files);
// The values `fsdpq init-model --seed seed` writes: Normal(0, stddev) per tensor stream, norms 1.
WeightSource random_weight_source(uint64_t seed, float stddev);

// Called once a unit's tensors are all built (the layers in order, the root last), while the
// others may not exist yet: the engine keeps what it needs of it, so no more than one unit of the
// model need ever be whole in memory.
using UnitBuilt = std::function<void(int unit, ParamUnit& contents)>;

// Validates the options (fails with the option's name) and builds every weight and adapter of the
// model of `config` (the checkpoint's) expanded by options.llama_pro_new_blocks, whole: build_llama_weights_by_unit with build_whole_unit (model/unit_build.h) as the loader.
LlamaWeights build_llama_weights(const LlamaConfig& config, const ModelOptions& options, const WeightSource& source,
                                 const UnitBuilt& on_unit_built = {});

// What a unit is built from (model/unit_build.h), whole or only part of it (a rank of a shard
// group reads and quantises only its shard): the initial values of any element range of its tensors.
class UnitReader {
 public:
  virtual ~UnitReader() = default;
  // The dtype a frozen weight's values come in: what is quantised to NF4, or what a dense weight
  // is stored as.
  virtual DType frozen_dtype(const BaseWeight& weight) const = 0;
  // Elements [first, first + count) of a frozen weight in frozen_dtype(weight).
  virtual void read_frozen(const BaseWeight& weight, int64_t first, int64_t count, void* out) const = 0;
  // Elements [first, first + count) of a trainable tensor's initial fp32 master.
  virtual void read_master(const TrainableTensor& tensor, int64_t first, int64_t count, float* out) const = 0;
};

// Builds the weights as skeletons — every name and shape, frozen weights with their storage
// format but no bytes, trainables and adapters without tensors — and hands each unit to
// `load_unit` (the layers in order, then the root), which fills what it keeps. `config` and
// `source` are the checkpoint's; with options.llama_pro_new_blocks the weights are those of the
// expanded model (model/block_expansion.h), its new blocks trainable and every other weight frozen.
LlamaWeights build_llama_weights_by_unit(const LlamaConfig& config, const ModelOptions& options,
                                         const WeightSource& source, const UnitLoader& load_unit);

}  // namespace fsdpq
