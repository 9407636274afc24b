// LlamaModel training smoke tests: AdamW on one fixed tiny batch must drive the loss down clearly
// for lora and qlora (memorisation of 2 × 16 tokens through rank-8 adapters on every linear).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "model/llama_model.h"
#include "model/unit_build.h"
#include "quant/hqq_solve.h"
#include "model_llama_test_support.h"

namespace fsdpq {
namespace {

// 30 AdamW steps (lr 1e-2, betas 0.9/0.95, eps 1e-5, no weight decay), dropout 0.1; the final
// loss (evaluate(), no dropout) must be below half of the initial one. The base uses
// initializer_range 0.1: with HF's 0.02 the frozen lm_head of a random 64-wide model is too weak
// (logits move by about 1 at most) for any adapter to fit the batch (loss 5.7 → 4.5 only); with 0.1 it
// falls from 5.9 to 0.8.
void expect_training_reduces_loss(const ModelOptions& options) {
  const LlamaConfig config = test::tiny_llama(300, 0.1);
  LlamaModel model = LlamaModel::random(config, 17, options);
  const data::Batch batch = test::random_batch(2, 16, config.vocab_size, 18);
  const test::LossBeforeAndAfter loss = test::train_on_one_batch(model, batch);
  EXPECT_LT(loss.final, 0.5 * loss.initial) << "initial " << loss.initial << " final " << loss.final;
}

TEST(LlamaModelTraining, LoraLossFalls) {
  expect_training_reduces_loss(test::lora_options(Precision::BF16, /*quantize_base=*/false, 0.1, /*rank=*/8));
}

TEST(LlamaModelTraining, QloraLossFalls) {
  expect_training_reduces_loss(test::lora_options(Precision::BF16, /*quantize_base=*/true, 0.1, /*rank=*/8));
}

// Not a check, a measurement (run with --gtest_also_run_disabled_tests): CPU time of one
// forward_backward of the tiny preset (vocab 32000) at B = 8, T = 128 for each train type.
TEST(LlamaModelTiming, DISABLED_TinyPresetForwardBackward) {
  struct Mode {
    const char* name;
    ModelOptions options;
    int64_t vocab = 32000;  // the preset's; 300 shows what the decoder layers alone cost
  };
  ModelOptions lora64 = test::lora_options(Precision::BF16, true, 0.1, 64);
  ModelOptions lora_bf16 = test::lora_options(Precision::BF16, false, 0.1, 64);
  ModelOptions fp32 = test::lora_options(Precision::FP32, true, 0.1, 64);
  ModelOptions no_ckpt = lora64;
  no_ckpt.gradient_checkpointing = false;
  const std::vector<Mode> modes = {{"qlora bf16 r64 ckpt", lora64},
                                   {"qlora bf16 r64 no ckpt", no_ckpt},
                                   {"lora bf16 r64 ckpt", lora_bf16},
                                   {"qlora fp32 r64 ckpt", fp32},
                                   {"full bf16 ckpt", test::full_options(Precision::BF16)},
                                   {"qlora bf16 r64 V=300", lora64, 300}};
  for (const Mode& mode : modes) {
    LlamaConfig config = preset_or_fail("tiny");
    config.vocab_size = mode.vocab;
    const data::Batch batch = test::random_batch(8, 128, config.vocab_size, 1);
    LlamaModel model = LlamaModel::random(config, 0, mode.options);
    model.forward_backward(batch, 1000.0, 1.0f, 0);  // warm-up
    const int runs = 5;
    double best = 1e30, total = 0;
    for (int i = 0; i < runs; ++i) {
      const auto start = std::chrono::steady_clock::now();
      model.forward_backward(batch, 1000.0, 1.0f, static_cast<uint64_t>(i));
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      best = std::min(best, s);
      total += s;
    }
    const auto t0 = std::chrono::steady_clock::now();
    model.evaluate(batch);
    const double eval = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-24s forward_backward best %.1f ms, mean %.1f ms; evaluate %.1f ms\n", mode.name, 1e3 * best,
                1e3 * total / runs, 1e3 * eval);
  }
}

// Not a check, a measurement (run with --gtest_also_run_disabled_tests): hqq_lora's start-up on one
// decoder layer of Llama-2-7B's shape (vocab 256), the trainer's build path (build_whole_unit). The
// encoding outside the solver is what a GPU run spends on the host besides the solver (issue #25);
// the solver's own time includes reading the values into its groups (quant/hqq_solve.h).
TEST(LlamaModelTiming, DISABLED_HqqStartOfA7bLayer) {
  LlamaConfig config = preset_or_fail("llama2-7b");
  config.num_hidden_layers = 1;
  config.vocab_size = 256;
  ModelOptions options = test::lora_options(Precision::BF16, /*quantize_base=*/true, 0.1, 64);
  options.hqq_bits = 4;
  const UnitBuildTimes build_before = unit_build_times();
  const HqqSolverWork solver_before = hqq_solver_work();
  const auto start = std::chrono::steady_clock::now();
  const LlamaModel model = LlamaModel::random(config, 0, options);
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const UnitBuildTimes build = unit_build_times();
  const HqqSolverWork solver = hqq_solver_work();
  const double solve = solver.seconds - solver_before.seconds, encode = build.encode_seconds - build_before.encode_seconds;
  const auto values = static_cast<double>(solver.groups - solver_before.groups) / 2 * 64;
  std::printf("7B layer, hqq 4 bits: built in %.2f s; values read in %.2f s, encoded in %.2f s, of which the solver "
              "%.2f s (%lld groups); outside the solver %.2f s = %.2f ns a value\n",
              total, build.read_seconds - build_before.read_seconds, encode, solve,
              static_cast<long long>(solver.groups - solver_before.groups), encode - solve, (encode - solve) / values * 1e9);
}

}  // namespace
}  // namespace fsdpq
