#include "model/llama_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <stdexcept>

#include "backend/cuda_backend.h"
#include "model/block_expansion.h"
#include "model/init_model.h"
#include "model/unit_build.h"
#include "ops/dora.h"
#include "ops/elementwise.h"
#include "ops/lora.h"
#include "optim/lora_init.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

Shape shape_of(const std::vector<int64_t>& dims) {
  Shape s;
  if (dims.size() > static_cast<size_t>(Shape::kMaxRank)) throw std::logic_error("shape_of: rank > 4");
  s.rank = static_cast<int>(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) s.dims[i] = dims[i];
  return s;
}

// Converts `count` values of a safetensors dtype into `out` (F32, BF16 or F16).
void convert_file_values(const std::byte* src, DType src_dtype, TensorView out) {
  const int64_t n = out.numel();
  if (src_dtype == out.dtype) {
    std::memcpy(out.data, src, out.nbytes());
    return;
  }
  auto read = [&](int64_t i) -> float {
    switch (src_dtype) {
      case DType::F32: {
        float f;
        std::memcpy(&f, src + 4 * i, 4);
        return f;
      }
      case DType::BF16: {
        uint16_t b;
        std::memcpy(&b, src + 2 * i, 2);
        return bf16_to_float(b);
      }
      case DType::F16: {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        return f16_to_float(h);
      }
      default: throw std::logic_error("convert_file_values: unsupported dtype");
    }
  };
  if (out.dtype == DType::F32) {
    float* dst = out.as<float>();
#pragma omp parallel for if (n >= (1 << 16)) schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = read(i);
  } else if (out.dtype == DType::F16) {
    uint16_t* dst = out.as<uint16_t>();
#pragma omp parallel for if (n >= (1 << 16)) schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_f16(read(i));
  } else {
    bf16_bits* dst = out.as<bf16_bits>();
#pragma omp parallel for if (n >= (1 << 16)) schedule(static)
    for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(read(i));
  }
}

std::string module_list(const std::vector<std::string>& names) { return join(names, ", "); }

// The NaN and ±Inf values among `n` values of a file dtype: how many, and the first one's index
// (-1 when none). An all-ones exponent marks them in every float format: one branch-free pass.
struct NonFinite {
  int64_t count = 0;
  int64_t first = -1;
};

NonFinite find_non_finite(const std::byte* src, DType dtype, int64_t n) {
  auto scan = [&](auto word, uint64_t exponent) {
    using Word = decltype(word);
    int64_t count = 0, first = n;
#pragma omp parallel for if (n >= (1 << 16)) schedule(static) reduction(+ : count) reduction(min : first)
    for (int64_t i = 0; i < n; ++i) {
      Word w;
      std::memcpy(&w, src + sizeof(Word) * static_cast<size_t>(i), sizeof(Word));
      const bool bad = (w & exponent) == exponent;
      count += bad;
      first = bad && i < first ? i : first;
    }
    return NonFinite{count, count > 0 ? first : -1};
  };
  switch (dtype) {
    case DType::F32: return scan(uint32_t{}, 0x7F800000u);
    case DType::BF16: return scan(uint16_t{}, 0x7F80u);
    case DType::F16: return scan(uint16_t{}, 0x7C00u);
    default: throw std::logic_error("find_non_finite: not a float dtype");
  }
}

void validate_options(const LlamaConfig& config, const ModelOptions& o) {
  if (o.train_base && o.quantize_base)
    fail("full fine-tuning (train_type full) trains every base weight and cannot train NF4-quantised ones: "
         "quantize_base must be off when train_base is on");
  if (o.llama_pro_new_blocks > 0 && (o.train_base || !o.lora_targets.empty()))
    fail("Llama-Pro trains only its new blocks: neither full fine-tuning nor LoRA adapters go with "
         "llama_pro_num_new_blocks = {} (use a LoRA train type for adapters)", o.llama_pro_new_blocks);
  const std::vector<std::string>& known = linear_module_names();
  for (const std::string& target : o.lora_targets) {
    if (std::find(known.begin(), known.end(), target) != known.end()) continue;
    const std::string guess = closest_match(target, known);
    fail("lora_target_modules: unknown module '{}'{}; allowed: {}", target,
         guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess), module_list(known));
  }
  if (!o.train_base && !o.lora_targets.empty()) {
    if (o.lora_rank < 1) fail("lora_rank must be at least 1, got {}", o.lora_rank);
    if (!valid_lora_dropout(o.lora_dropout))
      fail("lora_dropout must be in [0, 1), got {}", o.lora_dropout);
    if (!std::isfinite(o.lora_alpha)) fail("lora_alpha must be a finite number, got {}", o.lora_alpha);
  }
  if (o.use_dora && (o.train_base || o.lora_targets.empty()))
    fail("DoRA decomposes LoRA adapters: it needs lora_target_modules and a frozen base (not train_type full)");
  (void)config;
}

