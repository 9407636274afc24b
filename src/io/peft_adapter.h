// LoRA adapters in Hugging Face PEFT's on-disk layout, so that `PeftModel.from_pretrained(base,
// dir)` loads what fsdpq trains and fsdpq loads what PEFT trains: `adapter_config.json` (a
// LoraConfig, peft_type "LORA") and `adapter_model.safetensors` with one lora_A [r, in] and one
// lora_B [out, r] per adapted linear, named as PEFT's save_pretrained names them:
//   base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight
// (PEFT drops the adapter name "default" when saving; old versions kept ".default." and are read).
// A DoRA adapter ("use_dora": true) also has one magnitude vector [out] per adapted linear, saved by
// PEFT without ".weight" (get_peft_model_state_dict strips the DoraLinearLayer's parameter name):
//   base_model.model.model.layers.{i}.self_attn.q_proj.lora_magnitude_vector
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/tensor.h"
#include "util/dtype.h"

namespace fsdpq {

inline constexpr const char* kAdapterConfigFile = "adapter_config.json";
inline constexpr const char* kAdapterWeightsFile = "adapter_model.safetensors";

struct AdapterConfig {
  int64_t r = 0;
  double lora_alpha = 0;  // scaling = lora_alpha / r
  double lora_dropout = 0;
  std::vector<std::string> target_modules;  // q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj
  std::string base_model_name_or_path;
  bool use_dora = false;  // DoRA: every adapted linear also has a magnitude vector (ops/dora.h)

  double scaling() const { return lora_alpha / static_cast<double>(r); }
};

// One adapter tensor's name, taken apart.
struct AdapterTensorName {
  int64_t layer = 0;
  std::string module;  // "q_proj" ... "down_proj"
  bool is_a = true;    // lora_A (else lora_B, or the magnitude)
  bool is_magnitude = false;  // DoRA's lora_magnitude_vector

  // "model.layers.{layer}.self_attn.q_proj.weight": the base weight this adapter adds to.
  std::string base_weight_name() const;
  // The PEFT name as saved (no adapter name).
  std::string peft_name() const;
};

// Parses a saved PEFT LoRA tensor name (with or without ".default." before ".weight"; a magnitude
// as saved, or with ".default" / ".default.weight" as a state dict holds it); nullopt when it is
// not one (other tuners, embeddings, a module under the wrong parent).
std::optional<AdapterTensorName> parse_adapter_tensor_name(std::string_view name);
// The saved PEFT name of lora_A / lora_B of `module` in decoder layer `layer`.
std::string adapter_tensor_name(int64_t layer, std::string_view module, bool is_a);
// The saved PEFT name of DoRA's magnitude vector of `module` in decoder layer `layer`.
std::string magnitude_tensor_name(int64_t layer, std::string_view module);

// The adapter_config.json that save_peft_adapter writes: the LoraConfig fields PEFT 0.10 and later
// all know, with PEFT's defaults for what fsdpq does not use (later PEFTs default the fields they
// added; nothing here makes an older one warn about unknown keys).
nlohmann::json adapter_config_json(const AdapterConfig& config);

// Writes adapter_model.safetensors (tensors in the given order, stored as `dtype`: F32 or BF16,
// metadata {"format": "pt"} as PEFT writes) and adapter_config.json into `dir` (created if
// needed). Under config.use_dora every A/B pair comes with its magnitude vector, and only then. Both go through temporary names; an earlier adapter_config.json is removed first and the
// new one renamed into place last, so a directory that has one holds a complete adapter.
// `tensors` maps saved PEFT names to F32 CPU tensors whose shapes agree with config.r.
void save_peft_adapter(const std::filesystem::path& dir, const AdapterConfig& config,
                       const std::vector<std::pair<std::string, const Tensor*>>& tensors, DType dtype);

struct LoadedAdapter {
  AdapterConfig config;
  // Saved PEFT names (".default." removed) → F32 CPU tensors, sorted by layer, then module in HF
  // order, lora_A, lora_B, then (DoRA) the magnitude. The form LlamaModel::load_adapter_tensors takes.
  std::vector<std::pair<std::string, Tensor>> tensors;

  const Tensor* find(std::string_view name) const;
};

// Reads and validates an adapter directory: both files present, the config a plain LoRA fsdpq can
// apply (peft_type LORA, with or without DoRA; no rsLoRA, biases, fan_in_fan_out, rank/alpha
// patterns or modules_to_save), every tensor a lora_A/lora_B (or, with use_dora, a magnitude) of a
// targeted Llama linear with shapes that agree with r (a magnitude with lora_B's rows), every
// pair (and DoRA triple) whole. Errors name the directory, file and tensor.
LoadedAdapter load_peft_adapter(const std::filesystem::path& dir);
// Only the config (cheap: for planning, before the weights are needed).
AdapterConfig load_adapter_config(const std::filesystem::path& dir);

}  // namespace fsdpq
