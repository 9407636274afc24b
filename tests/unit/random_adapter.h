// A PEFT LoRA (or DoRA) adapter of random values for a model's shape, written as PEFT saves one:
// what the generate and merge tests load into fsdpq.
#pragma once
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/tensor.h"
#include "io/peft_adapter.h"
#include "model/llama_config.h"

namespace fsdpq::test {

struct RandomAdapter {
  int64_t r = 4;
  double alpha = 8;
  std::vector<std::string> targets;  // module names: "q_proj", ...
  float b_range = 0;                 // B ~ U(-b_range, b_range); 0: B = 0, so the adapter is a no-op
  int64_t layers = -1;               // adapts the first `layers` layers; -1: all of them
  bool dora = false;                 // with DoRA magnitudes ~ U(0.5, 2)
  uint32_t seed = 7;
};

// Writes `spec` for a model shaped as `base` into `dir` (fp32): A ~ U(-0.5, 0.5) and B per target
// module and layer, drawn in that order from one generator seeded with spec.seed.
inline std::filesystem::path write_random_adapter(const std::filesystem::path& dir, const LlamaConfig& base,
                                                  const RandomAdapter& spec) {
  AdapterConfig config;
  config.use_dora = spec.dora;
  config.r = spec.r;
  config.lora_alpha = spec.alpha;
  config.target_modules = spec.targets;
  std::mt19937 gen(spec.seed);
  auto fill = [&](Tensor& t, float range) {
    std::uniform_real_distribution<float> dist(-range, range);
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = range == 0 ? 0.0f : dist(gen);
  };
  std::vector<std::pair<std::string, Tensor>> owned;
  for (int64_t layer = 0; layer < (spec.layers < 0 ? base.num_hidden_layers : spec.layers); ++layer)
    for (const auto& module : spec.targets) {
      auto [out, in] = linear_shape(base, module);
      Tensor a = Tensor::empty(Shape{spec.r, in}, DType::F32), b = Tensor::empty(Shape{out, spec.r}, DType::F32);
      fill(a, 0.5f);
      fill(b, spec.b_range);
      owned.emplace_back(adapter_tensor_name(layer, module, true), std::move(a));
      owned.emplace_back(adapter_tensor_name(layer, module, false), std::move(b));
      if (!spec.dora) continue;
      Tensor m = Tensor::empty(Shape{out}, DType::F32);
      std::uniform_real_distribution<float> magnitude(0.5f, 2.0f);
      for (int64_t i = 0; i < out; ++i) m.data<float>()[i] = magnitude(gen);
      owned.emplace_back(magnitude_tensor_name(layer, module), std::move(m));
    }
  std::vector<std::pair<std::string, const Tensor*>> views;
  for (const auto& [n, t] : owned) views.emplace_back(n, &t);
  save_peft_adapter(dir, config, views, DType::F32);
  return dir;
}

// `base` with hidden size 32 (q_proj [32, 32]): the shape of an adapter trained on another model.
inline LlamaConfig narrowed_to_hidden_32(LlamaConfig base) {
  base.hidden_size = 32;
  base.head_dim = 32 / base.num_attention_heads;
  return base;
}

}  // namespace fsdpq::test
