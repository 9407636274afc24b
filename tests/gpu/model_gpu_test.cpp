// The whole model on the GPU against itself on the CPU: the same tiny Llama, options and batch
// give the same loss and LoRA (or full) gradients. This is what every op parity test adds up to.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "gpu/op_parity.h"
#include "ops/cuda_ops.h"
#include "ops/lora.h"
#include "unit/model_llama_test_support.h"

namespace fsdpq {
namespace {

struct Outcome {
  LossSum loss;
  std::vector<std::vector<double>> grads;
  std::vector<double> logits;
};

// random_b: every adapter's B random (else PEFT's zeros, which leave dA and the adapters' part of
// dx at zero).
Outcome run(const LlamaConfig& config, const ModelOptions& options, const data::Batch& batch, Device device,
            bool random_b = false) {
  LlamaModel model = LlamaModel::random(config, 7, options);
  if (random_b) test::randomize_lora_b(model, 8);
  if (device == Device::CUDA) model.place_on(Device::CUDA);
  Outcome out;
  out.loss = model.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, 3);
  for (const TrainableParameter& p : model.trainable_parameters()) out.grads.push_back(test::values_of(*p.grad));
  Tensor logits = model.logits(batch);
  out.logits = test::values_of(logits);
  return out;
}

// A case of the bit-for-bit tests: its name and the model's options.
struct NamedOptions {
  const char* name;
  ModelOptions options;
};

// The backward orders the bit-for-bit tests run: 0 plain, 1 every layer recomputed, 2 every other.
constexpr int kRecomputeOrders[] = {0, 1, 2};
void recompute_every(ModelOptions& options, int every) {
  options.gradient_checkpointing = every > 0;
  options.checkpoint_every = std::max(every, 1);
}

// The same loss, logits and gradients, bit for bit.
void expect_same_bits(const Outcome& got, const Outcome& want) {
  EXPECT_EQ(got.loss.loss_sum, want.loss.loss_sum);
  EXPECT_EQ(got.logits, want.logits);
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < want.grads.size(); ++i) EXPECT_EQ(got.grads[i], want.grads[i]) << "gradient " << i;
}

TEST(GpuModel, LossAndGradientsMatchTheCpuBackend) {
  test::use_gpu();
  const LlamaConfig config = test::tiny_llama();
  const data::Batch batch = test::random_batch(2, 33, config.vocab_size, 5);
  struct Case {
    const char* name;
    ModelOptions options;
    double loss_tol, grad_tol;
    bool checkpointing = true;
  };
  // fp32: only summation order differs (cuBLAS, flash-style attention): 1e-5 on the loss, 1e-4 on
  // gradients. bf16: the GPU also rounds fp32 gradients to bf16 before each GEMM (autocast), so
  // gradients differ by a few bf16 ulps: 2e-3 on the loss, 5e-2 normwise on gradients.
  std::vector<Case> cases = {
      {"lora fp32", test::lora_options(Precision::FP32, false), 1e-5, 1e-4},
      {"qlora fp32", test::lora_options(Precision::FP32, true), 1e-5, 1e-4},
      {"lora bf16 no checkpointing", test::lora_options(Precision::BF16, false), 2e-3, 5e-2, false},
      {"qlora bf16 dropout", test::lora_options(Precision::BF16, true, 0.1), 2e-3, 5e-2},
      {"qlora fp16", test::lora_options(Precision::FP16Autocast, true), 2e-3, 5e-2},
      {"full bf16", test::full_options(Precision::BF16), 2e-3, 5e-2},
  };
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    c.options.gradient_checkpointing = c.checkpointing;
    const Outcome cpu = run(config, c.options, batch, Device::CPU);
    const Outcome gpu = run(config, c.options, batch, Device::CUDA);
    EXPECT_EQ(gpu.loss.tokens, cpu.loss.tokens);
    EXPECT_NEAR(gpu.loss.mean(), cpu.loss.mean(), c.loss_tol * std::abs(cpu.loss.mean()));
    EXPECT_LE(test::relative_error(gpu.logits, cpu.logits), c.loss_tol * 10) << "logits";
    ASSERT_EQ(gpu.grads.size(), cpu.grads.size());
    double worst = 0;
    for (size_t i = 0; i < cpu.grads.size(); ++i) worst = std::max(worst, test::relative_error(gpu.grads[i], cpu.grads[i]));
    EXPECT_LE(worst, c.grad_tol) << "worst gradient's normalized error";
    std::printf("%s: loss cpu %.6f gpu %.6f, worst gradient error %.2e\n", c.name, cpu.loss.mean(), gpu.loss.mean(), worst);
  }
}

