// PEFT LoRA adapters on disk: the exact files save_pretrained writes, reading them back, the names
// older PEFT versions used, and the catalogue of damaged adapters with their messages.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <random>

#include "io/peft_adapter.h"
#include "io/safetensors.h"
#include "test_support.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;
using test::error_of;

Tensor random_tensor(int64_t rows, int64_t cols, uint32_t seed) {
  Tensor t = Tensor::empty(Shape{rows, cols}, DType::F32);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = dist(gen);
  return t;
}

// A small adapter: r = 4 on q_proj [64 → 64] and down_proj [176 → 64] of two layers.
struct SmallAdapter {
  AdapterConfig config;
  std::vector<std::pair<std::string, Tensor>> owned;

  SmallAdapter() {
    config.r = 4;
    config.lora_alpha = 16;
    config.lora_dropout = 0.1;
    config.target_modules = {"q_proj", "down_proj"};
    config.base_model_name_or_path = "models/tiny";
    uint32_t seed = 1;
    for (int64_t layer = 0; layer < 2; ++layer) {
      owned.emplace_back(adapter_tensor_name(layer, "q_proj", true), random_tensor(4, 64, seed++));
      owned.emplace_back(adapter_tensor_name(layer, "q_proj", false), random_tensor(64, 4, seed++));
      owned.emplace_back(adapter_tensor_name(layer, "down_proj", true), random_tensor(4, 176, seed++));
      owned.emplace_back(adapter_tensor_name(layer, "down_proj", false), random_tensor(64, 4, seed++));
    }
  }
  std::vector<std::pair<std::string, const Tensor*>> views() const {
    std::vector<std::pair<std::string, const Tensor*>> out;
    for (const auto& [name, t] : owned) out.emplace_back(name, &t);
    return out;
  }
};

std::vector<float> values(const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); }

TEST(PeftAdapter, TensorNames) {
  EXPECT_EQ(adapter_tensor_name(3, "q_proj", true), "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(adapter_tensor_name(0, "up_proj", false), "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight");

  auto parsed = parse_adapter_tensor_name("base_model.model.model.layers.12.mlp.down_proj.lora_B.weight");
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->layer, 12);
  EXPECT_EQ(parsed->module, "down_proj");
  EXPECT_FALSE(parsed->is_a);
  EXPECT_EQ(parsed->base_weight_name(), "model.layers.12.mlp.down_proj.weight");
  // Older PEFT kept the adapter name.
  parsed = parse_adapter_tensor_name("base_model.model.model.layers.0.self_attn.v_proj.lora_A.default.weight");
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->peft_name(), "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight");

  // DoRA's magnitude: as save_pretrained writes it, and as a state dict holds it.
  EXPECT_EQ(magnitude_tensor_name(2, "gate_proj"), "base_model.model.model.layers.2.mlp.gate_proj.lora_magnitude_vector");
  for (const char* name : {"base_model.model.model.layers.2.mlp.gate_proj.lora_magnitude_vector",
                           "base_model.model.model.layers.2.mlp.gate_proj.lora_magnitude_vector.default",
                           "base_model.model.model.layers.2.mlp.gate_proj.lora_magnitude_vector.default.weight"}) {
    parsed = parse_adapter_tensor_name(name);
    ASSERT_TRUE(parsed) << name;
    EXPECT_TRUE(parsed->is_magnitude);
    EXPECT_FALSE(parsed->is_a);
    EXPECT_EQ(parsed->peft_name(), "base_model.model.model.layers.2.mlp.gate_proj.lora_magnitude_vector");
    EXPECT_EQ(parsed->base_weight_name(), "model.layers.2.mlp.gate_proj.weight");
  }

  for (const char* bad : {"base_model.model.model.layers.0.mlp.q_proj.lora_A.weight",        // wrong parent
                          "base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight",  // not a Llama linear
                          "base_model.model.model.layers.01.self_attn.q_proj.lora_A.weight",   // not canonical
                          "base_model.model.model.layers.0.self_attn.q_proj.lora_C.weight",
                          "base_model.model.model.layers.0.self_attn.q_proj.lora_A.other.weight",
                          "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector.weight",
                          "base_model.model.lm_head.lora_A.weight", "model.layers.0.self_attn.q_proj.weight",
                          "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight.x"})
    EXPECT_FALSE(parse_adapter_tensor_name(bad)) << bad;
}