bool is_linear(const std::string& name) {
  return ends_with(name, "_proj.weight");
}

// Values arrive in the activation dtype first, as fsdp_qlora loads the checkpoint in its compute
// dtype before quantising or training it — except under fp16_autocast, where it loads fp32
// (torch_dtype float32) and only the frozen dense weights are kept in half, the dtype autocast
// would cast them to for every matmul.
DType load_dtype(DType activation, const ModelOptions& options, const std::string& name, bool trainable) {
  const bool load_fp32 = activation == DType::F16 && (trainable || (options.quantize_base && is_linear(name)));
  return load_fp32 ? DType::F32 : activation;
}

// How a frozen weight is stored: the linears quantised under QLoRA and hqq_lora, everything else
// dense in the dtype its values are loaded in.
const FrozenFormat& frozen_format(DType activation, const ModelOptions& options, const std::string& name) {
  if (options.quantize_base && is_linear(name)) return quantized_linear_format(options.hqq_bits, activation);
  return dense_format(load_dtype(activation, options, name, /*trainable=*/false));
}

// A frozen weight's storage; a weight its format cannot store (an HQQ width whose packing needs
// more groups than the weight has) is the user's setting to change.
FrozenStorage frozen_storage(DType activation, const ModelOptions& options, const std::string& name, const Shape& shape) {
  const FrozenFormat& format = frozen_format(activation, options, name);
  try {
    return FrozenStorage(format, shape);
  } catch (const std::invalid_argument& e) {
    fail("n_bits = {}: cannot store '{}' ({} values) as {}: {}", options.hqq_bits, name, shape.numel(), format.name(),
         e.what());
  }
}

// Where each HF tensor goes.
std::map<std::string, BaseWeight*> weight_slots(LlamaWeights& w, const LlamaConfig& config) {
  std::map<std::string, BaseWeight*> slots;
  slots["model.embed_tokens.weight"] = &w.embedding;
  slots["model.norm.weight"] = &w.final_norm;
  if (!w.tied_head) slots["lm_head.weight"] = &w.lm_head;
  for (int64_t i = 0; i < config.num_hidden_layers; ++i) {
    LayerWeights& layer = w.layers[static_cast<size_t>(i)];
    const std::string prefix = fmt::format("model.layers.{}.", i);
    slots[prefix + "input_layernorm.weight"] = &layer.input_norm;
    slots[prefix + "post_attention_layernorm.weight"] = &layer.post_norm;
    for (int m = 0; m < kLinearModules; ++m)
      slots[fmt::format("{}{}.{}.weight", prefix, linear_module_group(m), linear_module_name(m))] = &layer.linear[m];
  }
  return slots;
}

// Every base weight of the given decoder layers.
std::set<const BaseWeight*> weights_of_layers(LlamaWeights& w, const std::vector<int64_t>& layers) {
  std::set<const BaseWeight*> out;
  for (int64_t i : layers) {
    LayerWeights& layer = w.layers.at(static_cast<size_t>(i));
    out.insert(&layer.input_norm);
    out.insert(&layer.post_norm);
    for (BaseWeight& linear : layer.linear) out.insert(&linear);
  }
  return out;
}

LlamaWeights empty_weights(const LlamaConfig& config, const ModelOptions& options) {
  LlamaWeights w;
  w.activation = activation_dtype(options.precision);
  w.tied_head = config.tie_word_embeddings;
  w.layers.resize(static_cast<size_t>(config.num_hidden_layers));
  return w;
}

}  // namespace

