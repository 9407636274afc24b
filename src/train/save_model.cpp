#include "train/save_model.h"

#include <fmt/format.h>

#include <cstring>
#include <map>

#include "io/model_files.h"
#include "io/peft_adapter.h"
#include "util/bf16.h"
#include "util/error.h"

namespace fsdpq {
namespace fs = std::filesystem;
namespace {

std::string save_full_model(LlamaModel& model, const TrainConfig& c, const RunPlan& plan) {
  const fs::path dir = c.output_dir;
  fs::create_directories(dir);
  std::map<std::string, const Tensor*> masters;
  for (const auto& p : model.trainable_parameters()) masters[p.name] = p.master;
  std::vector<TensorSpec> specs = hf_tensor_specs(model.config());
  for (const auto& spec : specs)
    if (!masters.count(spec.name))
      throw std::logic_error("full fine-tuning has no trainable tensor named " + spec.name);
  // bf16 of the fp32 masters, chunk by chunk, in the HF tensor order.
  write_model_weights(dir, specs, [&](size_t tensor, uint64_t byte_offset, std::span<std::byte> out) {
    const float* src = masters.at(specs[tensor].name)->data<float>() + byte_offset / 2;
    for (size_t i = 0; i < out.size() / 2; ++i) {
      uint16_t b = float_to_bf16(src[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  });
  write_file_atomically(dir / "config.json", to_hf_json(model.config()).dump(2) + "\n");
  if (!plan.model.is_preset() && fs::exists(plan.model.directory / "tokenizer.model"))
    fs::copy_file(plan.model.directory / "tokenizer.model", dir / "tokenizer.model",
                  fs::copy_options::overwrite_existing);
  return fmt::format("the fine-tuned model (bf16, HF layout) to {}", dir.string());
}

}  // namespace

std::string save_trained_model(LlamaModel& model, const ResolvedConfig& resolved, const RunPlan& plan) {
  const TrainConfig& c = resolved.config;
  if (!c.is_lora()) return save_full_model(model, c, plan);
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
