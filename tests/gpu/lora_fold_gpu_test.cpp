// The folded LoRA products on the GPU (FSDPQ_LORA_FOLD, model/llama_layer.h):
//  - a quantised weight dequantised into a block of a wider matrix's columns (the kernels' pitched
//    stores, 16-byte vectors or single values) holds the CPU's dense bits, the columns around it
//    untouched;
//  - copy_block (16 bytes a thread, cudaMemcpy2DAsync, or the scaling kernel) gives the CPU's bits;
//  - the model with the fold agrees with the separate products to rounding, its checkpointed
//    recompute gives its own bits, and dequantising on the side stream (while the compute stream
//    writes the s·B blocks of the same buffers) gives the bits of doing it in line.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "gpu/op_parity.h"
#include "model/llama_model.h"
#include "ops/elementwise.h"
#include "quant/frozen_storage.h"
#include "unit/model_llama_test_support.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

using test::on_cpu;
using test::on_gpu;
using test::use_gpu;

std::vector<double> host_values(const Tensor& t) { return test::values_of(t.view()); }

TEST(GpuLoraFold, DequantisesIntoABlockOfColumnsWithTheCpusBits) {
  use_gpu();
  struct Case {
    const FrozenFormat* format;
    DType out;
    int64_t first, extra;  // columns before and after the block: 0 and 64 keep 16-byte rows; 3 forces single stores
  };
  const Case cases[] = {{&nf4_format(true), DType::BF16, 0, 64},  {&nf4_format(true), DType::BF16, 3, 3},
                        {&nf4_format(false), DType::F16, 8, 64},  {&nf4_format(false), DType::F32, 0, 3},
                        {&hqq_format(4, DType::BF16), DType::BF16, 0, 64}, {&hqq_format(3, DType::BF16), DType::F32, 3, 3}};
  const int64_t rows = 96, cols = 512;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint16_t> values(static_cast<size_t>(rows * cols));
  for (uint16_t& v : values) v = float_to_bf16(normal(rng));
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{} into {}, {} columns before, {} after", c.format->name(), dtype_name(c.out), c.first,
                             c.extra));
    FrozenStorage weight = FrozenStorage::encode(*c.format, Shape{rows, cols}, values.data(), DType::BF16);
    Tensor dense_cpu;
    weight.dense(dense_cpu, c.out);
    const std::vector<double> want = host_values(dense_cpu);
    weight.place_on(Device::CUDA);
    const int64_t wide = c.first + cols + c.extra;
    Tensor filler = Tensor::empty(Shape{rows, wide}, c.out);
    TensorView fill = filler.view();
    for (int64_t i = 0; i < filler.numel(); ++i) store_f32(fill, i, -3.0f);
    Tensor folded = on_gpu(filler.view());
    weight.dequantize_into(MatrixView(folded.view(), c.first, cols));
    const std::vector<double> got = test::values_of(folded.view());
    int64_t wrong = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < wide; ++k) {
        const bool inside = k >= c.first && k < c.first + cols;
        const double expected = inside ? want[static_cast<size_t>(r * cols + k - c.first)] : -3.0;
        if (got[static_cast<size_t>(r * wide + k)] != expected && ++wrong <= 5)
          ADD_FAILURE() << "row " << r << " column " << k << ": " << got[static_cast<size_t>(r * wide + k)]
                        << ", expected " << expected;
      }
    EXPECT_EQ(wrong, 0);
  }
}

TEST(GpuLoraFold, CopyBlockGivesTheCpusBits) {
  use_gpu();
  for (DType dst : {DType::BF16, DType::F32})
    for (float scale : {1.0f, 1.5f}) {
      SCOPED_TRACE(fmt::format("into {}, scale {}", dtype_name(dst), scale));
      const Tensor src = test::random_tensor(Shape{300, 70}, DType::BF16, 41);
      Tensor cpu = test::random_tensor(Shape{300, 100}, dst, 42);
      Tensor gpu = on_gpu(cpu.view());
      const Tensor src_gpu = on_gpu(src.view());
      copy_block(MatrixView(cpu.view(), 20, 64), MatrixView(src.view(), 6, 64), scale);
      copy_block(MatrixView(gpu.view(), 20, 64), MatrixView(src_gpu.view(), 6, 64), scale);
      EXPECT_EQ(test::values_of(gpu.view()), host_values(cpu));
    }
  // Rows, strides and pointers 16-byte aligned, one type: the 16-bytes-a-thread kernel.
  for (DType type : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(fmt::format("aligned, {}", dtype_name(type)));
    const Tensor src = test::random_tensor(Shape{300, 72}, type, 43);
    Tensor cpu = test::random_tensor(Shape{300, 104}, type, 44);
    Tensor gpu = on_gpu(cpu.view());
    const Tensor src_gpu = on_gpu(src.view());
    copy_block(MatrixView(cpu.view(), 24, 64), MatrixView(src.view(), 8, 64));
    copy_block(MatrixView(gpu.view(), 24, 64), MatrixView(src_gpu.view(), 8, 64));
    EXPECT_EQ(test::values_of(gpu.view()), host_values(cpu));
  }
}