// What PEFT's LoraConfig.save_pretrained writes (json.dumps(indent=2, sort_keys=True), no final
// newline), for the fields that PEFT 0.10 and later all know.
TEST(PeftAdapter, ConfigFileIsPeftsText) {
  const fs::path dir = test::make_temp_dir("peft_config");
  SmallAdapter a;
  save_peft_adapter(dir, a.config, a.views(), DType::F32);
  EXPECT_EQ(test::read_file(dir / "adapter_config.json"), R"({
  "alpha_pattern": {},
  "auto_mapping": null,
  "base_model_name_or_path": "models/tiny",
  "bias": "none",
  "fan_in_fan_out": false,
  "inference_mode": true,
  "init_lora_weights": true,
  "layer_replication": null,
  "layers_pattern": null,
  "layers_to_transform": null,
  "loftq_config": {},
  "lora_alpha": 16,
  "lora_dropout": 0.1,
  "megatron_config": null,
  "megatron_core": "megatron.core",
  "modules_to_save": null,
  "peft_type": "LORA",
  "r": 4,
  "rank_pattern": {},
  "revision": null,
  "target_modules": [
    "q_proj",
    "down_proj"
  ],
  "task_type": "CAUSAL_LM",
  "use_dora": false,
  "use_rslora": false
})");
  // A fractional alpha stays exact; no base model is null.
  a.config.lora_alpha = 2.5;
  a.config.base_model_name_or_path = "";
  const auto j = adapter_config_json(a.config);
  EXPECT_EQ(j["lora_alpha"].dump(), "2.5");
  EXPECT_TRUE(j["base_model_name_or_path"].is_null());
}

TEST(PeftAdapter, SaveAndLoadRoundTripF32) {
  const fs::path dir = test::make_temp_dir("peft_f32") / "adapter";  // created by the save
  SmallAdapter a;
  save_peft_adapter(dir, a.config, a.views(), DType::F32);

  // The safetensors file: PEFT's names in the given order, F32, metadata format = pt.
  const SafetensorsFile file = SafetensorsFile::open(dir / "adapter_model.safetensors");
  ASSERT_EQ(file.tensors().size(), a.owned.size());
  for (size_t i = 0; i < a.owned.size(); ++i) {
    EXPECT_EQ(file.tensors()[i].name, a.owned[i].first);
    EXPECT_EQ(file.tensors()[i].dtype, DType::F32);
  }
  EXPECT_EQ(file.metadata().at("format"), "pt");
  // Nothing temporary left behind.
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_TRUE(entry.path().filename() == "adapter_config.json" || entry.path().filename() == "adapter_model.safetensors")
        << entry.path();

  const LoadedAdapter back = load_peft_adapter(dir);
  EXPECT_EQ(back.config.r, 4);
  EXPECT_EQ(back.config.lora_alpha, 16);
  EXPECT_DOUBLE_EQ(back.config.lora_dropout, 0.1);
  EXPECT_EQ(back.config.target_modules, (std::vector<std::string>{"q_proj", "down_proj"}));
  EXPECT_EQ(back.config.base_model_name_or_path, "models/tiny");
  EXPECT_DOUBLE_EQ(back.config.scaling(), 4.0);
  // Sorted by layer, then module in HF order (q before down), A before B: here the saving order.
  ASSERT_EQ(back.tensors.size(), a.owned.size());
  for (size_t i = 0; i < a.owned.size(); ++i) {
    EXPECT_EQ(back.tensors[i].first, a.owned[i].first);
    EXPECT_EQ(back.tensors[i].second.shape(), a.owned[i].second.shape());
    EXPECT_EQ(values(back.tensors[i].second), values(a.owned[i].second)) << a.owned[i].first;
  }
  ASSERT_NE(back.find(adapter_tensor_name(1, "down_proj", true)), nullptr);
  EXPECT_EQ(back.find(adapter_tensor_name(1, "up_proj", true)), nullptr);
}

