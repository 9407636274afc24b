// LlamaModel: loading an HF directory (equal to the random preset bit for bit), PEFT adapter
// export and import with their errors, and the KV-cached generation path.
#include <gtest/gtest.h>

#include <cmath>

#include "io/model_files.h"
#include "model/init_model.h"
#include "model/llama_model.h"
#include "model_llama_test_support.h"
#include "test_support.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;
using test::error_of;

// ---- random() == load(init-model directory) -----------------------------------------------------

TEST(LlamaModelLoad, RandomEqualsLoadOfInitModelDirectory) {
  LlamaConfig config = test::tiny_llama();
  const fs::path dir = test::make_temp_dir("llama_model_load") / "tiny";
  InitModelOptions init;
  init.seed = 1234;
  init_model(config, dir, init);
  const LlamaConfig loaded_config = load_llama_config(dir / "config.json");
  const ModelWeights files = ModelWeights::open(dir);
  const data::Batch batch = test::random_batch(2, 8, config.vocab_size, 3);

  const std::vector<ModelOptions> modes = {test::lora_options(Precision::BF16, true),   // qlora
                                           test::lora_options(Precision::BF16, false),  // lora
                                           test::lora_options(Precision::FP32, true),
                                           test::full_options(Precision::BF16)};
  for (const ModelOptions& options : modes) {
    LlamaModel from_files = LlamaModel::load(loaded_config, files, options);
    LlamaModel preset = LlamaModel::random(config, 1234, options);
    EXPECT_TRUE(test::same_bits(from_files.logits(batch), preset.logits(batch)));
    const auto a = from_files.trainable_parameters(), b = preset.trainable_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(test::same_bits(*a[i].master, *b[i].master)) << a[i].name;
  }
  // Another seed is another model.
  LlamaModel other = LlamaModel::random(config, 1235, modes[0]);
  EXPECT_FALSE(test::same_bits(other.logits(batch), LlamaModel::load(loaded_config, files, modes[0]).logits(batch)));
}

TEST(LlamaModelLoad, ShapeMismatchNamesTheTensor) {
  LlamaConfig config = test::tiny_llama();
  const fs::path dir = test::make_temp_dir("llama_model_shape") / "tiny";
  init_model(config, dir, {});
  const ModelWeights files = ModelWeights::open(dir);
  LlamaConfig wrong = config;
  wrong.intermediate_size = 160;
  EXPECT_EQ(error_of([&] { LlamaModel::load(wrong, files, test::lora_options(Precision::BF16, true)); }),
            fmt::format("model '{}': tensor 'model.layers.0.mlp.gate_proj.weight' has shape [176, 64] but config.json "
                        "implies [160, 64]",
                        dir.string()));
  LlamaConfig tied = config;
  tied.tie_word_embeddings = true;  // lm_head.weight is then unused: loading works
  EXPECT_NO_THROW(LlamaModel::load(tied, files, test::lora_options(Precision::BF16, true)));
}

// ---- PEFT adapters ------------------------------------------------------------------------------

std::vector<std::pair<std::string, Tensor>> copy_adapters(const LlamaModel& model) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& [name, tensor] : model.adapter_tensors()) {
    Tensor copy = Tensor::empty(tensor->shape(), tensor->dtype());
    std::memcpy(copy.view().data, tensor->view().data, tensor->nbytes());
    out.emplace_back(name, std::move(copy));
  }
  return out;
}

