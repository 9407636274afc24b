// LlamaModel: whole-model gradients against finite differences, activation checkpointing,
// precision modes, LoRA no-op start, gradient accumulation, the chunked LM-head loss, option errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "backend/section_times.h"
#include "model/llama_lm_head.h"
#include "model/llama_model.h"
#include "ops/elementwise.h"
#include "optim/loss_scaler.h"
#include "quant/hqq_solve.h"
#include "model_llama_test_support.h"
#include "test_support.h"

namespace fsdpq {
namespace {

using test::error_of;
using test::expect_bit_identical;
using test::GradSnapshot;
using test::run_step;

// ---- Gradients against central finite differences --------------------------------------------
//
// FP32 model; the checked loss is the unnormalised loss sum (normalizer 1), evaluated through
// evaluate() with dropout 0. For each trainable tensor the sample is its 3 entries of largest
// |analytic gradient| plus 3 random ones; the derivative is the 4-point stencil
// (8(L(+h) - L(-h)) - (L(+2h) - L(-2h))) / 12h with h = 2e-2 (the step actually stored in fp32),
// accurate to O(h^4). The normwise relative error over the sample must be <= 2e-3. h is large
// because the fp32 rounding noise of the loss sum (~1e-6), divided by h, dominates below it: the
// worst tensor measured 1.7e-3 at h = 5e-3, 1.1e-3 at h = 1e-2 and 3.6e-4 at h = 2e-2.
// The weights use initializer_range 0.1 (not 0.02) so attention and the MLP are far from linear
// and the gradients are well above the fp32 noise of the loss.
constexpr double kGradTolerance = 2e-3;

void expect_gradients_match_finite_differences(LlamaModel& model, const data::Batch& batch,
                                               const std::vector<std::string>& expected_kinds) {
  model.zero_grads();
  model.forward_backward(batch, /*normalizer=*/1.0, /*loss_scale=*/1.0f, /*step_key=*/0);
  auto loss_at = [&](float* entry, float value) {
    *entry = value;
    model.masters_updated();
    return model.evaluate(batch).loss_sum;
  };
  std::vector<std::string> seen_kinds;
  std::mt19937 rng(123);
  for (const TrainableParameter& p : model.trainable_parameters()) {
    const std::vector<float> grad = test::floats_of(*p.grad);
    std::vector<int64_t> order(grad.size());
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + 3, order.end(),
                      [&](int64_t a, int64_t b) { return std::abs(grad[size_t(a)]) > std::abs(grad[size_t(b)]); });
    std::vector<int64_t> sample(order.begin(), order.begin() + 3);
    std::uniform_int_distribution<int64_t> any(0, static_cast<int64_t>(grad.size()) - 1);
    for (int i = 0; i < 3; ++i) sample.push_back(any(rng));

    std::vector<double> analytic, numeric;
    float* master = p.master->data<float>();
    for (int64_t index : sample) {
      float* entry = master + index;
      const float original = *entry;
      const float h = 2e-2f;
      const float plus1 = original + h, minus1 = original - h, plus2 = original + 2 * h, minus2 = original - 2 * h;
      const double l_plus1 = loss_at(entry, plus1), l_minus1 = loss_at(entry, minus1);
      const double l_plus2 = loss_at(entry, plus2), l_minus2 = loss_at(entry, minus2);
      loss_at(entry, original);
      // Steps as stored: plus1 - original may differ from h in the last bits.
      const double step = (static_cast<double>(plus1) - static_cast<double>(minus1)) / 2.0;
      numeric.push_back((8.0 * (l_plus1 - l_minus1) - (l_plus2 - l_minus2)) / (12.0 * step));
      analytic.push_back(grad[static_cast<size_t>(index)]);
    }
    const double error = test::normwise_error(analytic, numeric);
    EXPECT_LE(error, kGradTolerance) << p.name << ": analytic " << ::testing::PrintToString(analytic) << " numeric "
                                     << ::testing::PrintToString(numeric);
    // The kind of tensor: the name without its layer number.
    std::string kind = p.name;
    const size_t layers = kind.find("layers.");
    if (layers != std::string::npos) kind.erase(layers + 7, kind.find('.', layers + 7) - (layers + 7));
    if (std::find(seen_kinds.begin(), seen_kinds.end(), kind) == seen_kinds.end()) seen_kinds.push_back(kind);
  }
  EXPECT_EQ(seen_kinds, expected_kinds);
}

std::vector<std::string> lora_kinds() {
  std::vector<std::string> kinds;
  for (const std::string& m : test::all_linear_targets()) {
    const std::string group = m == "q_proj" || m == "k_proj" || m == "v_proj" || m == "o_proj" ? "self_attn" : "mlp";
    kinds.push_back("base_model.model.model.layers.." + group + "." + m + ".lora_A.weight");
    kinds.push_back("base_model.model.model.layers.." + group + "." + m + ".lora_B.weight");
  }
  return kinds;
}

TEST(LlamaModel, LoraGradientsMatchFiniteDifferences) {
  const LlamaConfig config = test::tiny_llama(300, 0.1);
  LlamaModel model = LlamaModel::random(config, 3, test::lora_options(Precision::FP32, /*quantize_base=*/false));
  test::randomize_lora_b(model, 5, 0.2f);  // with B = 0, A's gradient would be exactly zero
  expect_gradients_match_finite_differences(model, test::random_batch(2, 8, config.vocab_size, 11), lora_kinds());
}

TEST(LlamaModel, QloraGradientsMatchFiniteDifferences) {
  const LlamaConfig config = test::tiny_llama(300, 0.1);
  LlamaModel model = LlamaModel::random(config, 3, test::lora_options(Precision::FP32, /*quantize_base=*/true));
  test::randomize_lora_b(model, 6, 0.2f);
  expect_gradients_match_finite_differences(model, test::random_batch(2, 8, config.vocab_size, 12), lora_kinds());
}

// DoRA starts as the base model, as PEFT's does: m is initialised to the dequantised base's row
// norms by the forward's own norm, so in fp32 g = 1 exactly and with B = 0 its logits are the
// LoRA model's bit for bit (NF4 base); each adapter carries its magnitude after A and B.
TEST(LlamaModel, DoraAtInitialisationIsTheBaseModel) {
  const LlamaConfig config = test::tiny_llama(300, 0.1);
  ModelOptions lora = test::lora_options(Precision::FP32, /*quantize_base=*/true);
  ModelOptions dora = lora;
  dora.use_dora = true;
  LlamaModel lora_model = LlamaModel::random(config, 3, lora), dora_model = LlamaModel::random(config, 3, dora);
  const data::Batch batch = test::random_batch(2, 8, config.vocab_size, 13);
  EXPECT_EQ(test::floats_of(dora_model.logits(batch)), test::floats_of(lora_model.logits(batch)));
  const std::vector<TrainableParameter> params = dora_model.trainable_parameters();
  ASSERT_EQ(params.size(), 3 * lora_model.trainable_parameters().size() / 2);
  EXPECT_EQ(params[2].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector");
  EXPECT_EQ(params[2].master->shape(), Shape{config.hidden_size});
  for (float v : test::floats_of(*params[2].master)) EXPECT_GT(v, 0.0f);
}

std::vector<std::string> full_kinds(bool tied) {
  std::vector<std::string> kinds = {"model.embed_tokens.weight", "model.layers..input_layernorm.weight"};
  for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"})
    kinds.push_back(std::string("model.layers..self_attn.") + m + ".weight");
  kinds.push_back("model.layers..post_attention_layernorm.weight");
  for (const char* m : {"gate_proj", "up_proj", "down_proj"})
    kinds.push_back(std::string("model.layers..mlp.") + m + ".weight");
  kinds.push_back("model.norm.weight");
  if (!tied) kinds.push_back("lm_head.weight");
  return kinds;
}

TEST(LlamaModel, FullFineTuningGradientsMatchFiniteDifferences) {
  const LlamaConfig config = test::tiny_llama(300, 0.1);
  LlamaModel model = LlamaModel::random(config, 4, test::full_options(Precision::FP32));
  expect_gradients_match_finite_differences(model, test::random_batch(2, 8, config.vocab_size, 13), full_kinds(false));
}

TEST(LlamaModel, TiedEmbeddingGradientsMatchFiniteDifferences) {
  // The head and the embedding are one tensor: its gradient sums both uses.
  LlamaConfig config = test::tiny_llama(300, 0.1);
  config.tie_word_embeddings = true;
  LlamaModel model = LlamaModel::random(config, 4, test::full_options(Precision::FP32));
  expect_gradients_match_finite_differences(model, test::random_batch(2, 8, config.vocab_size, 14), full_kinds(true));
}

// ---- Activation checkpointing ------------------------------------------------------------------

TEST(LlamaModel, CheckpointingGivesBitIdenticalGradients) {
  const LlamaConfig config = test::tiny_llama();
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 21);
  // LoRA in bf16 with dropout (the masks must be regenerated exactly in the recompute) and without.
  for (double dropout : {0.0, 0.1}) {
    const ModelOptions options = test::lora_options(Precision::BF16, /*quantize_base=*/true, dropout);
    expect_bit_identical(run_step(config, options, true, batch, 7), run_step(config, options, false, batch, 7));
  }
  // Full fine-tuning in fp32.
  const ModelOptions full = test::full_options(Precision::FP32);
  expect_bit_identical(run_step(config, full, true, batch, 7), run_step(config, full, false, batch, 7));
}

// checkpoint_every = k recomputes layers 0, k, 2k ... and keeps the others' activations: the same
// bits as no checkpointing, whichever layers are recomputed (the last one or not, one or all), with
// dropout masks regenerated in the recompute, with and without activation offload.
TEST(LlamaModel, CheckpointingEveryKthLayerGivesBitIdenticalGradients) {
  LlamaConfig config = test::tiny_llama();
  config.num_hidden_layers = 5;
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 23);
  for (bool full : {false, true}) {
    ModelOptions options = full ? test::full_options(Precision::FP32) : test::lora_options(Precision::BF16, true, 0.1);
    const GradSnapshot none = run_step(config, options, false, batch, 3);
    for (int64_t every : {1, 2, 3, 5, 8})
      for (bool offload : {false, true}) {
        SCOPED_TRACE(testing::Message() << (full ? "full" : "qlora") << ", checkpoint_every " << every
                                        << (offload ? ", activation offload" : ""));
        options.checkpoint_every = every;
        options.activation_offload = offload;
        expect_bit_identical(run_step(config, options, true, batch, 3), none);
      }
  }
}