TEST(PeftAdapter, Bf16StorageRoundsToNearestEven) {
  const fs::path dir = test::make_temp_dir("peft_bf16");
  SmallAdapter a;
  save_peft_adapter(dir, a.config, a.views(), DType::BF16);
  const SafetensorsFile file = SafetensorsFile::open(dir / "adapter_model.safetensors");
  for (const auto& t : file.tensors()) EXPECT_EQ(t.dtype, DType::BF16);
  const LoadedAdapter back = load_peft_adapter(dir);
  for (size_t i = 0; i < a.owned.size(); ++i) {
    std::vector<float> want = values(a.owned[i].second);
    for (float& v : want) v = round_bf16(v);
    EXPECT_EQ(values(back.tensors[i].second), want);
  }
}

TEST(PeftAdapter, SavingAgainReplacesTheAdapter) {
  const fs::path dir = test::make_temp_dir("peft_again");
  SmallAdapter a;
  save_peft_adapter(dir, a.config, a.views(), DType::F32);
  a.owned[0].second.data<float>()[0] = 42.0f;
  a.config.r = 4;
  a.config.lora_alpha = 8;
  save_peft_adapter(dir, a.config, a.views(), DType::F32);
  const LoadedAdapter back = load_peft_adapter(dir);
  EXPECT_EQ(back.config.lora_alpha, 8);
  EXPECT_EQ(back.tensors[0].second.data<float>()[0], 42.0f);
}

TEST(PeftAdapter, SaveRefusesInconsistentTensors) {
  const fs::path dir = test::make_temp_dir("peft_bad_save");
  const std::string where = "saving the adapter to '" + dir.string() + "': ";
  SmallAdapter a;
  a.config.r = 8;
  EXPECT_EQ(error_of([&] { save_peft_adapter(dir, a.config, a.views(), DType::F32); }),
            where + "tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' has shape [4, 64], which "
                    "does not agree with r = 8");
  a.config.r = 4;
  auto views = a.views();
  views.pop_back();
  EXPECT_EQ(error_of([&] { save_peft_adapter(dir, a.config, views, DType::F32); }),
            where + "tensor 'base_model.model.model.layers.1.mlp.down_proj.lora_A.weight' has no partner "
                    "'base_model.model.model.layers.1.mlp.down_proj.lora_B.weight'");
  views = a.views();
  views[0].first = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight";
  EXPECT_EQ(error_of([&] { save_peft_adapter(dir, a.config, views, DType::F32); }),
            where + "'base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight' is not a PEFT LoRA "
                    "tensor name (expected e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight)");
  a.config.target_modules = {"q_proj"};
  EXPECT_EQ(error_of([&] { save_peft_adapter(dir, a.config, a.views(), DType::F32); }),
            where + "tensor 'base_model.model.model.layers.0.mlp.down_proj.lora_A.weight' adapts down_proj, which "
                    "target_modules (q_proj) does not list");
  a.config.target_modules = {"q_proj", "down_prj"};
  EXPECT_EQ(error_of([&] { save_peft_adapter(dir, a.config, a.views(), DType::F32); }),
            where + "target module 'down_prj' is not a Llama decoder linear (did you mean 'down_proj'?) (fsdpq adapts "
                    "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  a.config.target_modules = {"q_proj", "down_proj"};
  EXPECT_EQ(error_of([&] { save_peft_adapter(dir, a.config, a.views(), DType::F16); }),
            where + "adapters are stored as F32 or BF16, not F16");
  // Nothing was written by the refused saves.
  EXPECT_TRUE(fs::is_empty(dir));
}

// ---- Adapters written by others (PEFT, older PEFT, damaged) -------------------------------------

struct RawTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

// Writes adapter_model.safetensors with zero-filled tensors and the given config text.
void write_raw_adapter(const fs::path& dir, const std::vector<RawTensor>& tensors, const std::string& config) {
  std::vector<std::pair<TensorSpec, std::vector<std::byte>>> data;
  for (const auto& t : tensors) {
    TensorSpec spec{t.name, t.dtype, t.shape};
    data.emplace_back(spec, std::vector<std::byte>(spec.nbytes()));
  }
  fs::create_directories(dir);
  write_safetensors(dir / "adapter_model.safetensors", data, {{"format", "pt"}});
  test::write_file(dir / "adapter_config.json", config);
}

const std::string kMinimalConfig =
    R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["v_proj"]})";

