#include "train/save_model.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <optional>

#include "io/model_files.h"
#include "io/peft_adapter.h"
#include "io/tokenizer_files.h"
#include "model/block_expansion.h"
#include "model/llama_weights.h"
#include "model/model_source.h"
#include "train/trainer.h"
#include "util/bf16.h"
#include "util/error.h"

namespace fsdpq {
namespace fs = std::filesystem;
namespace {

// The model as an HF directory in bf16: each trained tensor from its fp32 master, every other one
// (Llama-Pro's frozen layers, the embedding, the head) from `untrained`, the values the run read
// for it, so the frozen layers are the base's own values and not their quantised approximation.
std::string save_hf_model(LlamaModel& model, const TrainConfig& c, const RunPlan& plan, const WeightSource& untrained) {
  const fs::path dir = c.output_dir;
  fs::create_directories(dir);
  std::map<std::string, const Tensor*> masters;
  for (const auto& p : model.trainable_parameters()) masters[p.name] = p.master;
  std::vector<TensorSpec> specs = hf_tensor_specs(model.config());
  for (const auto& spec : specs)
    if (!masters.count(spec.name) && !untrained)
      throw std::logic_error("full fine-tuning has no trainable tensor named " + spec.name);
  write_model_weights(dir, specs, [&](size_t tensor, uint64_t byte_offset, std::span<std::byte> out) {
    const int64_t first = static_cast<int64_t>(byte_offset / 2), count = static_cast<int64_t>(out.size() / 2);
    const auto master = masters.find(specs[tensor].name);
    if (master == masters.end()) {
      untrained(specs[tensor], tensor, first, TensorView{out.data(), DType::BF16, Shape{count}});
      return;
    }
    const float* src = master->second->data<float>() + first;  // bf16 of the fp32 master
    for (int64_t i = 0; i < count; ++i) {
      uint16_t b = float_to_bf16(src[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  });
  write_file_atomically(dir / "config.json", to_hf_json(model.config()).dump(2) + "\n");
  // The tokenizer the run used (a Llama-3 tokenizer.json with its tokenizer_config.json, a
  // sentencepiece tokenizer.model...), so that the folder loads with it; a preset's byte-level
  // tokenizer has no file.
  if (const std::string tokenizer = tokenizer_spec_for(plan.model, c.tokenizer_path); tokenizer != "builtin:bytes")
    copy_tokenizer_files(tokenizer, dir, "saving the model");
  if (!plan.model.is_preset() && fs::exists(plan.model.directory / "generation_config.json"))
    fs::copy_file(plan.model.directory / "generation_config.json", dir / "generation_config.json",
                  fs::copy_options::overwrite_existing);
  return dir.string();
}

// Llama-Pro: the expanded model, its new blocks trained and the rest the base checkpoint's (a
// preset's drawn again), loadable as any HF Llama of num_hidden_layers = L + n.
std::string save_expanded_model(LlamaModel& model, const TrainConfig& c, const RunPlan& plan) {
  std::optional<ModelWeights> files;
  const WeightSource base =
      plan.model.is_preset()
          ? random_weight_source(kPresetInitSeed, static_cast<float>(plan.model.config.initializer_range))
          : file_weight_source(files.emplace(ModelWeights::open(plan.model.directory)));
  const BlockExpansion expansion(plan.model.config.num_hidden_layers, model.options().llama_pro_new_blocks);
  const std::string dir =
      save_hf_model(model, c, plan, expanded_weight_source(expansion, plan.model.config, base));
  return fmt::format("the Llama-Pro model ({} layers, {} of them new blocks, trained; bf16, HF layout) to {}",
                     expansion.layers(), expansion.new_blocks(), dir);
}

}  // namespace

std::string save_trained_model(LlamaModel& model, const ResolvedConfig& resolved, const RunPlan& plan) {
  const TrainConfig& c = resolved.config;
  if (c.llama_pro()) return save_expanded_model(model, c, plan);
  if (c.full_finetune())
    return fmt::format("the fine-tuned model (bf16, HF layout) to {}", save_hf_model(model, c, plan, {}));
  AdapterConfig adapter;
  adapter.r = c.lora_rank;
  adapter.lora_alpha = c.lora_alpha;
  adapter.lora_dropout = c.lora_dropout;
  adapter.target_modules = c.lora_target_modules;
  adapter.use_dora = c.dora();
  adapter.base_model_name_or_path = plan.model.is_preset() ? plan.model.name : fs::absolute(plan.model.directory).string();
  DType dtype = c.choice.precision == Precision::FP32 ? DType::F32 : DType::BF16;
  save_peft_adapter(c.output_dir, adapter, model.adapter_tensors(), dtype);
  return fmt::format("{} adapters (PEFT layout: adapter_model.safetensors + adapter_config.json) to {}",
                     c.dora() ? "DoRA" : "LoRA", c.output_dir);
}

}  // namespace fsdpq
