// LlamaConfig from HF config.json files, the presets, tensor specs and parameter counts.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "model/llama_config.h"
#include "model/presets.h"
#include "test_support.h"
#include "util/error.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::error_of;

// meta-llama/Llama-2-7b-hf's config.json as published.
const char* kLlama2Config = R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf",
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

// meta-llama/Llama-3.1-8B-Instruct's config.json as published.
const char* kLlama31InstructConfig = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3",
  "use_cache": true,
  "vocab_size": 128256
})";

fs::path write_config(const fs::path& dir, const std::string& name, const std::string& text) {
  const fs::path p = dir / name;
  test::write_file(p, text);
  return p;
}

void expect_same(const LlamaConfig& a, const LlamaConfig& b, const std::string& label) {
  EXPECT_EQ(a.model_type, b.model_type) << label;
  EXPECT_EQ(a.hidden_size, b.hidden_size) << label;
  EXPECT_EQ(a.intermediate_size, b.intermediate_size) << label;
  EXPECT_EQ(a.num_hidden_layers, b.num_hidden_layers) << label;
  EXPECT_EQ(a.num_attention_heads, b.num_attention_heads) << label;
  EXPECT_EQ(a.num_key_value_heads, b.num_key_value_heads) << label;
  EXPECT_EQ(a.head_dim, b.head_dim) << label;
  EXPECT_EQ(a.vocab_size, b.vocab_size) << label;
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings) << label;
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps) << label;
  EXPECT_EQ(a.rope_theta, b.rope_theta) << label;
  EXPECT_EQ(a.initializer_range, b.initializer_range) << label;
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type) << label;
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor) << label;
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor) << label;
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor) << label;
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings, b.rope_scaling.original_max_position_embeddings) << label;
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings) << label;
  EXPECT_EQ(a.bos_token_id, b.bos_token_id) << label;
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids) << label;
  EXPECT_EQ(a.sliding_window, b.sliding_window) << label;
}

// ---- Loading -------------------------------------------------------------------------------------

TEST(LlamaConfig, LoadsPublishedLlama2Config) {
  const fs::path dir = test::make_temp_dir("cfg_llama2");
  LlamaConfig c = load_llama_config(write_config(dir, "config.json", kLlama2Config));
  expect_same(c, preset_or_fail("llama2-7b"), "llama2-7b");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_theta, 10000.0);  // absent from the file: transformers' default
}

TEST(LlamaConfig, LoadsLlama31RopeScalingAndEosList) {
  const fs::path dir = test::make_temp_dir("cfg_llama31");
  LlamaConfig c = load_llama_config(write_config(dir, "config.json", kLlama31InstructConfig));
  LlamaConfig expected = preset_or_fail("llama3.1-8b");
  expected.eos_token_ids = {128001, 128008, 128009};  // the Instruct variant lists three
  expect_same(c, expected, "llama3.1-8b-instruct");
}

TEST(LlamaConfig, DefaultsForOmittedKeys) {
  json j = {{"model_type", "llama"}, {"hidden_size", 96}, {"intermediate_size", 256}, {"num_hidden_layers", 3},
            {"num_attention_heads", 6}, {"vocab_size", 1000}};
  LlamaConfig c = llama_config_from_json(j, "test");
  EXPECT_EQ(c.num_key_value_heads, 6);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.initializer_range, 0.02);
  EXPECT_TRUE(c.rope_scaling.type.empty());
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{});
  EXPECT_EQ(c.bos_token_id, -1);
  EXPECT_FALSE(c.sliding_window.has_value());

  j["model_type"] = "mistral";
  EXPECT_EQ(llama_config_from_json(j, "test").sliding_window, 4096);  // MistralConfig's default
  EXPECT_EQ(llama_config_from_json(j, "test").max_position_embeddings, 131072);
  j["sliding_window"] = nullptr;
  EXPECT_FALSE(llama_config_from_json(j, "test").sliding_window.has_value());

  // An explicit head_dim need not equal hidden / heads (Mistral-Nemo style).
  j["head_dim"] = 32;
  EXPECT_EQ(llama_config_from_json(j, "test").head_dim, 32);
  EXPECT_EQ(linear_shape(llama_config_from_json(j, "test"), "q_proj"), (std::pair<int64_t, int64_t>{192, 96}));
}