std::vector<RawTensor> v_proj_pair(const std::string& infix = "") {
  return {{"base_model.model.model.layers.0.self_attn.v_proj.lora_A" + infix + ".weight", DType::F32, {2, 64}},
          {"base_model.model.model.layers.0.self_attn.v_proj.lora_B" + infix + ".weight", DType::F32, {32, 2}}};
}

TEST(PeftAdapter, ReadsOlderNamesAndMinimalConfigs) {
  const fs::path dir = test::make_temp_dir("peft_old");
  write_raw_adapter(dir, v_proj_pair(".default"), kMinimalConfig);
  const LoadedAdapter a = load_peft_adapter(dir);
  EXPECT_EQ(a.config.r, 2);
  EXPECT_EQ(a.config.lora_dropout, 0);  // PEFT's default
  ASSERT_EQ(a.tensors.size(), 2u);
  EXPECT_EQ(a.tensors[0].first, "base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight");
  EXPECT_EQ(a.tensors[1].first, "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight");

  // BF16 weights are widened; null target_modules means PEFT's Llama default (q_proj, v_proj);
  // "all-linear" every linear; unused features written as null / false / {} are fine.
  write_raw_adapter(dir,
                    {{"base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight", DType::BF16, {2, 64}},
                     {"base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight", DType::BF16, {32, 2}}},
                    R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4.5, "target_modules": null, "use_dora": false,
                        "rank_pattern": {}, "modules_to_save": null, "lora_bias": false, "bias": "none"})");
  const LoadedAdapter b = load_peft_adapter(dir);
  EXPECT_EQ(b.config.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(b.config.lora_alpha, 4.5);
  EXPECT_EQ(b.tensors[0].second.dtype(), DType::F32);
  test::write_file(dir / "adapter_config.json", R"({"peft_type": "LORA", "r": 2, "target_modules": "all-linear"})");
  EXPECT_EQ(load_adapter_config(dir).target_modules.size(), 7u);
  EXPECT_EQ(load_adapter_config(dir).lora_alpha, 8);  // PEFT's default
}