const FrozenFormat& quantized_linear_format(int hqq_bits, DType activation) {
  if (hqq_bits == 0) return nf4_format(/*double_quant=*/true);
  return hqq_format(hqq_bits, activation == DType::BF16 ? DType::BF16 : DType::F16);
}

const char* linear_module_name(int module) {
  static const char* const names[kLinearModules] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                    "gate_proj", "up_proj", "down_proj"};
  if (module < 0 || module >= kLinearModules) throw std::logic_error("linear_module_name: bad module");
  return names[module];
}

const char* linear_module_group(int module) { return module <= kOProj ? "self_attn" : "mlp"; }

void TrainableTensor::refresh_compute() {
  if (!compute.defined()) return;
  if (compute.device() == master.device()) {
    copy_convert(compute.view(), master.view());
    return;
  }
  Tensor staged = Tensor::empty(compute.shape(), compute.dtype(), master.device());
  copy_convert(staged, master.view());
  copy_tensor(compute, staged);
}

namespace {
void move_tensor(Tensor& t, Device device) {
  if (t.defined() && t.device() != device) t = copy_to(t, device);
}
}  // namespace

void TrainableTensor::place_on(Device device) {
  if (compute.defined()) {
    move_tensor(compute, device);
  } else {
    move_tensor(master, device);
  }
  move_tensor(grad, device);
}

void BaseWeight::place_on(Device device) {
  if (trainable)
    trainable->place_on(device);
  else
    frozen.place_on(device);
}

TensorView BaseWeight::dense(Tensor& scratch, DType dtype) const {
  return trainable ? trainable->compute_view() : frozen.dense(scratch, dtype);
}

void LlamaWeights::place_on(Device device) {
  for (const ParamUnit& u : units()) {
    for (BaseWeight* w : u.frozen) w->place_on(device);
    for (TrainableTensor* t : u.trainable) t->place_on(device);
  }
}

std::vector<TrainableTensor*> LoraAdapter::tensors() {
  std::vector<TrainableTensor*> out = {&A, &B};
  if (magnitude) out.push_back(magnitude.get());
  return out;
}

std::vector<const TrainableTensor*> LoraAdapter::tensors() const {
  std::vector<const TrainableTensor*> out = {&A, &B};
  if (magnitude) out.push_back(magnitude.get());
  return out;
}

std::vector<TrainableTensor*> LlamaWeights::trainables() {
  std::vector<TrainableTensor*> out;
  auto add = [&](BaseWeight& w) {
    if (w.trainable) out.push_back(w.trainable.get());
  };
  add(embedding);
  for (LayerWeights& layer : layers) {
    add(layer.input_norm);
    for (int m = kQProj; m <= kOProj; ++m) add(layer.linear[m]);
    add(layer.post_norm);
    for (int m = kGateProj; m <= kDownProj; ++m) add(layer.linear[m]);
  }
  add(final_norm);
  if (!tied_head) add(lm_head);
  for (LoraAdapter* adapter : adapters())
    for (TrainableTensor* t : adapter->tensors()) out.push_back(t);
  return out;
}

ParamUnit LlamaWeights::unit(int index) {
  ParamUnit u;
  auto add = [&](BaseWeight& w) {
    if (w.name.empty()) return;  // the untied head's slot when the head is tied
    if (w.trainable)
      u.trainable.push_back(w.trainable.get());
    else
      u.frozen.push_back(&w);
  };
  if (index == kRootUnit) {
    u.name = "root";
    add(embedding);
    add(final_norm);
    if (!tied_head) add(lm_head);
    return u;
  }
  if (index < 0 || index > static_cast<int>(layers.size())) throw std::logic_error("LlamaWeights::unit: bad index");
  LayerWeights& layer = layers[static_cast<size_t>(index - 1)];
  u.name = fmt::format("layer {}", index - 1);
  add(layer.input_norm);
  for (int m = kQProj; m <= kOProj; ++m) add(layer.linear[m]);
  add(layer.post_norm);
  for (int m = kGateProj; m <= kDownProj; ++m) add(layer.linear[m]);
  for (auto& adapter : layer.lora)
    if (adapter)
      for (TrainableTensor* t : adapter->tensors()) u.trainable.push_back(t);
  return u;
}