// keep_activation_layers = n: the last n layers keep their activations, the others checkpointing
// recomputes (every layer, or every k-th): the same bits as no checkpointing, for none to all of
// the layers (and more than there are), with elementwise recompute trimming the kept ones, with
// activation offload, for LoRA with dropout and full fine-tuning.
TEST(LlamaModel, KeptActivationLayersGiveBitIdenticalGradients) {
  LlamaConfig config = test::tiny_llama();
  config.num_hidden_layers = 5;
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 26);
  for (bool full : {false, true}) {
    ModelOptions options = full ? test::full_options(Precision::FP32) : test::lora_options(Precision::BF16, true, 0.1);
    const GradSnapshot none = run_step(config, options, false, batch, 3);
    for (int64_t every : {1, 2})
      for (int64_t keep : {1, 2, 4, 5, 9})
        for (bool trimmed : {false, true}) {
          SCOPED_TRACE(testing::Message() << (full ? "full" : "qlora") << ", checkpoint_every " << every << ", keep "
                                          << keep << (trimmed ? ", elementwise recompute" : ""));
          options.checkpoint_every = every;
          options.keep_activation_layers = keep;
          options.recompute_elementwise = trimmed;
          options.activation_offload = keep == 2;
          expect_bit_identical(run_step(config, options, true, batch, 3), none);
        }
  }
}