TEST(PeftAdapter, DamagedAdaptersAreNamed) {
  const fs::path root = test::make_temp_dir("peft_damaged");
  const fs::path dir = root / "a";
  const std::string config_where = "'" + (dir / "adapter_config.json").string() + "': ";
  const std::string file_where = "adapter '" + (dir / "adapter_model.safetensors").string() + "': ";
  auto load_error = [&] { return error_of([&] { load_peft_adapter(dir); }); };

  EXPECT_EQ(load_error(), "adapter directory '" + dir.string() + "' does not exist or is not a directory");
  fs::create_directories(dir);
  EXPECT_EQ(load_error(), "adapter directory '" + dir.string() +
                              "' has no adapter_config.json (a PEFT adapter has adapter_config.json and "
                              "adapter_model.safetensors)");
  test::write_file(dir / "adapter_config.json", kMinimalConfig);
  EXPECT_EQ(load_error(), "adapter directory '" + dir.string() + "' has no adapter_model.safetensors");
  test::write_file(dir / "adapter_model.bin", "pickle");
  EXPECT_EQ(load_error(), "adapter directory '" + dir.string() +
                              "' has no adapter_model.safetensors; it holds adapter_model.bin (PyTorch pickle), which "
                              "fsdpq does not read: save the adapter with safe_serialization=True");

  struct Case {
    std::string config;
    std::string message;
  };
  const std::vector<Case> config_cases = {
      {R"({"peft_type": "LORA", "r": 2,)", config_where + "not valid JSON (error at byte 30)"},
      {R"([1, 2])", config_where + "expected a JSON object, found array"},
      {R"({"r": 2})", config_where + "peft_type is missing; a PEFT LoRA adapter has \"peft_type\": \"LORA\""},
      {R"({"peft_type": "IA3", "r": 2})",
       config_where + "peft_type is 'IA3'; fsdpq reads LoRA adapters only (\"peft_type\": \"LORA\")"},
      {R"({"peft_type": "LORA", "r": "8"})",
       config_where + "key 'r' must be a positive integer (the LoRA rank), found \"8\""},
      {R"({"peft_type": "LORA", "lora_alpha": 16})",
       config_where + "key 'r' must be a positive integer (the LoRA rank), found nothing"},
      {R"({"peft_type": "LORA", "r": 2, "lora_dropout": 1.0})",
       config_where + "key 'lora_dropout' must be a number in [0, 1), found 1.0"},
      {R"({"peft_type": "LORA", "r": 2, "target_modules": ".*q_proj"})",
       config_where + "target_modules is the regular expression '.*q_proj', which fsdpq does not apply; list the "
                      "module names instead (e.g. [\"q_proj\", \"v_proj\"])"},
      {R"({"peft_type": "LORA", "r": 2, "target_modules": ["q_proj", "lm_head"]})",
       config_where + "target module 'lm_head' is not a Llama decoder linear (fsdpq adapts q_proj, k_proj, v_proj, "
                      "o_proj, gate_proj, up_proj, down_proj)"},
      {R"({"peft_type": "LORA", "r": 2, "use_dora": "yes"})",
       config_where + "key 'use_dora' must be true or false, found \"yes\""},
      {R"({"peft_type": "LORA", "r": 2, "use_rslora": true})",
       config_where + "use_rslora is true; fsdpq does not support rank-stabilised LoRA (scaling alpha/sqrt(r))"},
      {R"({"peft_type": "LORA", "r": 2, "modules_to_save": ["lm_head"]})",
       config_where + "modules_to_save is [\"lm_head\"]; fsdpq does not support fully trained extra modules "
                      "(modules_to_save)"},
      {R"({"peft_type": "LORA", "r": 2, "bias": "all"})",
       config_where + "bias is \"all\"; fsdpq applies adapters without biases (\"bias\": \"none\")"},
  };
  for (const auto& c : config_cases) {
    test::write_file(dir / "adapter_config.json", c.config);
    EXPECT_EQ(load_error(), c.message) << c.config;
  }

  const std::vector<std::pair<std::vector<RawTensor>, std::string>> tensor_cases = {
      {{{"base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight", DType::F32, {3, 64}},
        {"base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight", DType::F32, {32, 2}}},
       file_where + "tensor 'base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight' has shape [3, 64], "
                    "expected [r, in_features] with r = 2 (adapter_config.json)"},
      {{{"base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight", DType::F32, {2, 64}},
        {"base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight", DType::F32, {32, 2, 1}}},
       file_where + "tensor 'base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight' has shape [32, 2, 1], "
                    "expected a matrix [out_features, r]"},
      {{{"base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight", DType::F32, {2, 64}}},
       file_where + "tensor 'base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight' is there but its "
                    "partner 'base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight' is missing"},
      {{{"base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight", DType::F32, {2, 64}},
        {"base_model.model.model.layers.0.self_attn.v_proj.lora_A.default.weight", DType::F32, {2, 64}},
        {"base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight", DType::F32, {32, 2}}},
       file_where + "tensor 'base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight' appears twice (with "
                    "and without the adapter name 'default')"},
      {{{"base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight", DType::I32, {2, 64}}},
       file_where + "tensor 'base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight' is I32, expected F32, "
                    "BF16 or F16"},
      {{{"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", DType::F32, {2, 64}}},
       file_where + "tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' adapts q_proj, which "
                    "target_modules (v_proj) in adapter_config.json does not list"},
      {{{"base_model.model.model.layers.0.self_attn.v_proj.lora_magnitude_vector.weight", DType::F32, {32}}},
       file_where + "tensor 'base_model.model.model.layers.0.self_attn.v_proj.lora_magnitude_vector.weight' is not "
                    "a LoRA weight of a Llama linear (expected names like "
                    "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight)"},
      {{}, file_where + "the file holds no LoRA tensors"},
  };
  for (const auto& [tensors, message] : tensor_cases) {
    write_raw_adapter(dir, tensors, kMinimalConfig);
    EXPECT_EQ(load_error(), message);
  }

  // DoRA: the magnitude needs use_dora, has lora_B's rows, and completes every pair.
  const std::string dora_config =
      R"({"peft_type": "LORA", "r": 2, "lora_alpha": 4, "target_modules": ["v_proj"], "use_dora": true})";
  const std::string magnitude = "base_model.model.model.layers.0.self_attn.v_proj.lora_magnitude_vector";
  std::vector<RawTensor> triple = v_proj_pair();
  triple.push_back({magnitude, DType::F32, {32}});
  write_raw_adapter(dir, triple, kMinimalConfig);
  EXPECT_EQ(load_error(), file_where + "tensor '" + magnitude +
                              "' is a DoRA magnitude vector but adapter_config.json does not set \"use_dora\": true");
  triple.back().shape = {31};
  write_raw_adapter(dir, triple, dora_config);
  EXPECT_EQ(load_error(), file_where + "tensor '" + magnitude +
                              "' has 31 values, but base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight "
                              "has 32 output rows: a DoRA magnitude vector holds one value per output row");
  triple.back().shape = {32, 1};
  write_raw_adapter(dir, triple, dora_config);
  EXPECT_EQ(load_error(), file_where + "tensor '" + magnitude + "' has shape [32, 1], expected a vector [out_features]");
  write_raw_adapter(dir, v_proj_pair(), dora_config);
  EXPECT_EQ(load_error(), file_where +
                              "tensor 'base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight' is there but "
                              "its partner '" + magnitude + "' is missing (adapter_config.json sets \"use_dora\": true)");
}

