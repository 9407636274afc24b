// `fsdpq merge`: a LoRA adapter folded into its base model, checked against an fp64 computation,
// bit for bit where the adapter is a no-op, and the catalogue of mismatched inputs.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "io/model_files.h"
#include "io/peft_adapter.h"
#include "model/llama_config.h"
#include "random_adapter.h"
#include "test_support.h"
#include "tiny_model_suite.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;
using test::error_message;
using test::quoted;
using test::run_fsdpq;

std::vector<uint16_t> bf16_values(const ModelWeights& w, const std::string& name) {
  auto bytes = w.bytes(name);
  std::vector<uint16_t> out(bytes.size() / 2);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

// The nearest bf16 to a double (ties to even), and whether d is so close to the midpoint between
// two bf16 values that an fp32 computation with error below `tolerance` may round either way.
uint16_t nearest_bf16(double d) {
  const uint16_t guess = float_to_bf16(static_cast<float>(d));
  uint16_t best = guess;
  for (int delta : {-1, 1}) {
    const uint16_t c = static_cast<uint16_t>(guess + delta);
    if ((c & 0x8000) != (guess & 0x8000) || std::isnan(bf16_to_float(c))) continue;
    const double dc = std::fabs(bf16_to_float(c) - d), db = std::fabs(bf16_to_float(best) - d);
    if (dc < db || (dc == db && (c & 1) == 0)) best = c;
  }
  return best;
}
bool near_a_midpoint(double d, uint16_t nearest, double tolerance) {
  for (int delta : {-1, 1}) {
    const double neighbour = bf16_to_float(static_cast<uint16_t>(nearest + delta));
    if (std::isfinite(neighbour) && std::fabs(d - (neighbour + bf16_to_float(nearest)) / 2) <= tolerance) return true;
  }
  return false;
}

class Merge : public test::TinyModelSuite<Merge> {
 protected:
  static void SetUpTestSuite() { make_tiny_model("merge", 1); }

  // An adapter over `targets` of every layer (or the first `layers`), A ~ U(-0.5, 0.5),
  // B ~ U(-b_range, b_range) (0: B = 0), with DoRA magnitudes when `dora`.
  static fs::path make_adapter(const std::string& name, int64_t r, double alpha, const std::vector<std::string>& targets,
                               float b_range, int64_t layers = -1, bool dora = false) {
    return test::write_random_adapter(dir_ / name, config_,
                                      {.r = r,
                                       .alpha = alpha,
                                       .targets = targets,
                                       .b_range = b_range,
                                       .layers = layers,
                                       .dora = dora,
                                       .seed = static_cast<uint32_t>(r * 1000 + name.size())});
  }

  static test::CommandResult merge(const fs::path& model, const fs::path& adapter, const fs::path& out,
                                   const std::string& extra = "") {
    return run_fsdpq("merge --model " + quoted(model) + " --adapter " + quoted(adapter) + " --out " + quoted(out) +
                     " " + extra);
  }
};

const std::vector<std::string> kAllLinears = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

TEST_F(Merge, MergedWeightsEqualAnFp64ComputationRoundedToBf16) {
  // r = 3, alpha = 5: a scaling (5/3) that is not a power of two.
  const fs::path adapter_dir = make_adapter("adapter_all", 3, 5.0, kAllLinears, 0.05f);
  const fs::path out = dir_ / "merged";
  auto r = merge(dir_ / "model", adapter_dir, out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("merge: folded 14 LoRA pairs (r = 3, scaling lora_alpha / r = 1.6666666666666667)"),
            std::string::npos) << r.output;

  const ModelWeights base = ModelWeights::open(dir_ / "model");
  const ModelWeights merged = ModelWeights::open(out);
  const LoadedAdapter adapter = load_peft_adapter(adapter_dir);
  const double scaling = 5.0 / 3.0;
  // Every tensor of the model, in HF order, bf16.
  std::vector<std::string> want_names;
  for (const auto& spec : hf_tensor_specs(config_)) want_names.push_back(spec.name);
  EXPECT_EQ(merged.tensor_names(), want_names);

  int64_t compared = 0, near_midpoint = 0, changed = 0;
  for (const auto& spec : hf_tensor_specs(config_)) {
    EXPECT_EQ(merged.find(spec.name)->dtype, DType::BF16);
    const auto w = bf16_values(base, spec.name);
    const auto got = bf16_values(merged, spec.name);
    bool adapted = false;
    for (const auto& module : kAllLinears)
      if (spec.name.find("." + module + ".") != std::string::npos) adapted = true;
    if (!adapted) {
      EXPECT_EQ(got, w) << spec.name << " is not adapted and must be copied";
      continue;
    }
    const std::string layer = spec.name.substr(std::string("model.layers.").size());
    const auto parsed_layer = std::stoll(layer.substr(0, layer.find('.')));
    const std::string without_weight = spec.name.substr(0, spec.name.size() - std::string(".weight").size());
    const std::string module = without_weight.substr(without_weight.rfind('.') + 1);
    const Tensor* a = adapter.find(adapter_tensor_name(parsed_layer, module, true));
    const Tensor* b = adapter.find(adapter_tensor_name(parsed_layer, module, false));
    ASSERT_TRUE(a && b) << spec.name << " → " << module;
    const int64_t out_features = spec.shape[0], in_features = spec.shape[1], rank = 3;
    for (int64_t o = 0; o < out_features; ++o)
      for (int64_t i = 0; i < in_features; ++i) {
        double product = 0, magnitude = 0;
        for (int64_t k = 0; k < rank; ++k) {
          const double term = static_cast<double>(b->data<float>()[o * rank + k]) * a->data<float>()[k * in_features + i];
          product += term;
          magnitude += std::fabs(term);
        }
        const size_t index = static_cast<size_t>(o * in_features + i);
        const double base_value = bf16_to_float(w[index]);
        const double exact = base_value + scaling * product;
        const uint16_t want = nearest_bf16(exact);
        // fp32 error of the sum, the scaling and the addition: far below 2^-20 of the magnitudes.
        const double tolerance = 0x1.0p-20 * (std::fabs(base_value) + scaling * magnitude);
        ++compared;
        changed += got[index] != w[index];
        if (got[index] == want) continue;
        if (near_a_midpoint(exact, want, tolerance) && std::abs(int(got[index]) - int(want)) == 1) {
          ++near_midpoint;
          continue;
        }
        ADD_FAILURE() << spec.name << "[" << o << ", " << i << "]: merged " << bf16_to_float(got[index])
                      << ", fp64 gives " << exact << " → " << bf16_to_float(want);
        return;
      }
  }
  EXPECT_EQ(compared, 92160);  // 2 layers × (q, k, v, o, gate, up, down)
  EXPECT_GT(changed, compared / 2) << "the adapter should change most weights";
  EXPECT_LT(near_midpoint, compared / 1000) << "fp32 rounding ties should be rare";
  std::printf("merge: %lld weights compared, %lld changed, %lld within fp32 error of a bf16 midpoint\n",
              static_cast<long long>(compared), static_cast<long long>(changed), static_cast<long long>(near_midpoint));

  // config.json is the base's, now saying bfloat16; the other files are copied.
  auto base_config = nlohmann::json::parse(test::read_file(dir_ / "model" / "config.json"));
  auto merged_config = nlohmann::json::parse(test::read_file(out / "config.json"));
  EXPECT_EQ(merged_config["torch_dtype"], "bfloat16");
  base_config["torch_dtype"] = "bfloat16";
  EXPECT_EQ(merged_config, base_config);
  EXPECT_EQ(test::read_file(out / "generation_config.json"), test::read_file(dir_ / "model" / "generation_config.json"));
  EXPECT_FALSE(fs::exists(out / "tokenizer.model"));  // the base has none

  // Sharded output holds the same tensors.
  const fs::path sharded = dir_ / "merged_sharded";
  r = merge(dir_ / "model", adapter_dir, sharded, "--max_shard_size 100000");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(fs::exists(sharded / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(sharded / "model.safetensors"));
  const ModelWeights shards = ModelWeights::open(sharded);
  EXPECT_GT(shards.file_count(), 2u);
  for (const auto& name : want_names) EXPECT_EQ(bf16_values(shards, name), bf16_values(merged, name)) << name;
}

// DoRA: W' = (m / ‖W + s·B·A‖_row) ⊙ (W + s·B·A), as PEFT's merge, against fp64 rounded to bf16.
TEST_F(Merge, DoraMergeFoldsTheMagnitudeAsPeft) {
  const fs::path adapter_dir = make_adapter("adapter_dora", 4, 8.0, {"v_proj", "gate_proj"}, 0.05f, -1, true);
  const fs::path out = dir_ / "merged_dora";
  auto r = merge(dir_ / "model", adapter_dir, out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const ModelWeights base = ModelWeights::open(dir_ / "model"), merged = ModelWeights::open(out);
  const LoadedAdapter adapter = load_peft_adapter(adapter_dir);
  const double scaling = 8.0 / 4.0;
  int64_t compared = 0, near_midpoint = 0;
  for (int64_t layer = 0; layer < config_.num_hidden_layers; ++layer)
    for (const std::string module : {"v_proj", "gate_proj"}) {
      const std::string name = fmt::format("model.layers.{}.{}.{}.weight", layer,
                                           module == "v_proj" ? "self_attn" : "mlp", module);
      const std::vector<uint16_t> w = bf16_values(base, name), got = bf16_values(merged, name);
      const Tensor& A = *adapter.find(adapter_tensor_name(layer, module, true));
      const Tensor& B = *adapter.find(adapter_tensor_name(layer, module, false));
      const Tensor& m = *adapter.find(magnitude_tensor_name(layer, module));
      const int64_t rows = B.shape()[0], rank = B.shape()[1], cols = A.shape()[1];
      for (int64_t o = 0; o < rows; ++o) {
        std::vector<double> v(static_cast<size_t>(cols));
        double square_sum = 0;
        for (int64_t i = 0; i < cols; ++i) {
          double delta = 0;
          for (int64_t k = 0; k < rank; ++k) delta += static_cast<double>(B.data<float>()[o * rank + k]) * A.data<float>()[k * cols + i];
          v[static_cast<size_t>(i)] = bf16_to_float(w[static_cast<size_t>(o * cols + i)]) + scaling * delta;
          square_sum += v[static_cast<size_t>(i)] * v[static_cast<size_t>(i)];
        }
        const double factor = m.data<float>()[o] / std::sqrt(square_sum);
        for (int64_t i = 0; i < cols; ++i) {
          const double want = factor * v[static_cast<size_t>(i)];
          const uint16_t nearest = nearest_bf16(want);
          ++compared;
          if (near_a_midpoint(want, nearest, 1e-5 * std::fabs(want))) {
            ++near_midpoint;
            continue;
          }
          EXPECT_EQ(got[static_cast<size_t>(o * cols + i)], nearest) << name << " [" << o << ", " << i << "]";
        }
      }
    }
  EXPECT_GT(compared, 0);
  EXPECT_LT(near_midpoint, compared / 100);
  // Unadapted weights are the base's bits.
  EXPECT_EQ(bf16_values(merged, "model.layers.0.self_attn.q_proj.weight"),
            bf16_values(base, "model.layers.0.self_attn.q_proj.weight"));
}

TEST_F(Merge, ZeroBAdapterMergesToTheBaseBitForBit) {
  // A copy of the model with a tokenizer.model, which is copied as it is.
  const fs::path model = dir_ / "model_with_tokenizer";
  fs::copy(dir_ / "model", model, fs::copy_options::recursive);
  test::write_file(model / "tokenizer.model", std::string("not really sentencepiece\0\1\2", 28));
  const fs::path adapter = make_adapter("adapter_zero", 8, 16.0, {"q_proj", "v_proj", "down_proj"}, 0.0f);
  const fs::path out = dir_ / "merged_zero";
  auto r = merge(model, adapter, out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const ModelWeights base = ModelWeights::open(model);
  const ModelWeights merged = ModelWeights::open(out);
  for (const auto& name : base.tensor_names()) EXPECT_EQ(bf16_values(merged, name), bf16_values(base, name)) << name;
  EXPECT_EQ(test::read_file(out / "tokenizer.model"), test::read_file(model / "tokenizer.model"));

  // --overwrite replaces a merged model; without it a non-empty --out is refused.
  r = merge(model, adapter, out);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(error_message(r.output),
            "merge: output directory '" + out.string() + "' is not empty; choose another or pass --overwrite");
  r = merge(model, adapter, out, "--overwrite");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(bf16_values(ModelWeights::open(out), "model.layers.1.mlp.down_proj.weight"),
            bf16_values(base, "model.layers.1.mlp.down_proj.weight"));
}

TEST_F(Merge, F32BaseWeightsAreRoundedToBf16) {
  // The tiny model re-saved in F32 with values that are not bf16 numbers.
  const fs::path model = dir_ / "model_f32";
  fs::create_directories(model);
  fs::copy_file(dir_ / "model" / "config.json", model / "config.json");
  const ModelWeights base = ModelWeights::open(dir_ / "model");
  std::vector<TensorSpec> specs = hf_tensor_specs(config_);
  for (auto& s : specs) s.dtype = DType::F32;
  std::map<std::string, std::vector<uint16_t>> base_values;
  for (const auto& s : specs) base_values[s.name] = bf16_values(base, s.name);
  auto f32_value = [&](const std::string& name, size_t i) {
    return bf16_to_float(base_values.at(name)[i]) * 1.0031f;  // 0.8 of a bf16 step (2^-8) away from the base value
  };
  write_model_weights(model, specs, [&](size_t t, uint64_t offset, std::span<std::byte> chunk) {
    float* dst = reinterpret_cast<float*>(chunk.data());
    for (size_t i = 0; i < chunk.size() / 4; ++i) dst[i] = f32_value(specs[t].name, offset / 4 + i);
  });
  const fs::path adapter = make_adapter("adapter_zero_f32", 2, 4.0, {"o_proj"}, 0.0f);
  auto r = merge(model, adapter, dir_ / "merged_f32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const ModelWeights merged = ModelWeights::open(dir_ / "merged_f32");
  for (const char* name : {"model.embed_tokens.weight", "model.layers.0.self_attn.o_proj.weight", "lm_head.weight"}) {
    const auto got = bf16_values(merged, name);
    ASSERT_EQ(merged.find(name)->dtype, DType::BF16);
    size_t differs_from_base = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i], float_to_bf16(f32_value(name, i))) << name << "[" << i << "]";
      differs_from_base += got[i] != base_values.at(name)[i];
    }
    EXPECT_GT(differs_from_base, 0u) << "the F32 values should not all round back to the bf16 base";
  }
}

TEST_F(Merge, MismatchedInputsAreRefused) {
  const fs::path model = dir_ / "model";
  const fs::path out = dir_ / "never_written";
  struct Case {
    std::string args;
    std::string message;
  };

  // An adapter trained on a model with hidden size 32.
  const fs::path narrow = test::write_random_adapter(dir_ / "adapter_narrow", test::narrowed_to_hidden_32(config_),
                                                     {.r = 4, .alpha = 8, .targets = {"q_proj"}, .layers = 1});
  const fs::path deep = make_adapter("adapter_deep", 2, 4.0, {"k_proj"}, 0.0f, 3);
  const fs::path shallow = make_adapter("adapter_shallow", 2, 4.0, {"k_proj"}, 0.0f, 1);
  const fs::path good = make_adapter("adapter_good", 2, 4.0, {"k_proj"}, 0.0f);
  const fs::path no_config = dir_ / "adapter_no_config";
  fs::copy(good, no_config, fs::copy_options::recursive);
  fs::remove(no_config / "adapter_config.json");
  const fs::path no_weights = dir_ / "adapter_no_weights";
  fs::copy(good, no_weights, fs::copy_options::recursive);
  fs::remove(no_weights / "adapter_model.safetensors");

  const std::string m = model.string();
  const std::vector<Case> cases = {
      {"--model " + quoted(model) + " --adapter " + quoted(narrow) + " --out " + quoted(out),
       "merge: adapter tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' has shape [4, 32], but "
       "'model.layers.0.self_attn.q_proj.weight' of the model in '" + m + "' is [64, 64] (out, in), so it needs "
       "[4, 64]: the adapter was trained on a model of another shape"},
      {"--model " + quoted(model) + " --adapter " + quoted(deep) + " --out " + quoted(out),
       "merge: adapter tensor 'base_model.model.model.layers.2.self_attn.k_proj.lora_A.weight' is for layer 2, but "
       "the model in '" + m + "' has 2 layers (was the adapter trained on another model?)"},
      {"--model " + quoted(model) + " --adapter " + quoted(shallow) + " --out " + quoted(out),
       "merge: adapter '" + shallow.string() + "' has no 'base_model.model.model.layers.1.self_attn.k_proj.lora_A.weight', "
       "although target_modules lists k_proj and the model has 2 layers"},
      {"--model " + quoted(model) + " --adapter " + quoted(no_config) + " --out " + quoted(out),
       "adapter directory '" + no_config.string() + "' has no adapter_config.json (a PEFT adapter has "
       "adapter_config.json and adapter_model.safetensors)"},
      {"--model " + quoted(model) + " --adapter " + quoted(no_weights) + " --out " + quoted(out),
       "adapter directory '" + no_weights.string() + "' has no adapter_model.safetensors"},
      {"--model " + quoted(model) + " --adapter " + quoted(dir_ / "nowhere") + " --out " + quoted(out),
       "adapter directory '" + (dir_ / "nowhere").string() + "' does not exist or is not a directory"},
      {"--model " + quoted(dir_ / "no_model") + " --adapter " + quoted(good) + " --out " + quoted(out),
       "model directory '" + (dir_ / "no_model").string() + "' not found"},
      {"--model preset:tiny --adapter " + quoted(good) + " --out " + quoted(out),
       "merge: --model preset:tiny: a preset has no weights to merge into; give an HF model directory"},
      {"--model " + quoted(model) + " --adapter " + quoted(good) + " --out " + quoted(model),
       "merge: --out " + m + " is the same directory as the input '" + m + "'; write the merged model elsewhere"},
      {"--model " + quoted(model) + " --out " + quoted(out), "merge: --adapter DIR is required"},
      {"--model " + quoted(model) + " --adapter " + quoted(good) + " --out " + quoted(out) + " --max_shard_size 10",
       "merge: --max_shard_size 10: must be at least 1024 bytes"},
      {"--model " + quoted(model) + " --adaptor " + quoted(good), "merge: unknown flag --adaptor (did you mean --adapter?)"},
  };
  for (const auto& c : cases) {
    auto r = run_fsdpq("merge " + c.args);
    EXPECT_EQ(r.exit_code, 2) << c.args << "\n" << r.output;
    EXPECT_EQ(error_message(r.output), c.message) << c.args;
  }
  EXPECT_FALSE(fs::exists(out));
  // No staging directory is left behind by the refused merges.
  for (const auto& entry : fs::directory_iterator(dir_))
    EXPECT_EQ(entry.path().filename().string().find(".never_written"), std::string::npos) << entry.path();
}

}  // namespace
}  // namespace fsdpq