TEST(LlamaConfig, ReadsTransformers5RopeParameters) {
  json j = json::parse(kLlama31InstructConfig);
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}, {"factor", 8.0},
                          {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  LlamaConfig c = llama_config_from_json(j, "test");
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 123.0}};
  c = llama_config_from_json(j, "test");
  EXPECT_EQ(c.rope_theta, 123.0);
  EXPECT_TRUE(c.rope_scaling.type.empty());
}

struct BadConfig {
  std::string label;
  std::function<void(json&)> edit;
  std::string message;  // after "'<path>': "
};

TEST(LlamaConfig, RejectsCatalogue) {
  const fs::path dir = test::make_temp_dir("cfg_bad");
  const std::vector<BadConfig> cases = {
      {"model_type_gpt2", [](json& j) { j["model_type"] = "gpt2"; },
       "model_type 'gpt2' is not supported (supported: llama, mistral)"},
      {"model_type_missing", [](json& j) { j.erase("model_type"); },
       "key 'model_type' is missing (supported: llama, mistral)"},
      {"rope_linear", [](json& j) { j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}}; },
       "rope_scaling type 'linear' is not supported (supported: none, llama3); linear, dynamic, yarn and longrope "
       "scaling are not implemented"},
      {"rope_yarn", [](json& j) { j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}}; },
       "rope_scaling type 'yarn' is not supported (supported: none, llama3); linear, dynamic, yarn and longrope "
       "scaling are not implemented"},
      {"rope_not_object", [](json& j) { j["rope_scaling"] = 2; }, "key 'rope_scaling' must be null or an object, found 2"},
      {"llama3_missing_factor",
       [](json& j) { j["rope_scaling"] = {{"rope_type", "llama3"}, {"low_freq_factor", 1.0}}; },
       "key 'rope_scaling.factor' is missing (expected a positive number)"},
      {"hidden_act_gelu", [](json& j) { j["hidden_act"] = "gelu"; },
       "hidden_act 'gelu' is not supported (supported: silu, which Llama and Mistral use)"},
      {"attention_bias", [](json& j) { j["attention_bias"] = true; },
       "attention_bias is true, but fsdpq implements Llama attention without biases"},
      {"mlp_bias", [](json& j) { j["mlp_bias"] = true; }, "mlp_bias is true, but fsdpq implements the Llama MLP without biases"},
      {"kv_heads_not_dividing", [](json& j) { j["num_key_value_heads"] = 5; },
       "num_attention_heads (32) must be a multiple of num_key_value_heads (5)"},
      {"hidden_not_divisible", [](json& j) { j["hidden_size"] = 4000; j["num_attention_heads"] = 48; j["num_key_value_heads"] = 8; },
       "hidden_size (4000) must be a multiple of num_attention_heads (48) when head_dim is not given"},
      {"odd_head_dim", [](json& j) { j["head_dim"] = 33; }, "head_dim (33) must be even for rotary position embeddings"},
      {"missing_hidden_size", [](json& j) { j.erase("hidden_size"); },
       "key 'hidden_size' is missing (expected an integer from 1 to 1048576)"},
      {"hidden_size_string", [](json& j) { j["hidden_size"] = "4096"; },
       "key 'hidden_size' must be an integer from 1 to 1048576, found \"4096\""},
      {"hidden_size_float", [](json& j) { j["hidden_size"] = 4096.0; },
       "key 'hidden_size' must be an integer from 1 to 1048576, found 4096.0"},
      {"layers_zero", [](json& j) { j["num_hidden_layers"] = 0; },
       "key 'num_hidden_layers' must be an integer from 1 to 4096, found 0"},
      {"vocab_negative", [](json& j) { j["vocab_size"] = -5; }, "key 'vocab_size' must be an integer from 1 to 16777216, found -5"},
      {"eps_string", [](json& j) { j["rms_norm_eps"] = "1e-5"; }, "key 'rms_norm_eps' must be a positive number, found \"1e-5\""},
      {"tie_string", [](json& j) { j["tie_word_embeddings"] = "yes"; }, "key 'tie_word_embeddings' must be true or false, found \"yes\""},
      {"eos_string", [](json& j) { j["eos_token_id"] = "2"; },
       "key 'eos_token_id' must be an integer or a list of integers, found \"2\""},
      {"eos_out_of_vocab", [](json& j) { j["eos_token_id"] = 32000; }, "eos_token_id 32000 is not below vocab_size 32000"},
      {"quantized", [](json& j) { j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}}; },
       "has a quantization_config: pre-quantized checkpoints are not supported; give the bf16/fp16 model"},
  };
  for (const BadConfig& c : cases) {
    json j = json::parse(kLlama2Config);
    c.edit(j);
    const fs::path p = write_config(dir, c.label + ".json", j.dump(2));
    EXPECT_EQ(error_of([&] { load_llama_config(p); }), fmt::format("'{}': {}", p.string(), c.message)) << c.label;
  }

  const fs::path not_json = write_config(dir, "not_json.json", "{\"hidden_size\": 4096,,}");
  EXPECT_EQ(error_of([&] { load_llama_config(not_json); }),
            fmt::format("'{}': not valid JSON (error at byte 22)", not_json.string()));
  const fs::path array = write_config(dir, "array.json", "[1]");
  EXPECT_EQ(error_of([&] { load_llama_config(array); }), fmt::format("'{}': expected a JSON object, found array", array.string()));
  EXPECT_EQ(error_of([&] { load_llama_config(dir / "absent.json"); }),
            fmt::format("model config '{}' does not exist", (dir / "absent.json").string()));
}