// A DoRA adapter round-trips: use_dora in the config, each magnitude under PEFT's saved name.
TEST(PeftAdapter, DoraAdapterRoundTrips) {
  const fs::path dir = test::make_temp_dir("peft_dora");
  SmallAdapter a;
  a.config.use_dora = true;
  for (int64_t layer = 0; layer < 2; ++layer)
    for (const char* module : {"q_proj", "down_proj"}) {
      Tensor m = Tensor::empty(Shape{64}, DType::F32);
      for (int64_t i = 0; i < 64; ++i) m.data<float>()[i] = 1.0f + 0.01f * static_cast<float>(i + layer);
      a.owned.emplace_back(magnitude_tensor_name(layer, module), std::move(m));
    }
  save_peft_adapter(dir, a.config, a.views(), DType::F32);
  EXPECT_NE(test::read_file(dir / "adapter_config.json").find("\"use_dora\": true"), std::string::npos);
  const LoadedAdapter loaded = load_peft_adapter(dir);
  EXPECT_TRUE(loaded.config.use_dora);
  ASSERT_EQ(loaded.tensors.size(), a.owned.size());
  // Sorted per layer and module: A, B, magnitude.
  EXPECT_EQ(loaded.tensors[2].first, magnitude_tensor_name(0, "q_proj"));
  for (const auto& [name, t] : a.owned) {
    const Tensor* back = loaded.find(name);
    ASSERT_NE(back, nullptr) << name;
    EXPECT_EQ(back->shape(), t.shape()) << name;
    EXPECT_EQ(values(*back), values(t)) << name;
  }
  // Saving a magnitude without use_dora, or use_dora without the magnitudes, is refused.
  a.config.use_dora = false;
  EXPECT_THROW(save_peft_adapter(dir, a.config, a.views(), DType::F32), UserError);
  SmallAdapter plain;
  plain.config.use_dora = true;
  EXPECT_THROW(save_peft_adapter(dir, plain.config, plain.views(), DType::F32), UserError);
}

}  // namespace
}  // namespace fsdpq