std::vector<ParamUnit> LlamaWeights::units() {
  std::vector<ParamUnit> out;
  for (int i = 0; i <= static_cast<int>(layers.size()); ++i) out.push_back(unit(i));
  return out;
}

std::vector<LoraAdapter*> LlamaWeights::adapters() {
  std::vector<LoraAdapter*> out;
  for (LayerWeights& layer : layers)
    for (auto& adapter : layer.lora)
      if (adapter) out.push_back(adapter.get());
  return out;
}

WeightSource file_weight_source(const ModelWeights& files) {
  return [&files](const TensorSpec& spec, size_t, int64_t first, TensorView out) {
    const TensorInfo* info = files.find(spec.name);
    if (!info) {
      (void)files.bytes(spec.name);  // throws the directory's "not found, did you mean" error
      throw std::logic_error("ModelWeights::bytes did not reject a missing tensor");
    }
    if (info->shape != spec.shape)
      fail("model '{}': tensor '{}' has shape {} but config.json implies {}", files.directory().string(), spec.name,
           shape_of(info->shape).to_string(), shape_of(spec.shape).to_string());
    if (info->dtype != DType::BF16 && info->dtype != DType::F16 && info->dtype != DType::F32)
      fail("model '{}': tensor '{}' is stored as {}; fsdpq loads BF16, F16 or F32 checkpoints", files.directory().string(),
           spec.name, dtype_name(info->dtype));
    const uint64_t element = dtype_size(info->dtype);
    const std::span<const std::byte> bytes =
        files.bytes(spec.name, static_cast<uint64_t>(first) * element, static_cast<uint64_t>(out.numel()) * element);
    // Bytes already in memory: a damaged file (or one saved after training diverged) is refused here,
    // naming the tensor, instead of training (or evaluating) to NaN.
    if (const NonFinite bad = find_non_finite(bytes.data(), info->dtype, out.numel()); bad.count > 0)
      fail("model '{}': tensor '{}' holds {} NaN or infinite value{} (the first at element {} of {}): the weights file "
           "is damaged or was saved from a diverged run; download or convert it again",
           files.directory().string(), spec.name, bad.count, bad.count == 1 ? "" : "s", first + bad.first,
           info->numel());
    convert_file_values(bytes.data(), info->dtype, out);
    // A sharded loader keeps only its shard of this: the mapped file pages need not stay resident.
    files.file_of(spec.name).release_pages(bytes);
  };
}

WeightSource random_weight_source(uint64_t seed, float stddev) {
  return [seed, stddev](const TensorSpec& spec, size_t spec_index, int64_t first, TensorView out) {
    const int64_t n = out.numel();
    const bool norm = ends_with(spec.name, "norm.weight");  // as init_model: RMSNorm weights are exactly 1
    if (out.dtype == DType::BF16) {
      std::span<uint16_t> values(out.as<uint16_t>(), static_cast<size_t>(n));
      if (norm)
        std::fill(values.begin(), values.end(), float_to_bf16(1.0f));
      else
        fill_normal_bf16(seed, spec_index, static_cast<uint64_t>(first), stddev, values);
      return;
    }
    std::vector<uint16_t> values(static_cast<size_t>(n), float_to_bf16(1.0f));
    if (!norm) fill_normal_bf16(seed, spec_index, static_cast<uint64_t>(first), stddev, values);
    convert_file_values(reinterpret_cast<const std::byte*>(values.data()), DType::BF16, out);  // F32 or F16
  };
}