TEST(LlamaModelAdapters, RoundTripThroughAdapterTensors) {
  const LlamaConfig config = test::tiny_llama();
  ModelOptions options = test::lora_options(Precision::BF16, true);
  options.lora_targets = {"q_proj", "v_proj", "down_proj"};
  LlamaModel trained = LlamaModel::random(config, 1, options);
  test::randomize_lora_b(trained, 2);
  const auto adapters = trained.adapter_tensors();
  ASSERT_EQ(adapters.size(), 2u * 3u * 2u);
  EXPECT_EQ(adapters[0].first, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(adapters[0].second->shape(), (Shape{4, 64}));
  EXPECT_EQ(adapters[3].first, "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight");
  EXPECT_EQ(adapters[3].second->shape(), (Shape{32, 4}));
  EXPECT_EQ(adapters[4].first, "base_model.model.model.layers.0.mlp.down_proj.lora_A.weight");
  EXPECT_EQ(adapters[4].second->shape(), (Shape{4, 176}));
  EXPECT_EQ(adapters[11].first, "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight");

  ModelOptions fresh_options = options;
  fresh_options.seed = 99;  // other A values
  LlamaModel fresh = LlamaModel::random(config, 1, fresh_options);
  const data::Batch batch = test::random_batch(2, 8, config.vocab_size, 4);
  EXPECT_FALSE(test::same_bits(fresh.logits(batch), trained.logits(batch)));
  fresh.load_adapter_tensors(copy_adapters(trained));
  EXPECT_TRUE(test::same_bits(fresh.logits(batch), trained.logits(batch)));  // compute copies refreshed too

  // BF16 tensors (as PEFT may save them) load too, converted exactly.
  auto bf16 = copy_adapters(trained);
  for (auto& [name, t] : bf16) {
    Tensor b = Tensor::empty(t.shape(), DType::BF16);
    for (int64_t i = 0; i < t.numel(); ++i) b.data<uint16_t>()[i] = float_to_bf16(t.data<float>()[i]);
    t = std::move(b);
  }
  fresh.load_adapter_tensors(bf16);
  EXPECT_EQ(test::floats_of(*fresh.adapter_tensors()[1].second)[0], round_bf16(test::floats_of(*adapters[1].second)[0]));
}

TEST(LlamaModelAdapters, LoadErrorsNameTheTensorAndLeaveTheModelUnchanged) {
  const LlamaConfig config = test::tiny_llama();
  ModelOptions options = test::lora_options(Precision::BF16, true);
  options.lora_targets = {"q_proj", "v_proj"};
  LlamaModel model = LlamaModel::random(config, 1, options);
  const data::Batch batch = test::random_batch(1, 6, config.vocab_size, 5);
  const Tensor before = model.logits(batch);
  LlamaModel donor = LlamaModel::random(config, 1, options);
  test::randomize_lora_b(donor, 3);

  auto missing = copy_adapters(donor);
  missing.erase(missing.begin() + 5);
  EXPECT_EQ(error_of([&] { model.load_adapter_tensors(missing); }),
            "1 adapter tensor is missing: 'base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight'");
  auto none = copy_adapters(donor);
  none.resize(2);
  EXPECT_EQ(error_of([&] { model.load_adapter_tensors(none); }),
            "6 adapter tensors are missing: 'base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight', "
            "'base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight', "
            "'base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight' and 3 more");

  auto unexpected = copy_adapters(donor);
  unexpected[2].first = "base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight";
  EXPECT_EQ(error_of([&] { model.load_adapter_tensors(unexpected); }),
            "adapter tensor 'base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight' is not part of this model "
            "(did you mean 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight'?); it has LoRA adapters on "
            "q_proj, v_proj of each of its 2 layers");

  auto duplicate = copy_adapters(donor);
  duplicate[1].first = duplicate[0].first;
  EXPECT_EQ(error_of([&] { model.load_adapter_tensors(duplicate); }),
            "adapter tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' is given twice");

  ModelOptions rank8 = options;
  rank8.lora_rank = 8;
  auto wrong_rank = copy_adapters(LlamaModel::random(config, 1, rank8));
  EXPECT_EQ(error_of([&] { model.load_adapter_tensors(wrong_rank); }),
            "adapter tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' has shape [8, 64] but this "
            "model needs [4, 64] (lora_rank 4; lora_A is [r, in], lora_B [out, r])");

  auto wrong_dtype = copy_adapters(donor);
  wrong_dtype[0].second = Tensor::zeros(Shape{4, 64}, DType::I32);
  EXPECT_EQ(error_of([&] { model.load_adapter_tensors(wrong_dtype); }),
            "adapter tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' is I32; LoRA weights must "
            "be F32, BF16 or F16");

  EXPECT_TRUE(test::same_bits(model.logits(batch), before));  // nothing was half-loaded

  LlamaModel full = LlamaModel::random(config, 1, test::full_options(Precision::BF16));
  EXPECT_TRUE(full.adapter_tensors().empty());
  EXPECT_EQ(error_of([&] { full.load_adapter_tensors(copy_adapters(donor)); }),
            "cannot load LoRA adapters: this model has none (full fine-tuning trains the base weights instead)");
}

// ---- KV cache -----------------------------------------------------------------------------------

// Prefill N tokens, then decode M one at a time: every step's logits equal the full sequence's
// logits at that position. FP32: normwise relative error <= 1e-4 per position (only the
// attention's summation order differs). BF16: <= 2e-2 (the cached path rounds the same values,
// but a different summation order can flip a bf16 rounding that then propagates).
void expect_cache_matches_full_sequence(Precision precision, double tolerance) {
  const LlamaConfig config = test::tiny_llama(300, 0.1);
  LlamaModel model = LlamaModel::random(config, 8, test::lora_options(precision, true));
  test::randomize_lora_b(model, 9);
  const int64_t prefill = 5, decode = 7, total = prefill + decode;
  const data::Batch sequence = test::random_batch(1, total, config.vocab_size, 10);
  const Tensor full = model.logits(sequence);
  const int64_t V = config.vocab_size;
  auto expect_position = [&](const std::vector<float>& got, int64_t position) {
    ASSERT_EQ(got.size(), static_cast<size_t>(V));
    const float* want = full.data<float>() + position * V;
    EXPECT_LE(test::normwise_error(std::vector<double>(got.begin(), got.end()), std::vector<double>(want, want + V)),
              tolerance)
        << "position " << position;
  };

  KvCache cache = model.make_cache(total);
  ASSERT_EQ(cache.keys.size(), 2u);
  EXPECT_EQ(cache.keys[0].shape(), (Shape{total, 2, 16}));
  EXPECT_EQ(cache.keys[0].dtype(), activation_dtype(precision));
  const std::vector<int32_t> prompt(sequence.input_ids.begin(), sequence.input_ids.begin() + prefill);
  expect_position(model.forward_cached(prompt, cache), prefill - 1);
  EXPECT_EQ(cache.length, prefill);
  for (int64_t t = prefill; t < total; ++t) {
    expect_position(model.forward_cached({sequence.input_ids[static_cast<size_t>(t)]}, cache), t);
    EXPECT_EQ(cache.length, t + 1);
  }
  EXPECT_EQ(error_of([&] { model.forward_cached({1}, cache); }),
            "KV cache of 12 tokens already holds 12: 1 more do not fit; make a larger cache");
}

TEST(LlamaModelCache, DecodeEqualsFullSequenceFp32) { expect_cache_matches_full_sequence(Precision::FP32, 1e-4); }

TEST(LlamaModelCache, DecodeEqualsFullSequenceBf16) { expect_cache_matches_full_sequence(Precision::BF16, 2e-2); }

}  // namespace
}  // namespace fsdpq
