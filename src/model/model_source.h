// Where a run's model comes from: `preset:NAME` (random-initialised, nothing on disk) or an HF
// model directory, whose config.json and weight files are checked against each other.
#pragma once
#include <filesystem>
#include <optional>
#include <string>

#include "io/model_files.h"
#include "model/llama_config.h"

namespace fsdpq {

struct ModelSource {
  LlamaConfig config;
  std::string name;                // as given in model_name
  std::optional<std::string> preset;
  std::filesystem::path directory;  // empty for a preset
  bool is_preset() const { return preset.has_value(); }
};

// Resolves model_name. For a directory: reads config.json and opens the weights, checking that
// every tensor the config implies is there with the right shape and a float dtype, and that
// nothing unexpected is. Errors name the directory, file and tensor.
ModelSource open_model_source(const std::string& model_name);

// The checks above, on weights already opened.
void check_weights_match_config(const LlamaConfig& config, const ModelWeights& weights);

// The tokenizer spec for a run: tokenizer_path when set, else the model directory (holding a
// tokenizer.model or tokenizer.json); a preset without tokenizer_path is an error that says what
// to set.
std::string tokenizer_spec_for(const ModelSource& model, const std::string& tokenizer_path);

}  // namespace fsdpq