// recompute_elementwise on the GPU: the backward's recomputed norm outputs and SwiGLU products are
// the forward's bits (deterministic kernels on the same inputs), so the gradients equal keeping
// them, to the bit, alone and beside every-other-layer checkpointing.
TEST(GpuModel, ElementwiseRecomputeGivesTheSameBits) {
  test::use_gpu();
  LlamaConfig config = test::tiny_llama();
  config.num_hidden_layers = 4;
  const data::Batch batch = test::random_batch(2, 33, config.vocab_size, 6);
  for (bool checkpointing : {false, true}) {
    SCOPED_TRACE(checkpointing ? "checkpoint_every 2" : "no checkpointing");
    ModelOptions options = test::lora_options(Precision::BF16, true, 0.1);
    options.gradient_checkpointing = checkpointing;
    options.checkpoint_every = checkpointing ? 2 : 1;
    const Outcome kept = run(config, options, batch, Device::CUDA);
    options.recompute_elementwise = true;
    const Outcome trimmed = run(config, options, batch, Device::CUDA);
    EXPECT_EQ(trimmed.loss.loss_sum, kept.loss.loss_sum);
    ASSERT_EQ(trimmed.grads.size(), kept.grads.size());
    for (size_t i = 0; i < kept.grads.size(); ++i) EXPECT_EQ(trimmed.grads[i], kept.grads[i]) << "gradient " << i;
  }
}

// keep_activation_layers on the GPU: the last layers not recomputed give the bits of full
// checkpointing (and of none), the kept layers' activations read from the forward, with the
// dequantisation on its side stream and the LoRA kernels of the GPU.
TEST(GpuModel, KeptActivationLayersGiveTheSameBits) {
  test::use_gpu();
  const LlamaConfig config = test::tiny_llama_wide();
  const data::Batch batch = test::random_batch(2, 64, config.vocab_size, 13);
  ModelOptions options = test::lora_options(Precision::BF16, true, 0.1);
  options.gradient_checkpointing = true;
  const Outcome every_layer = run(config, options, batch, Device::CUDA);
  for (int64_t keep : {1, 2, 4}) {
    SCOPED_TRACE(fmt::format("the last {} layers not recomputed", keep));
    options.keep_activation_layers = keep;
    const Outcome kept = run(config, options, batch, Device::CUDA);
    EXPECT_EQ(kept.loss.loss_sum, every_layer.loss.loss_sum);
    ASSERT_EQ(kept.grads.size(), every_layer.grads.size());
    for (size_t i = 0; i < kept.grads.size(); ++i) EXPECT_EQ(kept.grads[i], every_layer.grads[i]) << "gradient " << i;
  }
}

// use_activation_cpu_offload on the GPU: the layer inputs go to host memory on a side stream and
// come back beside the next layer's backward (model/activation_offload.h). Two passes of one model
// (the host buffers reused, gradients accumulated) give the bits of keeping the inputs on the GPU,
// or a copy was read before it was complete or a block freed while a copy still read it. Every
// layer or every other one recomputed, none or two of the last not recomputed; beside them, no
// checkpointing at all (a recomputed layer's kept xa, LayerActivations::xa_kept, read by the
// fused and folded LoRA kernels).
TEST(GpuModel, ActivationOffloadGivesTheSameBits) {
  test::use_gpu();
  const LlamaConfig config = test::tiny_llama_wide();
  const data::Batch batch = test::random_batch(2, 64, config.vocab_size, 14);
  auto two_passes = [&](const ModelOptions& options) {
    LlamaModel model = LlamaModel::random(config, 7, options);
    test::randomize_lora_b(model, 8);
    model.place_on(Device::CUDA);
    Outcome out;
    out.loss = model.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, 3);
    const LossSum second = model.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, 4);
    out.loss.loss_sum += second.loss_sum;
    for (const TrainableParameter& p : model.trainable_parameters()) out.grads.push_back(test::values_of(*p.grad));
    return out;
  };
  for (bool fold : {false, true}) {
    const test::LoraFoldSetting folded(fold);
    ModelOptions options = test::lora_options(Precision::BF16, true, 0.1);
    const Outcome plain = two_passes(options);
    options.gradient_checkpointing = true;
    for (int64_t every : {1, 2})
      for (int64_t keep : {0, 2}) {
        options.checkpoint_every = every;
        options.keep_activation_layers = keep;
        options.activation_offload = false;
        const Outcome on_gpu = two_passes(options);
        options.activation_offload = true;
        const Outcome offloaded = two_passes(options);
        for (const Outcome* o : {&on_gpu, &offloaded}) {
          SCOPED_TRACE(fmt::format("{}, checkpoint_every {}, keep {}{}", fold ? "folded" : "not folded", every, keep,
                                   o == &on_gpu ? "" : ", activation offload"));
          EXPECT_EQ(o->loss.loss_sum, plain.loss.loss_sum);
          ASSERT_EQ(o->grads.size(), plain.grads.size());
          for (size_t i = 0; i < plain.grads.size(); ++i) EXPECT_EQ(o->grads[i], plain.grads[i]) << "gradient " << i;
        }
      }
  }
}