// recompute_elementwise: the kept layers drop n1, n2 and h and recompute them in the backward (the
// same ops on the same inputs): the same bits as keeping them, alone or with every-k-th-layer
// checkpointing, for LoRA with dropout (the masks read the recomputed inputs), full fine-tuning and
// DoRA.
TEST(LlamaModel, ElementwiseRecomputeGivesBitIdenticalGradients) {
  LlamaConfig config = test::tiny_llama();
  config.num_hidden_layers = 4;
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 24);
  ModelOptions dora = test::lora_options(Precision::BF16, true, 0.1);
  dora.use_dora = true;
  for (ModelOptions options : {test::lora_options(Precision::BF16, true, 0.1), test::full_options(Precision::FP32), dora})
    for (int64_t every : {0, 2, 3}) {
      SCOPED_TRACE(testing::Message() << (options.train_base ? "full" : options.use_dora ? "dora" : "qlora")
                                      << ", checkpoint_every " << every);
      options.checkpoint_every = every > 0 ? every : 1;
      options.recompute_elementwise = false;
      const GradSnapshot kept = run_step(config, options, every > 0, batch, 4);
      options.recompute_elementwise = true;
      expect_bit_identical(run_step(config, options, every > 0, batch, 4), kept);
    }
}

// keep_dequantized_layers: the last k layers are made dense once, by the first pass that reads
// them, and every later pass (the backward, the next steps) reads those buffers instead of
// dequantising again: the same values, so the same bits, for NF4 and HQQ bases, folded or not,
// DoRA, with and without checkpointing (a recomputed kept layer reads them too), and over two steps
// of one model (the fold rewrites s·B into them each forward). The "nf4 dequantize" sections count
// what it saves: the second step dequantises none of the kept layers' 7 modules, forward or backward.
TEST(LlamaModel, KeptDequantizedLayersGiveBitIdenticalGradients) {
  LlamaConfig config = test::tiny_llama();
  config.num_hidden_layers = 4;
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 25);
  ModelOptions qlora = test::lora_options(Precision::BF16, true, 0.1), hqq = qlora, dora = qlora;
  hqq.hqq_bits = 4;
  dora.use_dora = true;
  struct Case {
    const char* name;
    ModelOptions options;
    bool fold;
  };
  for (const Case& c : {Case{"qlora, folded", qlora, true}, Case{"qlora", qlora, false}, Case{"hqq 4 bits, folded", hqq, true},
                        Case{"dora", dora, true}})
    for (int64_t every : {0, 1, 2}) {
      SCOPED_TRACE(testing::Message() << c.name << ", checkpoint_every " << every);
      const test::LoraFoldSetting fold(c.fold);
      ModelOptions options = c.options;
      options.checkpoint_every = every > 0 ? every : 1;
      const GradSnapshot plain = run_step(config, options, every > 0, batch, 4);
      for (int64_t keep : {1, 3, 4, 100}) {
        SCOPED_TRACE(testing::Message() << "keep " << keep);
        options.keep_dequantized_layers = keep;
        expect_bit_identical(run_step(config, options, every > 0, batch, 4), plain);
      }
    }

  // Two steps of one model, Adam between them, against the same without kept layers.
  auto two_steps = [&](int64_t keep, int64_t* dequantizations) {
    const test::LoraFoldSetting fold(true);
    ModelOptions options = qlora;
    options.gradient_checkpointing = false;
    options.keep_dequantized_layers = keep;
    LlamaModel model = LlamaModel::random(config, 9, options);
    test::randomize_lora_b(model, 10);
    model.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, 1);
    for (const TrainableParameter& p : model.trainable_parameters())  // B moves: the fold's s·B block changes
      add_scaled(*p.master, *p.grad, -0.5f);
    model.masters_updated();
    model.zero_grads();
    set_section_times_enabled(true);
    reset_section_times();
    GradSnapshot snap;
    snap.loss = model.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, 2);
    *dequantizations = 0;
    for (const SectionTotal& t : section_totals())
      if (t.name == "nf4 dequantize") *dequantizations = t.count;
    set_section_times_enabled(false);
    reset_section_times();
    for (const TrainableParameter& p : model.trainable_parameters()) {
      Tensor copy = Tensor::empty(p.grad->shape(), DType::F32);
      copy_convert(copy, *p.grad);
      snap.grads.push_back(std::move(copy));
    }
    return snap;
  };
  int64_t none = 0, two = 0;
  const GradSnapshot plain = two_steps(0, &none);
  expect_bit_identical(two_steps(2, &two), plain);
  EXPECT_EQ(none, 2 * 7 * config.num_hidden_layers);
  EXPECT_EQ(two, none - 2 * 2 * 7);
}

