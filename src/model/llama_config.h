// The architecture of a Llama-family model, as an HF config.json describes it (model_type llama or
// mistral), plus what follows from it: tensor names and shapes, parameter counts.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/safetensors.h"

namespace fsdpq {

struct RopeScaling {
  std::string type;  // "" (none) or "llama3"
  double factor = 0;
  double low_freq_factor = 0;
  double high_freq_factor = 0;
  int64_t original_max_position_embeddings = 0;
};

struct LlamaConfig {
  std::string model_type = "llama";  // llama | mistral
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  double initializer_range = 0.02;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = 1;  // -1: none
  std::vector<int64_t> eos_token_ids = {2};
  std::optional<int64_t> sliding_window;  // mistral only

  int64_t q_out() const { return num_attention_heads * head_dim; }
  int64_t kv_out() const { return num_key_value_heads * head_dim; }
};

// Reads and validates an HF config.json; every problem is a UserError naming the file and the key.
LlamaConfig load_llama_config(const std::filesystem::path& config_json);
// The same, from an already parsed object; `where` names its origin in messages.
LlamaConfig llama_config_from_json(const nlohmann::json& json, const std::string& where);
// Checks sizes and their relations (heads divide, head_dim even, ...); `where` names the origin.
void validate_llama_config(const LlamaConfig& config, const std::string& where);

// A config.json that transformers' LlamaConfig / MistralConfig loads back to the same model.
nlohmann::json to_hf_json(const LlamaConfig& config);

// Every weight in HF order and naming, all BF16.
std::vector<TensorSpec> hf_tensor_specs(const LlamaConfig& config);

struct ParamCounts {
  int64_t embedding = 0;
  int64_t attention = 0;  // q, k, v, o of every layer
  int64_t mlp = 0;        // gate, up, down of every layer
  int64_t norms = 0;      // two per layer plus the final norm
  int64_t lm_head = 0;    // 0 when tied to the embedding
  int64_t total = 0;
};
ParamCounts count_params(const LlamaConfig& config);

// {out_features, in_features} of a layer's linear module: q_proj, k_proj, v_proj, o_proj,
// gate_proj, up_proj, down_proj (and lm_head).
std::pair<int64_t, int64_t> linear_shape(const LlamaConfig& config, std::string_view module);
// The names linear_shape accepts for decoder-layer modules, in HF order.
const std::vector<std::string>& linear_module_names();

}  // namespace fsdpq
