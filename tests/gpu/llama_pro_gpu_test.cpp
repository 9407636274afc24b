// Llama-Pro on the GPU against the CPU backend: on the GPU too the expanded model computes exactly
// the original's logits (a zero o_proj and down_proj add exactly nothing); one training pass gives
// the CPU's loss and new-block gradients; twenty AdamW steps follow the CPU's losses.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "backend/cuda_backend.h"
#include "gpu/op_parity.h"
#include "optim/optimizer.h"
#include "unit/model_llama_test_support.h"

namespace fsdpq {
namespace {

ModelOptions llama_pro_options(int hqq_bits, Precision precision, int64_t new_blocks) {
  ModelOptions o;
  o.quantize_base = true;
  o.hqq_bits = hqq_bits;
  o.train_base = false;
  o.lora_targets = {};
  o.llama_pro_new_blocks = new_blocks;
  o.precision = precision;
  return o;
}

LlamaConfig four_layers() {
  LlamaConfig config = test::tiny_llama(300, 0.1);
  config.num_hidden_layers = 4;
  return config;
}

// Applies `update(master, grad)` to every trainable tensor on host copies (an fp32 master on the
// GPU is the one the ops read) and refreshes the compute copies.
template <class Update>
void update_masters(LlamaModel& model, const Update& update) {
  for (const TrainableParameter& p : model.trainable_parameters()) {
    Tensor master = test::on_cpu(p.master->view()), grad = test::on_cpu(p.grad->view());
    update(p.name, master.data<float>(), grad.data<float>(), master.numel());
    copy_tensor(p.master->view(), master.view());
  }
  model.masters_updated();
}

LlamaModel model_on(Device device, const ModelOptions& options) {
  LlamaModel model = LlamaModel::random(four_layers(), 7, options);
  if (device == Device::CUDA) model.place_on(Device::CUDA);
  return model;
}

struct Case {
  const char* name;
  int hqq_bits;
  Precision precision;
  double loss_tol, grad_tol;  // as GpuModel's: fp32 summation order; bf16 a few ulps
};

const Case kCases[] = {
    {"bnb_llama_pro fp32", 0, Precision::FP32, 1e-5, 1e-4},
    {"bnb_llama_pro bf16", 0, Precision::BF16, 2e-3, 5e-2},
    {"hqq_llama_pro 4-bit bf16", 4, Precision::BF16, 2e-3, 5e-2},
    {"hqq_llama_pro 2-bit fp16", 2, Precision::FP16Autocast, 2e-3, 5e-2},
};

TEST(GpuLlamaPro, TheExpandedModelComputesExactlyTheOriginalsLogitsOnTheGpu) {
  test::use_gpu();
  const data::Batch batch = test::random_batch(2, 33, four_layers().vocab_size, 5);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    LlamaModel original = model_on(Device::CUDA, llama_pro_options(c.hqq_bits, c.precision, 0));
    LlamaModel expanded = model_on(Device::CUDA, llama_pro_options(c.hqq_bits, c.precision, 2));
    EXPECT_EQ(test::values_of(expanded.logits(batch)), test::values_of(original.logits(batch)));
  }
}

TEST(GpuLlamaPro, LossAndNewBlockGradientsMatchTheCpuBackend) {
  test::use_gpu();
  const data::Batch batch = test::random_batch(2, 33, four_layers().vocab_size, 5);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const ModelOptions options = llama_pro_options(c.hqq_bits, c.precision, 2);
    LlamaModel cpu = model_on(Device::CPU, options), gpu = model_on(Device::CUDA, options);
    // Step 0's gradients reach only o_proj and down_proj (the blocks are the identity): make the
    // blocks non-trivial first with one identical update on both.
    for (LlamaModel* m : {&cpu, &gpu})
      update_masters(*m, [](const std::string&, float* v, const float*, int64_t n) {
        for (int64_t i = 0; i < n; ++i) v[i] += 0.01f * static_cast<float>((i * 7919) % 13 - 6) / 6.0f;
      });
    const LossSum cpu_loss = cpu.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, 3);
    const LossSum gpu_loss = gpu.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, 3);
    EXPECT_EQ(gpu_loss.tokens, cpu_loss.tokens);
    EXPECT_NEAR(gpu_loss.mean(), cpu_loss.mean(), c.loss_tol * std::abs(cpu_loss.mean()));
    const auto cpu_params = cpu.trainable_parameters(), gpu_params = gpu.trainable_parameters();
    ASSERT_EQ(cpu_params.size(), 18u) << "two new blocks of nine weights";
    ASSERT_EQ(gpu_params.size(), cpu_params.size());
    double worst = 0;
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      EXPECT_EQ(gpu_params[i].name, cpu_params[i].name);
      worst = std::max(worst, test::relative_error(test::values_of(*gpu_params[i].grad),
                                                   test::values_of(*cpu_params[i].grad)));
    }
    EXPECT_LE(worst, c.grad_tol) << "worst gradient's normalized error";
    std::printf("%s: loss cpu %.6f gpu %.6f, worst gradient error %.2e\n", c.name, cpu_loss.mean(), gpu_loss.mean(),
                worst);
  }
}

TEST(GpuLlamaPro, TrainingFollowsTheCpuBackend) {
  test::use_gpu();
  const data::Batch batch = test::random_batch(2, 16, four_layers().vocab_size, 18);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const ModelOptions options = llama_pro_options(c.hqq_bits, c.precision, 2);
    std::vector<double> losses[2];
    for (Device device : {Device::CPU, Device::CUDA}) {
      LlamaModel model = model_on(device, options);
      std::map<std::string, ShardOptimizer> optimizers;
      const OptimizerConfig adamw = optimizer_config("adamw", 1e-2, 0.0);
      for (const TrainableParameter& p : model.trainable_parameters())
        optimizers.emplace(p.name, ShardOptimizer(adamw, p.master->numel()));
      for (int step = 0; step < 20; ++step) {
        model.zero_grads();
        const LossSum loss =
            model.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, static_cast<uint64_t>(step));
        losses[device == Device::CUDA].push_back(loss.mean());
        // The same host optimizer for both backends (as the trainer's under use_cpu_offload).
        update_masters(model, [&](const std::string& name, float* master, const float* grad, int64_t) {
          optimizers.at(name).step(master, grad, adamw.lr);
        });
      }
    }
    EXPECT_LT(losses[0].back(), 0.5 * losses[0].front()) << "the CPU run must learn for the comparison to mean anything";
    // Early steps agree closely; later ones drift with the ulps each step adds (bf16: up to 5%).
    for (size_t step = 0; step < losses[0].size(); ++step)
      EXPECT_NEAR(losses[1][step], losses[0][step], (step < 5 ? 5 : 25) * c.loss_tol * losses[0][step] + 1e-6)
          << "step " << step;
    std::printf("%s: loss cpu %.4f → %.4f, gpu %.4f → %.4f\n", c.name, losses[0].front(), losses[0].back(),
                losses[1].front(), losses[1].back());
  }
}

}  // namespace
}  // namespace fsdpq
