// FSDPQ_LORA_FOLD (LayerCompute, model/llama_layer.h): every group's LoRA B products (q/k/v, o, gate/up, down) folded
// into their base GEMMs. The fold computes the same sums in another grouping (one GEMM over
// [x | xa] instead of the B product rounded into y, then the base product added), so against the
// separate products it agrees to rounding; against itself it is exact: a checkpointed recompute
// gives the forward's bits, and where it does not apply (dense bases, DoRA) nothing changes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "model/llama_model.h"
#include "ops/elementwise.h"
#include "model_llama_test_support.h"
#include "test_support.h"

namespace fsdpq {
namespace {

using test::GradSnapshot;
using test::run_step;

GradSnapshot run_with(bool fold, const LlamaConfig& config, const ModelOptions& options, bool checkpointing,
                      const data::Batch& batch) {
  const test::LoraFoldSetting setting(fold);
  return run_step(config, options, checkpointing, batch, /*step_key=*/5);
}

std::vector<double> doubles_of(const Tensor& t) {
  const std::vector<float> f = test::floats_of(t);
  return {f.begin(), f.end()};
}

// The worst normwise relative error over the gradient tensors.
double worst_gradient_error(const GradSnapshot& got, const GradSnapshot& want) {
  double worst = 0;
  for (size_t i = 0; i < want.grads.size(); ++i)
    worst = std::max(worst, test::normwise_error(doubles_of(got.grads[i]), doubles_of(want.grads[i])));
  return worst;
}

// run_step's model with every B left at PEFT's zeros: the base model's gradients.
GradSnapshot without_adapters_b(const LlamaConfig& config, ModelOptions options, const data::Batch& batch) {
  options.gradient_checkpointing = false;
  LlamaModel model = LlamaModel::random(config, 9, options);
  GradSnapshot snap;
  snap.loss = model.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, 5);
  for (const TrainableParameter& p : model.trainable_parameters()) {
    Tensor copy = Tensor::empty(p.grad->shape(), DType::F32);
    copy_convert(copy, *p.grad);
    snap.grads.push_back(std::move(copy));
  }
  return snap;
}

struct QuantisedCase {
  const char* name;
  ModelOptions options;
  double loss_tol, grad_tol;
};

std::vector<QuantisedCase> quantised_cases() {
  // fp32: only the grouping of the fp32 sums differs. bf16: the separate products round the B
  // product to bf16 before adding the base's, the fold rounds once: a bf16 ulp or so per output.
  // alpha 6, r 4: scaling 1.5, so s·B is rounded into the folded weight too.
  std::vector<QuantisedCase> cases = {
      {"qlora fp32", test::lora_options(Precision::FP32, true), 1e-6, 1e-5},
      {"qlora bf16 dropout", test::lora_options(Precision::BF16, true, 0.1), 2e-3, 5e-2},
      {"qlora bf16 scaling 1.5", test::lora_options(Precision::BF16, true, 0.1), 2e-3, 5e-2},
      {"hqq 4 bits bf16 dropout", test::lora_options(Precision::BF16, true, 0.1), 2e-3, 5e-2},
  };
  cases[2].options.lora_alpha = 6;
  cases[3].options.hqq_bits = 4;
  return cases;
}

TEST(LoraFold, AgreesWithTheSeparateProductsToRounding) {
  LlamaConfig config = test::tiny_llama();
  config.num_hidden_layers = 3;
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 31);
  for (const QuantisedCase& c : quantised_cases()) {
    SCOPED_TRACE(c.name);
    const GradSnapshot separate = run_with(false, config, c.options, false, batch);
    const GradSnapshot folded = run_with(true, config, c.options, false, batch);
    EXPECT_EQ(folded.loss.tokens, separate.loss.tokens);
    EXPECT_NEAR(folded.loss.mean(), separate.loss.mean(), c.loss_tol * std::abs(separate.loss.mean()));
    const double worst = worst_gradient_error(folded, separate);
    EXPECT_LE(worst, c.grad_tol);
    std::printf("%s: loss separate %.7f folded %.7f, worst gradient error %.2e\n", c.name, separate.loss.mean(),
                folded.loss.mean(), worst);
    // The fold ran (its rounding shows somewhere), and what it folds matters: the adapters' B
    // products move the gradients far past the tolerance (a fold that dropped them would fail).
    bool any_bit_differs = false;
    for (size_t i = 0; i < separate.grads.size(); ++i) any_bit_differs |= !test::same_bits(folded.grads[i], separate.grads[i]);
    EXPECT_TRUE(any_bit_differs);
    EXPECT_GT(worst_gradient_error(without_adapters_b(config, c.options, batch), separate), 10 * c.grad_tol);
  }
}

// The recompute folds as the forward did: every-k-th-layer checkpointing gives the bits of keeping
// every activation, the dropout masks and the s·B blocks made again from the same values.
TEST(LoraFold, CheckpointedRecomputeGivesTheForwardsBits) {
  LlamaConfig config = test::tiny_llama();
  config.num_hidden_layers = 3;
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 32);
  for (QuantisedCase c : quantised_cases()) {
    SCOPED_TRACE(c.name);
    const GradSnapshot kept = run_with(true, config, c.options, false, batch);
    for (int64_t every : {1, 2}) {
      c.options.checkpoint_every = every;
      test::expect_bit_identical(run_with(true, config, c.options, true, batch), kept);
    }
  }
}

// Where no group qualifies the fold changes nothing: dense bases (lora), DoRA (its linears run on
// their own), full fine-tuning.
TEST(LoraFold, LeavesDenseBasesDoraAndFullFineTuningAlone) {
  const LlamaConfig config = test::tiny_llama();
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 33);
  ModelOptions dora = test::lora_options(Precision::BF16, true, 0.1);
  dora.use_dora = true;
  for (const ModelOptions& options :
       {test::lora_options(Precision::BF16, false, 0.1), dora, test::full_options(Precision::BF16)}) {
    SCOPED_TRACE(options.train_base ? "full" : options.use_dora ? "dora" : "lora");
    test::expect_bit_identical(run_with(true, config, options, true, batch), run_with(false, config, options, true, batch));
  }
}

// Training with the fold: the s·B blocks follow every optimizer step (a block left at the first
// step's B would train another model), so 8 AdamW steps end where the separate products end.
TEST(LoraFold, TrainsLikeTheSeparateProducts) {
  const LlamaConfig config = test::tiny_llama();
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 34);
  const ModelOptions options = test::lora_options(Precision::FP32, true, 0.1);
  auto train = [&](bool fold) {
    const test::LoraFoldSetting setting(fold);
    LlamaModel model = LlamaModel::random(config, 9, options);
    return test::train_on_one_batch(model, batch, 8);
  };
  const test::LossBeforeAndAfter separate = train(false), folded = train(true);
  EXPECT_EQ(folded.initial, separate.initial);  // B = 0 at the start: the fold adds exact zeros
  EXPECT_LT(separate.final, separate.initial - 0.1) << "the steps must move the adapters for this to test anything";
  EXPECT_NEAR(folded.final, separate.final, 1e-5 * std::abs(separate.final));
}

}  // namespace
}  // namespace fsdpq