// A recomputed layer keeps its adapters' xa from the forward, so its recompute runs only the B
// products: the down products (and their dropout masks) run once a layer and pass, as without
// checkpointing, with the same bits; folded or not, with and without dropout, every layer or every
// other one recomputed, the last one kept or not. The recompute stops at h (layer_recompute): of
// each layer's four "linear" sections (q/k/v, o, gate/up, down) it runs three; with activation
// offload, which brings back the attention output and x2, two, and no attention forward.
TEST(LlamaModel, CheckpointedRecomputeRunsOnlyWhatTheBackwardReads) {
  LlamaConfig config = test::tiny_llama();
  config.num_hidden_layers = 4;
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 27);
  struct Counts {
    int64_t down_products = 0, linear = 0, attention = 0;
  };
  auto counts_of = [&](const ModelOptions& options, bool checkpointing, GradSnapshot* snap) {
    set_section_times_enabled(true);
    reset_section_times();
    *snap = run_step(config, options, checkpointing, batch, 6);
    Counts counts;
    for (const SectionTotal& t : section_totals()) {
      if (t.name == std::string("lora: x·Aᵀ")) counts.down_products = t.count;
      if (t.name == std::string("linear")) counts.linear = t.count;
      if (t.name == std::string("attention")) counts.attention = t.count;
    }
    set_section_times_enabled(false);
    reset_section_times();
    return counts;
  };
  for (bool fold : {false, true})
    for (double dropout : {0.0, 0.1})
      for (int64_t every : {1, 2})
        for (int64_t keep : {0, 1})
          for (int offload : {0, 1}) {  // activation offload
            SCOPED_TRACE(testing::Message() << (fold ? "folded" : "not folded") << ", dropout " << dropout
                                            << ", checkpoint_every " << every << ", keep " << keep
                                            << (offload > 0 ? ", activation offload" : ""));
            const test::LoraFoldSetting folded(fold);
            ModelOptions options = test::lora_options(Precision::BF16, true, dropout);
            options.checkpoint_every = every;
            options.keep_activation_layers = keep;
            options.activation_offload = offload > 0;
            GradSnapshot plain, checkpointed;
            const Counts once = counts_of(options, false, &plain);
            const Counts with = counts_of(options, true, &checkpointed);
            EXPECT_GT(once.down_products, 0);
            EXPECT_EQ(with.down_products, once.down_products);
            EXPECT_EQ(once.linear, 4 * config.num_hidden_layers);
            // The last recomputed layer's activations are still in the shared buffer: not recomputed.
            const int64_t recomputed = CheckpointPolicy{true, every, keep}.recomputed_layers(config.num_hidden_layers) - 1;
            EXPECT_EQ(with.linear, once.linear + (3 - offload) * recomputed);
            EXPECT_EQ(with.attention, once.attention + (offload > 0 ? 0 : recomputed));
            expect_bit_identical(checkpointed, plain);
          }
}

// Nothing below the first layer trains in LoRA or DoRA (the embedding is frozen, as is the input
// norm), so its backward skips its input's gradient: of a layer's seven "linear bwd" sections (q, k,
// v, o, gate, up, down) the first layer runs four, and of its two norm backwards one. Full
// fine-tuning trains the embedding: every layer runs all of them. The gradients themselves are the
// finite-difference tests' (LoraGradientsMatchFiniteDifferences and the like).
TEST(LlamaModel, TheFirstLayerSkipsItsInputGradientWhereNothingBelowTrains) {
  LlamaConfig config = test::tiny_llama();
  config.num_hidden_layers = 3;
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 31);
  for (const char* kind : {"full", "lora", "dora"}) {
    SCOPED_TRACE(kind);
    ModelOptions options = std::string(kind) == "full" ? test::full_options(Precision::BF16)
                                                       : test::lora_options(Precision::BF16, true, 0.1);
    options.use_dora = std::string(kind) == "dora";
    set_section_times_enabled(true);
    reset_section_times();
    const GradSnapshot snap = run_step(config, options, false, batch, 3);
    int64_t linear_bwd = 0, norm_bwd = 0;
    for (const SectionTotal& t : section_totals()) {
      if (t.name == std::string("linear bwd")) linear_bwd = t.count;
      if (t.name == std::string("rmsnorm + residual bwd")) norm_bwd = t.count;
    }
    set_section_times_enabled(false);
    reset_section_times();
    const bool skips = std::string(kind) != "full";
    // DoRA's modules run their base GEMMs inside "dora bwd"
    if (std::string(kind) != "dora") EXPECT_EQ(linear_bwd, 7 * config.num_hidden_layers - (skips ? 3 : 0));
    EXPECT_EQ(norm_bwd, 2 * config.num_hidden_layers - (skips ? 1 : 0));
    EXPECT_TRUE(std::isfinite(snap.loss.loss_sum));
  }
}

// use_activation_cpu_offload moves each layer's input, and some layers' attention output, out and
// back between its forward and its backward: the same bytes come back, so the gradients are the
// same bits. Five layers: every one or every other one recomputed, none or the last three not (kept
// layers that send their attention output, and the last, which does not); full fine-tuning, LoRA
// and DoRA (whose recompute runs the whole layer).
TEST(LlamaModel, ActivationOffloadGivesBitIdenticalGradients) {
  LlamaConfig config = test::tiny_llama();
  config.num_hidden_layers = 5;
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 22);
  for (const char* kind : {"full", "lora", "dora"}) {
    ModelOptions options = std::string(kind) == "full" ? test::full_options(Precision::BF16)
                                                       : test::lora_options(Precision::BF16, true, 0.1);
    options.use_dora = std::string(kind) == "dora";
    const GradSnapshot plain = run_step(config, options, false, batch, 5);
    for (int64_t every : {1, 2})
      for (int64_t keep : {0, 3}) {
        SCOPED_TRACE(testing::Message() << kind << ", checkpoint_every " << every << ", keep " << keep);
        options.checkpoint_every = every;
        options.keep_activation_layers = keep;
        options.activation_offload = true;
        expect_bit_identical(run_step(config, options, true, batch, 5), plain);
      }
  }
}