namespace {

// PEFT LoRA on the targeted linears of one layer, names and shapes only (a unit build reads
// their initial values: A kaiming-uniform from the seed and the module's name, so the values do
// not depend on the order layers are built in; B zero).
void add_skeleton_adapters(LayerWeights& layer, const LlamaConfig& config, const ModelOptions& options, int64_t i) {
  for (int m = 0; m < kLinearModules; ++m) {
    const std::string module = linear_module_name(m);
    if (std::find(options.lora_targets.begin(), options.lora_targets.end(), module) == options.lora_targets.end())
      continue;
    const auto [out, in] = linear_shape(config, module);
    auto adapter = std::make_unique<LoraAdapter>();
    adapter->prefix = fmt::format("base_model.model.model.layers.{}.{}.{}", i, linear_module_group(m), module);
    adapter->A.name = adapter->prefix + ".lora_A.weight";
    adapter->A.shape = Shape{options.lora_rank, in};
    adapter->B.name = adapter->prefix + ".lora_B.weight";
    adapter->B.shape = Shape{out, options.lora_rank};
    if (options.use_dora) {
      adapter->magnitude = std::make_unique<TrainableTensor>();
      adapter->magnitude->name = adapter->prefix + ".lora_magnitude_vector";
      adapter->magnitude->shape = Shape{out};
    }
    layer.lora[m] = std::move(adapter);
  }
}

// The initial values of any element range of a unit's tensors: from the weight source in the
// load dtype (load_dtype); the adapters as PEFT initialises them.
class SourceUnitReader final : public UnitReader {
 public:
  SourceUnitReader(const LlamaConfig& config, const ModelOptions& options, DType activation, const WeightSource& source)
      : options_(options), activation_(activation), source_(source), specs_(hf_tensor_specs(config)) {}

  void add_weight(const BaseWeight& w, size_t spec_index) {
    base_[&w] = spec_index;
    if (w.trainable) base_trainable_[w.trainable.get()] = spec_index;
  }
  // `base`: the frozen weight the adapter adds to (DoRA's magnitude starts from its row norms).
  void add_adapter(const LoraAdapter& a, const BaseWeight& base) {
    adapter_a_[&a.A] = &a;
    adapter_b_.insert(&a.B);
    if (a.magnitude) magnitude_base_[a.magnitude.get()] = &base;
  }

  DType frozen_dtype(const BaseWeight& w) const override {
    return load_dtype(activation_, options_, w.name, /*trainable=*/false);
  }

  void read_frozen(const BaseWeight& w, int64_t first, int64_t count, void* out) const override {
    check_range(w.name, w.shape, first, count);
    const size_t index = base_.at(&w);
    source_(specs_[index], index, first, TensorView{out, frozen_dtype(w), Shape{count}});
  }

  void read_master(const TrainableTensor& t, int64_t first, int64_t count, float* out) const override {
    check_range(t.name, t.shape, first, count);
    if (auto it = base_trainable_.find(&t); it != base_trainable_.end()) {
      // Loaded in the load dtype, then made fp32 exactly.
      const DType dtype = load_dtype(activation_, options_, t.name, /*trainable=*/true);
      if (dtype == DType::F32) {
        source_(specs_[it->second], it->second, first, TensorView{out, DType::F32, Shape{count}});
        return;
      }
      Tensor loaded = Tensor::empty(Shape{count}, dtype);
      source_(specs_[it->second], it->second, first, loaded.view());
      copy_convert(TensorView{out, DType::F32, Shape{count}}, loaded.view());
      return;
    }
    if (auto it = adapter_a_.find(&t); it != adapter_a_.end()) {
      // A is drawn whole (r x in values, small) and cut.
      std::vector<float> a(static_cast<size_t>(t.shape.numel()));
      lora_init_a(a.data(), t.shape.dims[0], t.shape.dims[1], options_.seed, it->second->prefix);
      std::copy_n(a.begin() + first, count, out);
      return;
    }
    if (adapter_b_.count(&t)) {
      std::vector<float> b(static_cast<size_t>(count));
      lora_init_b(b.data(), count);
      std::copy(b.begin(), b.end(), out);
      return;
    }
    if (auto it = magnitude_base_.find(&t); it != magnitude_base_.end()) {
      const std::vector<float> m = initial_magnitude(*it->second);
      std::copy_n(m.begin() + first, count, out);
      return;
    }
    throw std::logic_error("UnitReader: '" + t.name + "' is not a tensor of this model");
  }

 private:
  static void check_range(const std::string& name, const Shape& shape, int64_t first, int64_t count) {
    if (first < 0 || count < 0 || first + count > shape.numel())
      throw std::logic_error(fmt::format("UnitReader: elements [{}, {}) of '{}', which has {}", first, first + count,
                                         name, shape.numel()));
  }

