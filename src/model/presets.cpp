#include "model/presets.h"

#include <utility>

#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

struct Shape {
  int64_t hidden, intermediate, layers, heads, kv_heads, vocab, max_positions;
  double rope_theta;
};

LlamaConfig make(const Shape& s, int64_t bos = 1, int64_t eos = 2) {
  LlamaConfig c;
  c.model_type = "llama";
  c.hidden_size = s.hidden;
  c.intermediate_size = s.intermediate;
  c.num_hidden_layers = s.layers;
  c.num_attention_heads = s.heads;
  c.num_key_value_heads = s.kv_heads;
  c.head_dim = s.hidden / s.heads;
  c.vocab_size = s.vocab;
  c.max_position_embeddings = s.max_positions;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = s.rope_theta;
  c.initializer_range = 0.02;
  c.tie_word_embeddings = false;
  c.bos_token_id = bos;
  c.eos_token_ids = {eos};
  return c;
}

// Values from each model's config.json on the Hugging Face Hub (base models, not chat variants).
const std::vector<std::pair<std::string, LlamaConfig>>& presets() {
  static const std::vector<std::pair<std::string, LlamaConfig>> all = [] {
    std::vector<std::pair<std::string, LlamaConfig>> p;
    // fsdpq's own test model: every code path of the big ones (GQA, untied head) in a few MB.
    p.emplace_back("tiny", make({64, 176, 2, 4, 2, 32000, 2048, 10000.0}));
    // TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T
    p.emplace_back("tinyllama-1.1b", make({2048, 5632, 22, 32, 4, 32000, 2048, 10000.0}));
    // meta-llama/Llama-2-{7,13,70}b-hf
    p.emplace_back("llama2-7b", make({4096, 11008, 32, 32, 32, 32000, 4096, 10000.0}));
    p.emplace_back("llama2-13b", make({5120, 13824, 40, 40, 40, 32000, 4096, 10000.0}));
    // meta-llama/Meta-Llama-3-8B, Meta-Llama-3.1-8B
    p.emplace_back("llama3-8b", make({4096, 14336, 32, 32, 8, 128256, 8192, 500000.0}, 128000, 128001));
    LlamaConfig llama31 = make({4096, 14336, 32, 32, 8, 128256, 131072, 500000.0}, 128000, 128001);
    llama31.rope_scaling = RopeScaling{"llama3", 8.0, 1.0, 4.0, 8192};
    p.emplace_back("llama3.1-8b", llama31);
    // meta-llama/Llama-3.2-1B, Llama-3.2-3B: the LM head is the embedding (no lm_head.weight)
    for (const auto& [name, shape] : {std::pair{"llama3.2-1b", Shape{2048, 8192, 16, 32, 8, 128256, 131072, 500000.0}},
                                      std::pair{"llama3.2-3b", Shape{3072, 8192, 28, 24, 8, 128256, 131072, 500000.0}}}) {
      LlamaConfig llama32 = make(shape, 128000, 128001);
      llama32.rope_scaling = RopeScaling{"llama3", 32.0, 1.0, 4.0, 8192};
      llama32.tie_word_embeddings = true;
      p.emplace_back(name, llama32);
    }
    // mistralai/Mistral-7B-v0.1
    LlamaConfig mistral = make({4096, 14336, 32, 32, 8, 32000, 32768, 10000.0});
    mistral.model_type = "mistral";
    mistral.sliding_window = 4096;
    p.emplace_back("mistral-7b", mistral);
    // codellama/CodeLlama-34b-hf, 01-ai/Yi-34B
    p.emplace_back("codellama-34b", make({8192, 22016, 48, 64, 8, 32000, 16384, 1000000.0}));
    p.emplace_back("yi-34b", make({7168, 20480, 60, 56, 8, 64000, 4096, 5000000.0}));
    // meta-llama/Llama-2-70b-hf, Meta-Llama-3-70B
    p.emplace_back("llama2-70b", make({8192, 28672, 80, 64, 8, 32000, 4096, 10000.0}));
    p.emplace_back("llama3-70b", make({8192, 28672, 80, 64, 8, 128256, 8192, 500000.0}, 128000, 128001));
    return p;
  }();
  return all;
}

}  // namespace

std::optional<LlamaConfig> find_preset(std::string_view name) {
  const std::string wanted = to_lower(trim(name));
  for (const auto& [preset, config] : presets())
    if (preset == wanted) return config;
  return std::nullopt;
}

LlamaConfig preset_or_fail(std::string_view name) {
  if (auto c = find_preset(name)) return *c;
  const std::vector<std::string> names = preset_names();
  const std::string guess = closest_match(name, names);
  fail("unknown model preset '{}'{}; known presets: {}", name,
       guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess), join(names, ", "));
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, config] : presets()) names.push_back(name);
  return names;
}

}  // namespace fsdpq