TEST(LlamaModel, DropoutDependsOnStepKeyAndOnlyInTraining) {
  const LlamaConfig config = test::tiny_llama();
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 22);
  const ModelOptions options = test::lora_options(Precision::FP32, false, /*dropout=*/0.3);
  const GradSnapshot a = run_step(config, options, true, batch, 1), b = run_step(config, options, true, batch, 2);
  EXPECT_NE(a.loss.loss_sum, b.loss.loss_sum);
  const GradSnapshot again = run_step(config, options, true, batch, 1);
  expect_bit_identical(a, again);  // the same key gives the same masks
  // evaluate() has no dropout: it equals the dropout-free model's training loss.
  LlamaModel model = LlamaModel::random(config, 9, options);
  test::randomize_lora_b(model, 10);
  const GradSnapshot no_dropout = run_step(config, test::lora_options(Precision::FP32, false, 0.0), true, batch, 1);
  EXPECT_EQ(model.evaluate(batch).loss_sum, no_dropout.loss.loss_sum);
}

// ---- Precision, LoRA start, evaluate -----------------------------------------------------------

TEST(LlamaModel, Bf16IsCloseToFp32) {
  // Same bf16 weights (random() draws bf16 values) in both modes; bf16 rounds every activation.
  // Tolerances: loss 2e-3 relative (measured <= 3e-4), each LoRA gradient 6e-2 normwise (measured
  // <= 3e-2: bf16 keeps 8 bits). The bf16 autocast modes have exactly bf16's numerics on the CPU.
  const LlamaConfig config = test::tiny_llama(300, 0.1);
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 31);
  for (bool quantize : {false, true}) {
    LlamaModel fp32 = LlamaModel::random(config, 5, test::lora_options(Precision::FP32, quantize));
    LlamaModel bf16 = LlamaModel::random(config, 5, test::lora_options(Precision::BF16, quantize));
    test::randomize_lora_b(fp32, 8);
    test::randomize_lora_b(bf16, 8);
    const double l32 = fp32.forward_backward(batch, 1.0, 1.0f, 0).mean();
    const double l16 = bf16.forward_backward(batch, 1.0, 1.0f, 0).mean();
    EXPECT_NEAR(l16, l32, 2e-3 * l32) << "quantize_base " << quantize;
    const auto p32 = fp32.trainable_parameters(), p16 = bf16.trainable_parameters();
    for (size_t i = 0; i < p32.size(); ++i) {
      const std::vector<float> g32 = test::floats_of(*p32[i].grad), g16 = test::floats_of(*p16[i].grad);
      const double e = test::normwise_error(std::vector<double>(g16.begin(), g16.end()), std::vector<double>(g32.begin(), g32.end()));
      EXPECT_LE(e, 6e-2) << p32[i].name;
    }
    for (Precision p : {Precision::BF16Autocast, Precision::BF16BuffersAutocast}) {
      LlamaModel autocast = LlamaModel::random(config, 5, test::lora_options(p, quantize));
      test::randomize_lora_b(autocast, 8);
      EXPECT_EQ(autocast.evaluate(batch).loss_sum, bf16.evaluate(batch).loss_sum);
    }
  }
}

TEST(LlamaModel, Fp16AutocastIsCloseToFp32AndOverflowsDetectably) {
  // fp16_autocast keeps activations, frozen weights and dequantised NF4 in half (11 significant
  // bits) and fp32 masters. The loss is scaled by 1024 and the gradients unscaled afterwards, as the
  // trainer's loss scaler does. Tolerances: loss 1e-3 relative, each LoRA gradient 1e-2 normwise
  // (measured worst 2.5e-3 lora, 3.0e-3 qlora; bf16's tolerances are 2e-3 / 6e-2). A scale far beyond half's range must give
  // non-finite gradients: that is what the trainer's overflow check detects and skips.
  const LlamaConfig config = test::tiny_llama(300, 0.1);
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 31);
  for (bool quantize : {false, true}) {
    LlamaModel fp32 = LlamaModel::random(config, 5, test::lora_options(Precision::FP32, quantize));
    LlamaModel fp16 = LlamaModel::random(config, 5, test::lora_options(Precision::FP16Autocast, quantize));
    test::randomize_lora_b(fp32, 8);
    test::randomize_lora_b(fp16, 8);
    const double l32 = fp32.forward_backward(batch, 1.0, 1.0f, 0).mean();
    const float scale = 1024.0f;
    const double l16 = fp16.forward_backward(batch, 1.0, scale, 0).mean();
    EXPECT_NEAR(l16, l32, 1e-3 * l32) << "quantize_base " << quantize;
    const auto p32 = fp32.trainable_parameters(), p16 = fp16.trainable_parameters();
    ASSERT_EQ(p32.size(), p16.size());
    double worst = 0;
    for (size_t i = 0; i < p32.size(); ++i) {
      EXPECT_EQ(p16[i].master->dtype(), DType::F32);
      const std::vector<float> g32 = test::floats_of(*p32[i].grad), g16 = test::floats_of(*p16[i].grad);
      std::vector<double> unscaled(g16.size());
      for (size_t k = 0; k < g16.size(); ++k) unscaled[k] = static_cast<double>(g16[k]) / scale;
      const double e = test::normwise_error(unscaled, std::vector<double>(g32.begin(), g32.end()));
      worst = std::max(worst, e);
      EXPECT_LE(e, 1e-2) << p32[i].name;
    }
    RecordProperty(quantize ? "worst_gradient_error_qlora" : "worst_gradient_error_lora", std::to_string(worst));

    LlamaModel overflowing = LlamaModel::random(config, 5, test::lora_options(Precision::FP16Autocast, quantize));
    test::randomize_lora_b(overflowing, 8);
    overflowing.forward_backward(batch, 1.0, 1e30f, 0);
    bool nonfinite = false;
    for (const auto& p : overflowing.trainable_parameters())
      nonfinite |= DynamicLossScaler::has_nonfinite(p.grad->data<float>(), p.grad->numel());
    EXPECT_TRUE(nonfinite) << "a loss scale of 1e30 must overflow half's range";
  }
}

