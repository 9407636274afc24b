// Named model architectures (the published HF config.json values), for benchmarks and tests that
// need a model's shapes but not its weights: `model_name = preset:llama2-7b`.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/llama_config.h"

namespace fsdpq {

// Case-insensitive; nullopt for an unknown name.
std::optional<LlamaConfig> find_preset(std::string_view name);
// An unknown name is a UserError with a did-you-mean and the list of presets.
LlamaConfig preset_or_fail(std::string_view name);
// In order of size, "tiny" first.
std::vector<std::string> preset_names();

}  // namespace fsdpq