  // DoRA's m = ‖W‖ per row, W as the forward computes with it: stored in its format (quantised
  // here from the whole tensor, so every rank gets the bytes the sharded build makes), made
  // dense in the activation dtype, and normed by the forward's own dora_weight_norm with B = 0 —
  // so at step 0 m equals the forward's norm and DoRA starts as the base model, as in PEFT.
  std::vector<float> initial_magnitude(const BaseWeight& w) const {
    const int64_t out = w.shape[0], in = w.shape[1];
    const DType dtype = frozen_dtype(w);
    Tensor values = Tensor::empty(w.shape, dtype);
    read_frozen(w, 0, w.shape.numel(), values.view().data);
    const FrozenStorage stored = FrozenStorage::encode(w.frozen.format(), w.shape, values.view().data, dtype);
    values = Tensor();
    Tensor scratch;
    const TensorView dense = stored.dense(scratch, activation_);
    Tensor norm = Tensor::empty(Shape{out}, DType::F32);
    dora_weight_norm(norm, dense, Tensor::zeros(Shape{1, in}, DType::F32), Tensor::zeros(Shape{out, 1}, DType::F32),
                     0.0f);
    return std::vector<float>(norm.data<float>(), norm.data<float>() + out);
  }

  const ModelOptions& options_;
  DType activation_;
  const WeightSource& source_;
  std::vector<TensorSpec> specs_;
  std::map<const BaseWeight*, size_t> base_;
  std::map<const TrainableTensor*, size_t> base_trainable_;
  std::map<const TrainableTensor*, const LoraAdapter*> adapter_a_;
  std::set<const TrainableTensor*> adapter_b_;
  std::map<const TrainableTensor*, const BaseWeight*> magnitude_base_;
};

}  // namespace

LlamaWeights build_llama_weights(const LlamaConfig& config, const ModelOptions& options, const WeightSource& source,
                                 const UnitBuilt& on_unit_built) {
  const DType activation = activation_dtype(options.precision);
  return build_llama_weights_by_unit(config, options, source, [&](int unit, ParamUnit& skeleton, const UnitReader& reader) {
    build_whole_unit(skeleton, reader, activation);
    if (on_unit_built) on_unit_built(unit, skeleton);
  });
}

LlamaWeights build_llama_weights_by_unit(const LlamaConfig& checkpoint, const ModelOptions& options,
                                         const WeightSource& checkpoint_source, const UnitLoader& load_unit) {
  validate_options(checkpoint, options);
  const BlockExpansion expansion(checkpoint.num_hidden_layers, options.llama_pro_new_blocks);
  const LlamaConfig config = expansion.expanded(checkpoint);
  const WeightSource source = expanded_weight_source(expansion, checkpoint, checkpoint_source);
  LlamaWeights w = empty_weights(config, options);
  const std::map<std::string, BaseWeight*> slots = weight_slots(w, config);
  const std::set<const BaseWeight*> new_block_weights = weights_of_layers(w, expansion.new_layers());
  const std::vector<TensorSpec> specs = hf_tensor_specs(config);
  SourceUnitReader reader(config, options, w.activation, source);
  for (size_t index = 0; index < specs.size(); ++index) {
    const TensorSpec& spec = specs[index];
    BaseWeight& slot = *slots.at(spec.name);
    slot.name = spec.name;
    slot.shape = shape_of(spec.shape);
    if (options.train_base || new_block_weights.count(&slot)) {
      slot.trainable = std::make_unique<TrainableTensor>();
      slot.trainable->name = spec.name;
      slot.trainable->shape = slot.shape;
    } else {
      slot.frozen = frozen_storage(w.activation, options, spec.name, slot.shape);
    }
    reader.add_weight(slot, index);
  }
  for (int64_t i = 0; i < config.num_hidden_layers && !options.train_base; ++i)
    add_skeleton_adapters(w.layers[static_cast<size_t>(i)], config, options, i);
  for (LayerWeights& layer : w.layers)
    for (int m = 0; m < kLinearModules; ++m)
      if (layer.lora[m]) reader.add_adapter(*layer.lora[m], layer.linear[m]);

  // The order build_llama_weights hands units over in: the layers, then the root.
  for (int unit = 1; unit <= static_cast<int>(config.num_hidden_layers); ++unit) {
    ParamUnit contents = w.unit(unit);
    load_unit(unit, contents, reader);
  }
  ParamUnit root = w.unit(kRootUnit);
  load_unit(kRootUnit, root, reader);
  return w;
}

}  // namespace fsdpq