TEST(LlamaModel, ZeroLoraBGivesExactlyTheBaseModel) {
  const LlamaConfig config = test::tiny_llama();
  const data::Batch batch = test::random_batch(2, 8, config.vocab_size, 41);
  for (Precision precision : {Precision::FP32, Precision::BF16})
    for (bool quantize : {false, true}) {
      ModelOptions base = test::lora_options(precision, quantize);
      base.lora_targets.clear();
      const Tensor with_lora = LlamaModel::random(config, 2, test::lora_options(precision, quantize)).logits(batch);
      const Tensor without = LlamaModel::random(config, 2, base).logits(batch);
      EXPECT_EQ(test::floats_of(with_lora), test::floats_of(without));
      EXPECT_EQ(with_lora.shape(), (Shape{2, 8, config.vocab_size}));
    }
}

TEST(LlamaModel, EvaluateEqualsTrainingLossWithoutDropout) {
  const LlamaConfig config = test::tiny_llama();
  const data::Batch batch = test::random_batch(2, 12, config.vocab_size, 42);
  LlamaModel model = LlamaModel::random(config, 2, test::lora_options(Precision::BF16, true));
  test::randomize_lora_b(model, 3);
  const LossSum eval = model.evaluate(batch);
  const LossSum train = model.forward_backward(batch, 10.0, 4.0f, 5);
  EXPECT_EQ(eval.loss_sum, train.loss_sum);  // unscaled, whatever normalizer and loss_scale are
  EXPECT_EQ(eval.tokens, train.tokens);
  EXPECT_EQ(eval.tokens, batch.target_tokens);
  // The loss is HF's: mean cross entropy of the fp32 logits against the shifted labels.
  const Tensor logits = model.logits(batch);
  double sum = 0;
  const int64_t V = config.vocab_size;
  for (int64_t row = 0; row < 2 * 12; ++row) {
    if (row % 12 == 11 || batch.labels[size_t(row + 1)] == kIgnoreIndex) continue;
    const float* l = logits.data<float>() + row * V;
    const double max = *std::max_element(l, l + V);
    double z = 0;
    for (int64_t i = 0; i < V; ++i) z += std::exp(l[i] - max);
    sum += max + std::log(z) - l[batch.labels[size_t(row + 1)]];
  }
  EXPECT_NEAR(eval.loss_sum, sum, 1e-5 * sum);
}

TEST(LlamaModel, LossScaleAndNormalizerScaleTheGradients) {
  const LlamaConfig config = test::tiny_llama();
  const data::Batch batch = test::random_batch(2, 8, config.vocab_size, 43);
  LlamaModel model = LlamaModel::random(config, 2, test::lora_options(Precision::FP32, false));
  test::randomize_lora_b(model, 3);
  model.forward_backward(batch, 1.0, 1.0f, 0);
  std::vector<std::vector<float>> unit;
  for (const TrainableParameter& p : model.trainable_parameters()) unit.push_back(test::floats_of(*p.grad));
  model.zero_grads();
  model.forward_backward(batch, 4.0, 1024.0f, 0);  // grad_scale 256: a power of two, so exact
  size_t i = 0;
  for (const TrainableParameter& p : model.trainable_parameters()) {
    std::vector<float> scaled = unit[i++];
    for (float& v : scaled) v *= 256.0f;
    EXPECT_EQ(test::floats_of(*p.grad), scaled) << p.name;
  }
}

TEST(LlamaModel, FullyMaskedBatchGivesZeroLossAndGradients) {
  const LlamaConfig config = test::tiny_llama();
  data::Batch batch = test::random_batch(2, 8, config.vocab_size, 44);
  std::fill(batch.labels.begin(), batch.labels.end(), kIgnoreIndex);
  LlamaModel model = LlamaModel::random(config, 2, test::lora_options(Precision::BF16, true));
  test::randomize_lora_b(model, 3);
  const LossSum loss = model.forward_backward(batch, 0.0, 1.0f, 0);  // grad_scale 1/0: no NaN anywhere
  EXPECT_EQ(loss.loss_sum, 0.0);
  EXPECT_EQ(loss.tokens, 0);
  for (const TrainableParameter& p : model.trainable_parameters())
    for (float g : test::floats_of(*p.grad)) ASSERT_EQ(g, 0.0f) << p.name;
}

// ---- Gradient accumulation ---------------------------------------------------------------------