// ---- Writing config.json ---------------------------------------------------------------------------

TEST(LlamaConfig, HfJsonRoundTripForEveryPreset) {
  const fs::path dir = test::make_temp_dir("cfg_roundtrip");
  for (const std::string& name : preset_names()) {
    const LlamaConfig preset = preset_or_fail(name);
    const json j = to_hf_json(preset);
    EXPECT_EQ(j["hidden_act"], "silu") << name;
    EXPECT_EQ(j["torch_dtype"], "bfloat16") << name;
    EXPECT_EQ(j["architectures"][0], preset.model_type == "mistral" ? "MistralForCausalLM" : "LlamaForCausalLM") << name;
    const fs::path p = write_config(dir, name + ".json", j.dump(2));
    expect_same(load_llama_config(p), preset, name);
  }
  // Several EOS ids go out as a list, one as a plain integer.
  LlamaConfig c = preset_or_fail("llama3-8b");
  EXPECT_EQ(to_hf_json(c)["eos_token_id"], 128001);
  c.eos_token_ids = {128001, 128009};
  EXPECT_EQ(to_hf_json(c)["eos_token_id"], json({128001, 128009}));
  EXPECT_EQ(to_hf_json(preset_or_fail("llama3.1-8b"))["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(to_hf_json(preset_or_fail("mistral-7b"))["sliding_window"], 4096);
}

// ---- Shapes and counts -----------------------------------------------------------------------------

TEST(LlamaConfig, ParamCountsOfKnownModels) {
  const ParamCounts l7 = count_params(preset_or_fail("llama2-7b"));
  EXPECT_EQ(l7.total, 6'738'415'616);
  EXPECT_EQ(l7.embedding, 131'072'000);
  EXPECT_EQ(l7.lm_head, 131'072'000);
  EXPECT_EQ(l7.attention, 32LL * 4 * 4096 * 4096);
  EXPECT_EQ(l7.mlp, 32LL * 3 * 4096 * 11008);
  EXPECT_EQ(l7.norms, 65LL * 4096);
  EXPECT_EQ(count_params(preset_or_fail("llama2-70b")).total, 68'976'648'192);
  EXPECT_EQ(count_params(preset_or_fail("llama3-8b")).total, 8'030'261'248);
  EXPECT_EQ(count_params(preset_or_fail("mistral-7b")).total, 7'241'732'096);
  EXPECT_EQ(count_params(preset_or_fail("tinyllama-1.1b")).total, 1'100'048'384);
  // Llama-3.2: the head is the embedding (Hugging Face counts 1.24B and 3.21B).
  EXPECT_EQ(count_params(preset_or_fail("llama3.2-1b")).total, 1'235'814'400);
  EXPECT_EQ(count_params(preset_or_fail("llama3.2-3b")).total, 3'212'749'824);
  EXPECT_EQ(count_params(preset_or_fail("llama3.2-1b")).lm_head, 0);
  // tiny: 2 x 32000 x 64 (embedding, head) + 2 layers x (64x64 + 2 x 32x64 + 64x64 + 3 x 176x64) + 5 x 64.
  const ParamCounts tiny = count_params(preset_or_fail("tiny"));
  EXPECT_EQ(tiny.attention, 2 * (4096 + 2048 + 2048 + 4096));
  EXPECT_EQ(tiny.mlp, 2 * 3 * 176 * 64);
  EXPECT_EQ(tiny.total, 4'188'480);

  LlamaConfig tied = preset_or_fail("tiny");
  tied.tie_word_embeddings = true;
  EXPECT_EQ(count_params(tied).lm_head, 0);
  EXPECT_EQ(count_params(tied).total, 4'188'480 - 32000 * 64);
}

TEST(LlamaConfig, TensorSpecsInHfOrder) {
  for (const std::string& name : preset_names()) {
    const LlamaConfig c = preset_or_fail(name);
    const auto specs = hf_tensor_specs(c);
    ASSERT_EQ(specs.size(), 9u * c.num_hidden_layers + (c.tie_word_embeddings ? 2 : 3)) << name;
    int64_t total = 0;
    for (const auto& s : specs) {
      EXPECT_EQ(s.dtype, DType::BF16);
      total += s.numel();
    }
    EXPECT_EQ(total, count_params(c).total) << name;
  }
  const LlamaConfig tiny = preset_or_fail("tiny");
  const auto specs = hf_tensor_specs(tiny);
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected_head = {
      {"model.embed_tokens.weight", {32000, 64}},
      {"model.layers.0.input_layernorm.weight", {64}},
      {"model.layers.0.self_attn.q_proj.weight", {64, 64}},
      {"model.layers.0.self_attn.k_proj.weight", {32, 64}},
      {"model.layers.0.self_attn.v_proj.weight", {32, 64}},
      {"model.layers.0.self_attn.o_proj.weight", {64, 64}},
      {"model.layers.0.post_attention_layernorm.weight", {64}},
      {"model.layers.0.mlp.gate_proj.weight", {176, 64}},
      {"model.layers.0.mlp.up_proj.weight", {176, 64}},
      {"model.layers.0.mlp.down_proj.weight", {64, 176}},
      {"model.layers.1.input_layernorm.weight", {64}}};
  for (size_t i = 0; i < expected_head.size(); ++i) {
    EXPECT_EQ(specs[i].name, expected_head[i].first);
    EXPECT_EQ(specs[i].shape, expected_head[i].second) << specs[i].name;
  }
  EXPECT_EQ(specs[specs.size() - 2].name, "model.norm.weight");
  EXPECT_EQ(specs.back().name, "lm_head.weight");
  LlamaConfig tied = tiny;
  tied.tie_word_embeddings = true;
  EXPECT_EQ(hf_tensor_specs(tied).back().name, "model.norm.weight");
}

TEST(LlamaConfig, LinearShapes) {
  const LlamaConfig c = preset_or_fail("llama2-70b");
  EXPECT_EQ(linear_shape(c, "q_proj"), (std::pair<int64_t, int64_t>{8192, 8192}));
  EXPECT_EQ(linear_shape(c, "k_proj"), (std::pair<int64_t, int64_t>{1024, 8192}));
  EXPECT_EQ(linear_shape(c, "v_proj"), (std::pair<int64_t, int64_t>{1024, 8192}));
  EXPECT_EQ(linear_shape(c, "o_proj"), (std::pair<int64_t, int64_t>{8192, 8192}));
  EXPECT_EQ(linear_shape(c, "gate_proj"), (std::pair<int64_t, int64_t>{28672, 8192}));
  EXPECT_EQ(linear_shape(c, "up_proj"), (std::pair<int64_t, int64_t>{28672, 8192}));
  EXPECT_EQ(linear_shape(c, "down_proj"), (std::pair<int64_t, int64_t>{8192, 28672}));
  EXPECT_EQ(linear_shape(c, "lm_head"), (std::pair<int64_t, int64_t>{32000, 8192}));
  EXPECT_EQ(error_of([&] { linear_shape(c, "qproj"); }),
            "unknown linear module 'qproj' (did you mean 'q_proj'?); known modules: q_proj, k_proj, v_proj, o_proj, "
            "gate_proj, up_proj, down_proj, lm_head");
}

// ---- Presets -----------------------------------------------------------------------------------------

TEST(Presets, NamesLookupAndErrors) {
  EXPECT_EQ(preset_names(), (std::vector<std::string>{"tiny", "tinyllama-1.1b", "llama2-7b", "llama2-13b", "llama3-8b",
                                                      "llama3.1-8b", "llama3.2-1b", "llama3.2-3b", "mistral-7b",
                                                      "codellama-34b", "yi-34b", "llama2-70b", "llama3-70b"}));
  EXPECT_TRUE(find_preset("Llama2-7B").has_value());
  EXPECT_FALSE(find_preset("llama2-7").has_value());
  EXPECT_EQ(error_of([] { preset_or_fail("llama2-8b"); }),
            "unknown model preset 'llama2-8b' (did you mean 'llama2-7b'?); known presets: tiny, tinyllama-1.1b, "
            "llama2-7b, llama2-13b, llama3-8b, llama3.1-8b, llama3.2-1b, llama3.2-3b, mistral-7b, codellama-34b, yi-34b, "
            "llama2-70b, llama3-70b");
  EXPECT_EQ(error_of([] { preset_or_fail("gpt-neox-20b-xyz"); }),
            "unknown model preset 'gpt-neox-20b-xyz'; known presets: tiny, tinyllama-1.1b, llama2-7b, llama2-13b, "
            "llama3-8b, llama3.1-8b, llama3.2-1b, llama3.2-3b, mistral-7b, codellama-34b, yi-34b, llama2-70b, "
            "llama3-70b");
  for (const std::string& name : preset_names()) EXPECT_NO_THROW(validate_llama_config(preset_or_fail(name), name));
}

TEST(Presets, PublishedValues) {
  const LlamaConfig tiny = preset_or_fail("tiny");
  EXPECT_EQ(tiny.hidden_size, 64);
  EXPECT_EQ(tiny.intermediate_size, 176);
  EXPECT_EQ(tiny.num_hidden_layers, 2);
  EXPECT_EQ(tiny.num_attention_heads, 4);
  EXPECT_EQ(tiny.num_key_value_heads, 2);
  EXPECT_EQ(tiny.vocab_size, 32000);
  EXPECT_EQ(tiny.max_position_embeddings, 2048);

  const LlamaConfig l31 = preset_or_fail("llama3.1-8b");
  EXPECT_EQ(l31.rope_scaling.type, "llama3");
  EXPECT_EQ(l31.rope_scaling.factor, 8.0);
  EXPECT_EQ(l31.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(l31.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(l31.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(l31.max_position_embeddings, 131072);
  EXPECT_EQ(l31.rope_theta, 500000.0);
  EXPECT_EQ(l31.bos_token_id, 128000);

  // meta-llama/Llama-3.2-1B and -3B config.json.
  const LlamaConfig l32_1b = preset_or_fail("llama3.2-1b"), l32_3b = preset_or_fail("llama3.2-3b");
  EXPECT_TRUE(l32_1b.tie_word_embeddings);
  EXPECT_TRUE(l32_3b.tie_word_embeddings);
  EXPECT_EQ(l32_1b.head_dim, 64);
  EXPECT_EQ(l32_3b.head_dim, 128);
  EXPECT_EQ(l32_1b.rope_scaling.factor, 32.0);
  EXPECT_EQ(l32_3b.num_hidden_layers, 28);
  EXPECT_EQ(l32_3b.num_attention_heads, 24);

  const LlamaConfig mistral = preset_or_fail("mistral-7b");
  EXPECT_EQ(mistral.model_type, "mistral");
  EXPECT_EQ(mistral.sliding_window, 4096);
  EXPECT_EQ(mistral.max_position_embeddings, 32768);
  EXPECT_EQ(mistral.num_key_value_heads, 8);

  EXPECT_EQ(preset_or_fail("codellama-34b").rope_theta, 1e6);
  EXPECT_EQ(preset_or_fail("codellama-34b").max_position_embeddings, 16384);
  EXPECT_EQ(preset_or_fail("yi-34b").rope_theta, 5e6);
  EXPECT_EQ(preset_or_fail("yi-34b").head_dim, 128);
  EXPECT_EQ(preset_or_fail("yi-34b").vocab_size, 64000);
  EXPECT_EQ(preset_or_fail("llama3-70b").num_key_value_heads, 8);
  EXPECT_EQ(preset_or_fail("tinyllama-1.1b").num_key_value_heads, 4);
}

}  // namespace
}  // namespace fsdpq
