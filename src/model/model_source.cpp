#include "model/model_source.h"

#include <fmt/format.h>

#include <set>

#include "data/tokenizer.h"
#include "model/presets.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace fs = std::filesystem;

ModelSource open_model_source(const std::string& model_name) {
  ModelSource source;
  source.name = model_name;
  if (starts_with(model_name, "preset:")) {
    std::string preset = model_name.substr(7);
    source.config = preset_or_fail(preset);
    source.preset = preset;
    return source;
  }
  fs::path dir(model_name);
  if (!fs::is_directory(dir)) fail("model directory '{}' not found", model_name);
  if (!fs::exists(dir / "config.json"))
    fail("model directory '{}' has no config.json (an HF model folder has config.json and "
         "model.safetensors or model.safetensors.index.json)", model_name);
  source.config = load_llama_config(dir / "config.json");
  source.directory = dir;
  ModelWeights weights = ModelWeights::open(dir);
  check_weights_match_config(source.config, weights);
  return source;
}

void check_weights_match_config(const LlamaConfig& config, const ModelWeights& weights) {
  const std::string where = weights.directory().string();
  std::set<std::string> expected;
  for (const auto& spec : hf_tensor_specs(config)) {
    expected.insert(spec.name);
    const TensorInfo* info = weights.find(spec.name);
    if (!info) fail("{}: tensor '{}' is missing (config.json describes a model that needs it)", where, spec.name);
    if (info->shape != spec.shape) {
      std::vector<std::string> got, want;
      for (auto d : info->shape) got.push_back(std::to_string(d));
      for (auto d : spec.shape) want.push_back(std::to_string(d));
      fail("{}: tensor '{}' has shape [{}], config.json implies [{}]", where, spec.name, join(got, ", "),
           join(want, ", "));
    }
    if (info->dtype != DType::BF16 && info->dtype != DType::F16 && info->dtype != DType::F32)
      fail("{}: tensor '{}' is {}, expected BF16, F16 or F32", where, spec.name, dtype_name(info->dtype));
  }
  for (const auto& name : weights.tensor_names()) {
    // HF checkpoints sometimes carry the RoPE buffer; it is recomputed, so it may be present.
    if (ends_with(name, "rotary_emb.inv_freq")) continue;
    if (!expected.count(name))
      fail("{}: unexpected tensor '{}' (not part of a {} model with this config.json)", where, name,
           config.model_type);
  }
}

std::string tokenizer_spec_for(const ModelSource& model, const std::string& tokenizer_path) {
  if (!tokenizer_path.empty()) return tokenizer_path;
  if (model.is_preset())
    fail("model_name = {} has no tokenizer: set tokenizer_path to a tokenizer.model or tokenizer.json (or to "
         "builtin:bytes for a byte-level tokenizer that needs no file)", model.name);
  // load_tokenizer picks the folder's file (sentencepiece, tokenizer.json, tiktoken).
  if (!data::folder_has_tokenizer(model.directory))
    fail("model directory '{}' has no tokenizer.model or tokenizer.json: set tokenizer_path",
         model.directory.string());
  return model.directory.string();
}

}  // namespace fsdpq