TEST(LlamaModel, TwoMicroBatchesEqualOneBatch) {
  // Accumulating two micro-batches with the step's token count as normalizer gives the gradient of
  // the step's mean loss, as one batch of both does. Sums run in another order: tolerance 1e-5
  // normwise per tensor, loss sums 1e-12 relative.
  const LlamaConfig config = test::tiny_llama();
  const data::Batch both = test::random_batch(4, 12, config.vocab_size, 51);
  const data::Batch first = test::batch_rows(both, 0, 2), second = test::batch_rows(both, 2, 2);
  ASSERT_EQ(first.target_tokens + second.target_tokens, both.target_tokens);
  for (const ModelOptions& options :
       {test::lora_options(Precision::FP32, true), test::full_options(Precision::FP32)}) {
    LlamaModel one = LlamaModel::random(config, 6, options), two = LlamaModel::random(config, 6, options);
    test::randomize_lora_b(one, 7);
    test::randomize_lora_b(two, 7);
    const double normalizer = static_cast<double>(both.target_tokens);
    const LossSum whole = one.forward_backward(both, normalizer, 1.0f, 3);
    const LossSum a = two.forward_backward(first, normalizer, 1.0f, 3);
    const LossSum b = two.forward_backward(second, normalizer, 1.0f, 4);
    EXPECT_EQ(whole.tokens, a.tokens + b.tokens);
    EXPECT_NEAR(whole.loss_sum, a.loss_sum + b.loss_sum, 1e-12 * whole.loss_sum);
    const auto p1 = one.trainable_parameters(), p2 = two.trainable_parameters();
    ASSERT_EQ(p1.size(), p2.size());
    for (size_t i = 0; i < p1.size(); ++i) {
      const std::vector<float> g1 = test::floats_of(*p1[i].grad), g2 = test::floats_of(*p2[i].grad);
      EXPECT_LE(test::normwise_error(std::vector<double>(g2.begin(), g2.end()), std::vector<double>(g1.begin(), g1.end())),
                1e-5)
          << p1[i].name;
    }
  }
}

// ---- The chunked LM-head loss ------------------------------------------------------------------

TEST(LlamaModelHead, ChunkedLossEqualsOneChunk) {
  // Chunks of 1, 3 and 5 rows (splitting sequences anywhere) against one chunk of all rows. Each
  // row's loss and gradient are computed the same way; only the summation order of the head's
  // gradient and of the loss differs (tolerances 1e-6 normwise, 1e-12 relative).
  const int64_t B = 2, T = 7, C = 16, V = 50;
  Tensor normed = Tensor::empty(Shape{B * T, C}, DType::F32), head = Tensor::empty(Shape{V, C}, DType::F32);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (float* p : {normed.data<float>(), head.data<float>()})
    for (int64_t i = 0; i < (p == normed.data<float>() ? B * T * C : V * C); ++i) p[i] = dist(rng);
  const data::Batch batch = test::random_batch(B, T, V, 4, /*masked=*/3);
  const TensorView labels{const_cast<int32_t*>(batch.labels.data()), DType::I32, Shape{B * T}, Device::CPU};
  auto run = [&](int64_t chunk, Tensor& d_normed, Tensor& d_head) {
    d_normed = Tensor::zeros(Shape{B * T, C}, DType::F32);
    d_head = Tensor::zeros(Shape{V, C}, DType::F32);
    return lm_head_loss(normed, head, labels, B, T, 0.25f, d_normed, d_head, DType::F32, chunk);
  };
  Tensor dn_ref, dh_ref;
  const CrossEntropyResult ref = run(B * T, dn_ref, dh_ref);
  EXPECT_EQ(ref.count, batch.target_tokens);
  for (int64_t chunk : {1, 3, 5}) {
    Tensor dn, dh;
    const CrossEntropyResult got = run(chunk, dn, dh);
    EXPECT_EQ(got.count, ref.count);
    EXPECT_NEAR(got.loss_sum, ref.loss_sum, 1e-12 * ref.loss_sum);
    const auto as_doubles = [](const Tensor& t) { auto f = test::floats_of(t); return std::vector<double>(f.begin(), f.end()); };
    EXPECT_LE(test::normwise_error(as_doubles(dn), as_doubles(dn_ref)), 1e-6) << chunk;
    EXPECT_LE(test::normwise_error(as_doubles(dh), as_doubles(dh_ref)), 1e-6) << chunk;
  }
  EXPECT_EQ(lm_head_chunk_rows(32000, 4096), 512);     // 16 Mi logits, whole 128-row tiles
  EXPECT_EQ(lm_head_chunk_rows(128256, 8192), 128);    // Llama-3's vocabulary
  EXPECT_EQ(lm_head_chunk_rows(32000, 300), 300);      // never more than the rows
  EXPECT_EQ(lm_head_chunk_rows(300, 16), 16);
  EXPECT_EQ(lm_head_chunk_rows(int64_t{1} << 20, 4096), 16);  // under one tile: as many rows as fit
}

TEST(LlamaModelHead, LabelOutsideVocabularyNamesBatchAndPosition) {
  const LlamaConfig config = test::tiny_llama();
  data::Batch batch = test::random_batch(2, 8, config.vocab_size, 5);
  batch.labels[8 + 5] = 300;
  LlamaModel model = LlamaModel::random(config, 1, test::lora_options(Precision::FP32, false));
  EXPECT_EQ(error_of([&] { model.evaluate(batch); }),
            "label 300 at batch 1 position 5 is outside the vocabulary of 300 tokens (and is not the ignore index -100)");
}

// ---- Options ------------------------------------------------------------------------------------