// The base weights dequantised on a side stream (the default) against in line on the compute
// stream: the same bits, or a product ran before its weight was ready (its buffer still held the
// previous layer's module: another loss). Widths large enough that a dequantisation takes a while,
// every quantised format, DoRA (which reads the weight for its norms too), and the backward's
// orders: plain, every layer recomputed, every other layer recomputed.
TEST(GpuModel, DequantizingBesideTheComputeStreamGivesTheSameBits) {
  test::use_gpu();
  const LlamaConfig config = test::tiny_llama_wide();
  const data::Batch batch = test::random_batch(2, 64, config.vocab_size, 8);
  std::vector<NamedOptions> cases = {{"qlora bf16 dropout", test::lora_options(Precision::BF16, true, 0.1)},
                             {"qlora fp32", test::lora_options(Precision::FP32, true)},
                             {"hqq 4 bits bf16", test::lora_options(Precision::BF16, true)},
                             {"bnb_dora bf16", test::lora_options(Precision::BF16, true)}};
  cases[2].options.hqq_bits = 4;
  cases[3].options.use_dora = true;
  for (NamedOptions& c : cases)
    for (int every : kRecomputeOrders) {
      SCOPED_TRACE(fmt::format("{}, checkpoint_every {}", c.name, every));
      recompute_every(c.options, every);
      set_gpu_dequantize_stream(GpuDequantizeStream::Compute);
      const Outcome in_line = run(config, c.options, batch, Device::CUDA);
      set_gpu_dequantize_stream(GpuDequantizeStream::Side);
      expect_same_bits(run(config, c.options, batch, Device::CUDA), in_line);
    }
}

// The adapters' dB, d(xa) and dA on their side stream (the default) against on the compute stream:
// the same bits, or the compute stream read a d(xa) before it was written, or a block the side
// stream still read went back to the allocator's pool and was overwritten (another gradient).
// Widths at which the Hopper LoRA kernels run, every group of a layer, dropout and none, fp32, and
// the backward's orders (plain, every layer recomputed, every other layer); DoRA keeps its own path.
TEST(GpuModel, AdapterStreamGivesTheSameBits) {
  test::use_gpu();
  const LlamaConfig config = test::tiny_llama_wide();
  const data::Batch batch = test::random_batch(2, 64, config.vocab_size, 8);
  std::vector<NamedOptions> cases = {{"qlora bf16 dropout r64", test::lora_options(Precision::BF16, true, 0.1, 64)},
                             {"qlora bf16", test::lora_options(Precision::BF16, true)},
                             {"lora fp32 dropout r64", test::lora_options(Precision::FP32, false, 0.1, 64)},
                             {"bnb_dora bf16", test::lora_options(Precision::BF16, true)}};
  cases[3].options.use_dora = true;
  const std::optional<StreamPriority> saved = gpu_adapter_stream();
  for (NamedOptions& c : cases)
    for (int every : kRecomputeOrders) {
      SCOPED_TRACE(fmt::format("{}, checkpoint_every {}", c.name, every));
      recompute_every(c.options, every);
      set_gpu_adapter_stream(std::nullopt);
      const Outcome in_line = run(config, c.options, batch, Device::CUDA, /*random_b=*/true);
      for (StreamPriority priority : {StreamPriority::Normal, StreamPriority::High}) {
        set_gpu_adapter_stream(priority);
        expect_same_bits(run(config, c.options, batch, Device::CUDA, /*random_b=*/true), in_line);
      }
    }
  set_gpu_adapter_stream(saved);
}