// copy_blocks on the GPU: the one-launch kernel (16-bit, 16-byte chunks; more blocks than one
// launch takes, scaled and not) and the copy_block fallback for any other block, the CPU's bits.
TEST(GpuLoraFold, CopyBlocksGiveTheCpusBits) {
  use_gpu();
  for (DType type : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(type));
    const Tensor src = test::random_tensor(Shape{300, 72}, type, 45), src32 = test::random_tensor(Shape{300, 8}, DType::F32, 46);
    Tensor cpu = test::random_tensor(Shape{300, 168}, type, 47);
    Tensor gpu = on_gpu(cpu.view());
    const Tensor src_gpu = on_gpu(src.view()), src32_gpu = on_gpu(src32.view());
    const auto blocks = [](Tensor& dst, const Tensor& s, const Tensor& s32) {
      std::vector<BlockCopy> b;
      for (int k = 0; k < 10; ++k)  // two launches' worth, every other one scaled
        b.push_back(BlockCopy{MatrixView(dst.view(), 16 * k, 8), MatrixView(s.view(), 8 * k % 64, 8), k % 2 ? 0.375f : 1.0f});
      b.push_back(BlockCopy{MatrixView(dst.view(), 8, 8), s32});          // another type: copy_block
      b.push_back(BlockCopy{MatrixView(dst.view(), 161, 5), MatrixView(s.view(), 3, 5)});  // not whole chunks
      return b;
    };
    copy_blocks(blocks(cpu, src, src32));
    copy_blocks(blocks(gpu, src_gpu, src32_gpu));
    EXPECT_EQ(test::values_of(gpu.view()), host_values(cpu));
  }
}

struct Outcome {
  LossSum loss;
  std::vector<std::vector<double>> grads;
};

Outcome run(const LlamaConfig& config, const ModelOptions& options, const data::Batch& batch, bool fold) {
  const test::LoraFoldSetting setting(fold);
  LlamaModel model = LlamaModel::random(config, 7, options);
  test::randomize_lora_b(model, 8);
  model.place_on(Device::CUDA);
  Outcome out;
  out.loss = model.forward_backward(batch, static_cast<double>(batch.target_tokens), 1.0f, 3);
  for (const TrainableParameter& p : model.trainable_parameters()) out.grads.push_back(test::values_of(p.grad->view()));
  return out;
}

void expect_same_bits(const Outcome& got, const Outcome& want) {
  EXPECT_EQ(got.loss.loss_sum, want.loss.loss_sum);
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < want.grads.size(); ++i) EXPECT_EQ(got.grads[i], want.grads[i]) << "gradient " << i;
}

// Widths large enough that a dequantisation takes a while (the side stream's race would show).
TEST(GpuLoraFold, ModelAgreesWithSeparateProductsAndRepeatsItsBits) {
  use_gpu();
  const LlamaConfig config = test::tiny_llama_wide();
  const data::Batch batch = test::random_batch(2, 64, config.vocab_size, 9);
  struct Case {
    const char* name;
    ModelOptions options;
  };
  std::vector<Case> cases = {{"qlora bf16 dropout", test::lora_options(Precision::BF16, true, 0.1, 16)},
                             {"hqq 4 bits bf16 dropout", test::lora_options(Precision::BF16, true, 0.1, 16)}};
  cases[1].options.hqq_bits = 4;
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    c.options.gradient_checkpointing = false;
    const Outcome separate = run(config, c.options, batch, false);
    const Outcome folded = run(config, c.options, batch, true);
    EXPECT_NEAR(folded.loss.mean(), separate.loss.mean(), 2e-3 * std::abs(separate.loss.mean()));
    double worst = 0;
    for (size_t i = 0; i < separate.grads.size(); ++i)
      worst = std::max(worst, test::relative_error(folded.grads[i], separate.grads[i]));
    EXPECT_LE(worst, 5e-2);
    std::printf("%s: loss separate %.6f folded %.6f, worst gradient error %.2e\n", c.name, separate.loss.mean(),
                folded.loss.mean(), worst);
    for (int every : {1, 2}) {
      SCOPED_TRACE(fmt::format("checkpoint_every {}", every));
      c.options.gradient_checkpointing = true;
      c.options.checkpoint_every = every;
      expect_same_bits(run(config, c.options, batch, true), folded);
    }
    c.options.gradient_checkpointing = false;
    set_gpu_dequantize_stream(GpuDequantizeStream::Compute);
    const Outcome in_line = run(config, c.options, batch, true);
    set_gpu_dequantize_stream(GpuDequantizeStream::Side);
    expect_same_bits(in_line, folded);
  }
}

}  // namespace
}  // namespace fsdpq