TEST(LlamaModel, RejectsUnsupportedOptionsClearly) {
  const LlamaConfig config = test::tiny_llama();
  ModelOptions typo = test::lora_options(Precision::BF16, true);
  typo.lora_targets = {"q_proj", "gate_prj"};
  EXPECT_EQ(error_of([&] { LlamaModel::random(config, 0, typo); }),
            "lora_target_modules: unknown module 'gate_prj' (did you mean 'gate_proj'?); allowed: q_proj, k_proj, "
            "v_proj, o_proj, gate_proj, up_proj, down_proj");
  ModelOptions full_nf4 = test::full_options(Precision::BF16);
  full_nf4.quantize_base = true;
  EXPECT_NE(error_of([&] { LlamaModel::random(config, 0, full_nf4); }).find("quantize_base must be off"),
            std::string::npos);
  ModelOptions bad_dropout = test::lora_options(Precision::BF16, false, 1.0);
  EXPECT_EQ(error_of([&] { LlamaModel::random(config, 0, bad_dropout); }), "lora_dropout must be in [0, 1), got 1");
  LlamaConfig mistral = config;
  mistral.model_type = "mistral";
  mistral.sliding_window = 6;
  LlamaModel windowed = LlamaModel::random(mistral, 0, test::lora_options(Precision::BF16, true));
  EXPECT_NO_THROW(windowed.evaluate(test::random_batch(1, 6, config.vocab_size, 1)));
  EXPECT_EQ(error_of([&] { windowed.evaluate(test::random_batch(1, 7, config.vocab_size, 1)); }),
            "a sequence of 7 tokens exceeds the model's sliding_window of 6: sliding-window attention is not "
            "implemented yet, so use a context_length of at most 6");
  EXPECT_EQ(parse_precision("bf16_autocast"), Precision::BF16Autocast);
  EXPECT_EQ(error_of([] { parse_precision("bf61"); }),
            "precision 'bf61' is not supported (did you mean 'bf16'?); allowed: fp32, bf16, fp16_autocast, "
            "bf16_autocast, bf16_buffers_autocast");
  EXPECT_EQ(activation_dtype(Precision::FP32), DType::F32);
  EXPECT_EQ(activation_dtype(Precision::BF16BuffersAutocast), DType::BF16);
}

TEST(LlamaModel, TrainableParametersPerTrainType) {
  const LlamaConfig config = test::tiny_llama();
  LlamaModel lora = LlamaModel::random(config, 0, test::lora_options(Precision::BF16, true));
  const auto params = lora.trainable_parameters();
  ASSERT_EQ(params.size(), 2u * 7u * 2u);
  EXPECT_EQ(params[0].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
  EXPECT_EQ(params[0].master->shape(), (Shape{4, 64}));
  EXPECT_EQ(params[1].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  EXPECT_EQ(params[1].master->shape(), (Shape{64, 4}));
  EXPECT_EQ(params[13].name, "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight");
  EXPECT_EQ(params[13].master->shape(), (Shape{64, 4}));
  for (const auto& p : params) {
    EXPECT_EQ(p.master->dtype(), DType::F32);
    EXPECT_EQ(p.grad->shape(), p.master->shape());
  }
  LlamaModel full = LlamaModel::random(config, 0, test::full_options(Precision::BF16));
  const auto all = full.trainable_parameters();
  const auto specs = hf_tensor_specs(config);
  ASSERT_EQ(all.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(all[i].name, specs[i].name);
}

// hqq_lora's base built as the trainer builds it (build_whole_unit, unit by unit): the solver sees
// each linear group twice, once measuring the tensor's errors (all 20 iterations, before the
// number of updates is known) and once for the codes, whose run also gives the zero points
// (FrozenFormat::encode_pieces_with_scalars). The memo sits above hqq_solve_groups, so this holds
// whichever device solves; a third run (the zero points solved on their own, issue #25's
// suspicion) or a second measuring would show here.
TEST(LlamaModel, HqqBaseSolvesEachLinearGroupTwice) {
  const LlamaConfig config = test::tiny_llama();
  ModelOptions options = test::lora_options(Precision::BF16, /*quantize_base=*/true);
  options.hqq_bits = 4;
  int64_t groups = 0;
  for (const std::string& module : linear_module_names()) {
    const auto [out, in] = linear_shape(config, module);
    groups += config.num_hidden_layers * out * in / kHqqGroupSize;
  }
  const int64_t before = hqq_solver_work().groups;
  const LlamaModel model = LlamaModel::random(config, 0, options);
  EXPECT_EQ(hqq_solver_work().groups - before, 2 * groups);
}

TEST(LlamaModel, MastersUpdatedRefreshesComputeCopies) {
  // bf16 full fine-tuning computes with bf16 copies of the fp32 masters: a changed master takes
  // effect at masters_updated(), rounded to bf16.
  const LlamaConfig config = test::tiny_llama();
  LlamaModel model = LlamaModel::random(config, 0, test::full_options(Precision::BF16));
  const data::Batch batch = test::random_batch(1, 6, config.vocab_size, 7);
  const Tensor before = model.logits(batch);
  TrainableParameter head = model.trainable_parameters().back();
  ASSERT_EQ(head.name, "lm_head.weight");
  for (int64_t i = 0; i < head.master->numel(); ++i) head.master->data<float>()[i] *= 1.5f;
  EXPECT_TRUE(test::same_bits(model.logits(batch), before));
  model.masters_updated();
  EXPECT_FALSE(test::same_bits(model.logits(batch), before));
}

}  // namespace
}  // namespace fsdpq