// keep_dequantized_layers on the GPU, the dequantisation on its side stream: the first pass fills
// the kept layers' buffers there and every later read (its backward, the next passes) waits for
// that fill's marks. Two training passes of one model with the adapters moved between them (the
// fold's s·B blocks rewritten), then a logits pass: the same bits as dequantising every pass, or a
// product read a buffer before it was filled.
TEST(GpuModel, KeptDequantizedLayersGiveTheSameBits) {
  test::use_gpu();
  const LlamaConfig config = test::tiny_llama_wide();
  const data::Batch batch = test::random_batch(2, 64, config.vocab_size, 12);
  ModelOptions qlora = test::lora_options(Precision::BF16, true, 0.1), hqq = qlora, dora = qlora;
  hqq.hqq_bits = 4;
  dora.use_dora = true;
  auto two_passes = [&](ModelOptions options) {
    LlamaModel model = LlamaModel::random(config, 7, options);
    test::randomize_lora_b(model, 8);
    model.place_on(Device::CUDA);
    Outcome out;
    model.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, 3);
    for (const TrainableParameter& p : model.trainable_parameters()) {  // the masters live on the host
      if (p.master->device() != Device::CPU) {  // bf16: the compute copies move, the masters stay
        ADD_FAILURE() << p.name << "'s master is not on the host";
        return out;
      }
      const std::vector<double> grad = test::values_of(*p.grad);
      float* master = p.master->data<float>();
      for (size_t i = 0; i < grad.size(); ++i) master[i] -= 0.5f * static_cast<float>(grad[i]);
    }
    model.masters_updated();
    model.zero_grads();
    out.loss = model.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, 4);
    for (const TrainableParameter& p : model.trainable_parameters()) out.grads.push_back(test::values_of(*p.grad));
    out.logits = test::values_of(model.logits(batch));
    return out;
  };
  set_gpu_dequantize_stream(GpuDequantizeStream::Side);
  for (const auto& [name, base] : {std::pair{"qlora bf16 dropout", qlora}, std::pair{"hqq 4 bits", hqq}, std::pair{"bnb_dora", dora}})
    for (int every : kRecomputeOrders) {
      ModelOptions options = base;
      recompute_every(options, every);
      const Outcome plain = two_passes(options);
      for (int64_t keep : {2, 4}) {
        SCOPED_TRACE(fmt::format("{}, checkpoint_every {}, keep {}", name, every, keep));
        options.keep_dequantized_layers = keep;
        const Outcome kept = two_passes(options);
        EXPECT_EQ(kept.loss.loss_sum, plain.loss.loss_sum);
        EXPECT_EQ(kept.logits, plain.logits);
        ASSERT_EQ(kept.grads.size(), plain.grads.size());
        for (size_t i = 0; i < plain.grads.size(); ++i) EXPECT_EQ(kept.grads[i], plain.grads[i]) << "gradient " << i;
      }
    }
}

// The fused LoRA kernels in the whole model (FSDPQ_LORA_KERNELS=fused; on an H100/H200 its rank-64
// groups take the wgmma kernels, kernels/lora_fused_sm90a.cuh), alone and with the folded B
// products (FSDPQ_LORA_FOLD): the CPU's loss and gradients within the bf16 tolerances of
// LossAndGradientsMatchTheCpuBackend, at widths every group of the kernels takes (in 512, 1408).
TEST(GpuModel, FusedLoraKernelsMatchTheCpu) {
  test::use_gpu();
  const LlamaConfig config = test::tiny_llama_wide();
  const data::Batch batch = test::random_batch(2, 64, config.vocab_size, 10);
  ModelOptions options = test::lora_options(Precision::BF16, true, 0.1, 64);
  options.gradient_checkpointing = true;
  const GpuLoraKernels saved = gpu_lora_kernels();
  for (bool fold : {false, true}) {
    SCOPED_TRACE(fold ? "fused kernels, folded B products" : "fused kernels");
    const test::LoraFoldSetting folding(fold);
    const Outcome cpu = run(config, options, batch, Device::CPU, /*random_b=*/true);
    set_gpu_lora_kernels(GpuLoraKernels::Fused);
    const int64_t before = cuda_ops::lora_fused_runs();
    const Outcome gpu = run(config, options, batch, Device::CUDA, /*random_b=*/true);
    set_gpu_lora_kernels(saved);
    EXPECT_GT(cuda_ops::lora_fused_runs(), before) << "the fused kernels did not run";
    EXPECT_NEAR(gpu.loss.mean(), cpu.loss.mean(), 2e-3 * std::abs(cpu.loss.mean()));
    double worst = 0;
    for (size_t i = 0; i < cpu.grads.size(); ++i) worst = std::max(worst, test::relative_error(gpu.grads[i], cpu.grads[i]));
    EXPECT_LE(worst, 5e-2) << "worst gradient's normalized error";
    std::printf("fused LoRA kernels%s: loss cpu %.6f gpu %.6f, worst gradient error %.2e\n", fold ? ", folded" : "",
                cpu.loss.mean(), gpu.loss.mean(), worst);
  }
}

}  // namespace
}  // namespace fsdpq
