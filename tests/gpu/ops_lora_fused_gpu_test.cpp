// The fused LoRA kernels (kernels/lora_fused.cu: dropout applied inside the group's products) on
// groups they take, against the CPU op and against the GPU's separate path (a dropped copy of x per
// adapter and cuBLAS products), on random inputs; their determinism; and the fallback for groups
// they do not take.
//
// Tolerances (normalized L2 error, tests/gpu/op_parity.h): the fused and the separate products
// multiply the same 16-bit operands with fp32 accumulation, in another order: xa (stored 16-bit)
// and the outputs 2e-2, as GpuOpsLora's bf16 cases; dA, dB fp32 sums of 16-bit products 2e-2; dx
// adds each adapter's part before one rounding (the separate path rounds after each), 2e-2.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "gpu/op_parity.h"
#include "kernels/lora_fused_sm90a.cuh"
#include "ops/cuda_ops.h"
#include "ops/lora.h"

namespace fsdpq {
namespace {

using test::expect_close;
using test::on_gpu;
using test::random_tensor;

struct GroupCase {
  int64_t M, in;
  std::vector<int64_t> ranks, outs;
  DType dtype, dx_dtype;
  std::string name() const {
    std::string r;
    for (int64_t k : ranks) r += std::to_string(k) + " ";
    return fmt::format("M {} in {} ranks {}{} dx {}", M, in, r, dtype_name(dtype), dtype_name(dx_dtype));
  }
};

// One group's forward and backward on a device; every output on the host.
struct GroupRun {
  Tensor xa, dx;
  std::vector<Tensor> y, dA, dB;
};

class LoraGroup {
 public:
  explicit LoraGroup(const GroupCase& c, float dropout = 0.1f) : c_(c) {
    x_ = random_tensor(Shape{c.M, c.in}, c.dtype, 1);
    dx0_ = random_tensor(Shape{c.M, c.in}, c.dx_dtype, 2);
    for (size_t i = 0; i < c.ranks.size(); ++i) {
      A_.push_back(random_tensor(Shape{c.ranks[i], c.in}, c.dtype, 10 + i, -0.2f, 0.2f));
      B_.push_back(random_tensor(Shape{c.outs[i], c.ranks[i]}, c.dtype, 20 + i, -0.2f, 0.2f));
      y0_.push_back(random_tensor(Shape{c.M, c.outs[i]}, c.dtype, 30 + i));
      dy_.push_back(random_tensor(Shape{c.M, c.outs[i]}, c.dtype, 40 + i));
      params_.push_back(LoraParams{16.0f, dropout, /*training=*/true, 0x5eed00ull + i});
    }
  }

  // The group's tensors on a device, ready to run.
  struct Placed {
    Tensor x, dx, xa;
    std::vector<Tensor> A, B, y, dy, dA, dB;
    std::vector<LoraSite> sites;
    std::vector<LoraSiteGrads> grads;
    std::vector<TensorView> ys, dys;
    void step() {
      lora_forward_group(ys, xa, x, sites);
      lora_backward_group(dx, grads, dys, x, xa, sites);
    }
    // The same, with dx written (lora_backward_input's accumulate_dx false), not added to.
    void step_writing_dx() {
      lora_forward_group(ys, xa, x, sites);
      Tensor dxa = Tensor::empty(xa.shape(), DType::F32, x.device());
      backward_output(dxa);
      backward_input(dxa, /*accumulate_dx=*/false);
    }
    // The same, each step's two parts in calls of their own (lora.h: d(xa), then dB; dx, then dA),
    // as a layer with an adapter stream runs them.
    void step_in_parts(bool accumulate_dx) {
      lora_forward_group(ys, xa, x, sites);
      Tensor dxa = Tensor::empty(xa.shape(), DType::F32, x.device());
      for (size_t i = 0; i < sites.size(); ++i) lora_backward_output(dxa, i, TensorView{}, dys[i], x, xa, sites);
      for (size_t i = 0; i < sites.size(); ++i) lora_backward_output(TensorView{}, i, grads[i].dB, dys[i], x, xa, sites);
      lora_backward_input(dx, {}, dxa, x, xa, sites, accumulate_dx);
      std::vector<TensorView> dAs;
      for (const LoraSiteGrads& g : grads) dAs.push_back(g.dA);
      lora_backward_input(TensorView{}, dAs, dxa, x, xa, sites);
    }
    // The backward's two steps (lora.h): dB and d(xa) per adapter (cuBLAS on either path), then
    // every dA and dx, where the fused kernels differ from the separate ones.
    void backward_output(Tensor& dxa) {
      for (size_t i = 0; i < sites.size(); ++i) lora_backward_output(dxa, i, grads[i].dB, dys[i], x, xa, sites);
    }
    void backward_input(const Tensor& dxa, bool accumulate_dx = true) {
      std::vector<TensorView> dAs;
      for (const LoraSiteGrads& g : grads) dAs.push_back(g.dA);
      lora_backward_input(dx, dAs, dxa, x, xa, sites, accumulate_dx);
    }
  };

  Placed place(Device device) const {
    Placed p;
    auto to = [&](const Tensor& t) { return copy_to(t, device); };
    p.x = to(x_);
    p.dx = to(dx0_);
    int64_t total = 0;
    for (size_t i = 0; i < A_.size(); ++i) {
      p.A.push_back(to(A_[i]));
      p.B.push_back(to(B_[i]));
      p.y.push_back(to(y0_[i]));
      p.dy.push_back(to(dy_[i]));
      p.dA.push_back(Tensor::zeros(A_[i].shape(), DType::F32, device));
      p.dB.push_back(Tensor::zeros(B_[i].shape(), DType::F32, device));
      total += c_.ranks[i];
    }
    for (size_t i = 0; i < A_.size(); ++i) {
      p.sites.push_back(LoraSite{p.A[i], p.B[i], params_[i]});
      p.grads.push_back(LoraSiteGrads{p.dA[i], p.dB[i]});
      p.ys.push_back(p.y[i]);
      p.dys.push_back(p.dy[i]);
    }
    p.xa = Tensor::empty(Shape{c_.M, total}, c_.dtype, device);
    return p;
  }

  GroupRun run(Device device, bool accumulate_dx = true, bool in_parts = false) const {
    Placed p = place(device);
    if (in_parts)
      p.step_in_parts(accumulate_dx);
    else if (accumulate_dx)
      p.step();
    else
      p.step_writing_dx();
    GroupRun r{test::on_cpu(p.xa), test::on_cpu(p.dx), {}, {}, {}};
    for (size_t i = 0; i < p.A.size(); ++i) {
      r.y.push_back(test::on_cpu(p.y[i]));
      r.dA.push_back(test::on_cpu(p.dA[i]));
      r.dB.push_back(test::on_cpu(p.dB[i]));
    }
    return r;
  }

 private:
  GroupCase c_;
  Tensor x_, dx0_;
  std::vector<Tensor> A_, B_, y0_, dy_;
  std::vector<LoraParams> params_;
};

void expect_runs_close(const GroupRun& got, const GroupRun& want, const std::string& what) {
  expect_close(got.xa, want.xa, 2e-2, what + " xa");
  expect_close(got.dx, want.dx, 2e-2, what + " dx");
  for (size_t i = 0; i < got.y.size(); ++i) {
    expect_close(got.y[i], want.y[i], 2e-2, fmt::format("{} y {}", what, i));
    expect_close(got.dA[i], want.dA[i], 2e-2, fmt::format("{} dA {}", what, i));
    expect_close(got.dB[i], want.dB[i], 2e-2, fmt::format("{} dB {}", what, i));
  }
}

class GpuOpsLoraFused : public ::testing::Test {
 protected:
  void SetUp() override {
    test::use_gpu();
    saved_ = gpu_lora_kernels();
  }
  void TearDown() override { set_gpu_lora_kernels(saved_); }

 private:
  GpuLoraKernels saved_ = GpuLoraKernels::Fused;
};

// Groups as a Llama layer has them (q, k, v; gate, up; o; down) at small widths, rows that are and
// are not multiples of the kernels' 64-row tiles and 1024-row weight-gradient chunks, both 16-bit
// types and dx in bf16 and fp32.
TEST_F(GpuOpsLoraFused, MatchesTheCpuAndTheSeparatePath) {
  const std::vector<GroupCase> cases = {
      {77, 256, {64, 16, 16}, {256, 64, 64}, DType::BF16, DType::BF16},
      {1, 128, {16}, {128}, DType::BF16, DType::F32},
      {1100, 384, {32, 32}, {512, 512}, DType::BF16, DType::BF16},
      {2100, 512, {64}, {256}, DType::F16, DType::F16},
      {300, 1024, {128, 64, 64}, {1024, 256, 256}, DType::BF16, DType::F32},
      {64, 640, {64, 64, 64, 64}, {128, 128, 128, 128}, DType::F16, DType::F32},
  };
  for (const GroupCase& c : cases)
    for (bool slots : {true, false}) {  // on Hopper: the slots of the Hopper kernels, or the mma kernels
      SCOPED_TRACE(c.name() + (slots ? ", rank slots" : ", no rank slots"));
      cuda_ops::set_lora_rank_slots(slots);
      const LoraGroup group(c);
      const GroupRun cpu = group.run(Device::CPU);
      set_gpu_lora_kernels(GpuLoraKernels::Fused);
      const int64_t before = cuda_ops::lora_fused_runs();
      const GroupRun fused = group.run(Device::CUDA);
      EXPECT_EQ(cuda_ops::lora_fused_runs() - before, 2) << "the forward and the backward on the fused kernels";
      set_gpu_lora_kernels(GpuLoraKernels::Separate);
      const GroupRun separate = group.run(Device::CUDA);
      EXPECT_EQ(cuda_ops::lora_fused_runs() - before, 2) << "the separate path ran a fused kernel";
      expect_runs_close(fused, cpu, "fused vs cpu");
      expect_runs_close(fused, separate, "fused vs separate");
    }
  cuda_ops::set_lora_rank_slots(true);
}

// The Hopper kernels (kernels/lora_fused_sm90a.cuh) take rank-64 groups of 1 to 3 on an H100 or
// H200: the down product (rows that are and are not whole 128-row tiles, one split and several:
// 8192 rows give 4, 1 row 64), the input gradient (dx BF16, F16 and F32) and the weight gradient
// (one 1024-row chunk and several, the last partial), both 16-bit types, the masks against the
// CPU's. Elsewhere they run the mma kernels, as before.
TEST_F(GpuOpsLoraFused, HopperKernelsMatchTheCpu) {
  const bool hopper = cuda::lora_fused_sm90a_unavailable().empty();
  const std::vector<GroupCase> cases = {
      {3000, 512, {64, 64, 64}, {256, 64, 64}, DType::BF16, DType::BF16},
      {1, 128, {64}, {128}, DType::F16, DType::F16},
      {128, 256, {64, 64}, {64, 64}, DType::BF16, DType::F32},
      {8192, 1024, {64, 64, 64}, {128, 128, 128}, DType::BF16, DType::BF16},
  };
  for (const GroupCase& c : cases) {
    SCOPED_TRACE(c.name());
    const LoraGroup group(c);
    const GroupRun cpu = group.run(Device::CPU);
    set_gpu_lora_kernels(GpuLoraKernels::Fused);
    const int64_t down = cuda_ops::lora_down_sm90a_runs(), input_grad = cuda_ops::lora_input_grad_sm90a_runs(),
                  weight_grad = cuda_ops::lora_weight_grad_sm90a_runs();
    const GroupRun fused = group.run(Device::CUDA);
    EXPECT_EQ(cuda_ops::lora_down_sm90a_runs() - down, hopper ? 1 : 0) << cuda::lora_fused_sm90a_unavailable();
    EXPECT_EQ(cuda_ops::lora_input_grad_sm90a_runs() - input_grad, hopper ? 1 : 0);
    EXPECT_EQ(cuda_ops::lora_weight_grad_sm90a_runs() - weight_grad, hopper ? 1 : 0);
    expect_runs_close(fused, cpu, "fused (Hopper kernels) vs cpu");
  }
  // dx written rather than added to, through the Hopper input gradient (its own instantiation,
  // which never reads dx): the old dx (random) must not show, in fp32 and in 16 bits.
  for (const GroupCase& c : {GroupCase{300, 512, {64}, {256}, DType::BF16, DType::F32},
                             GroupCase{300, 512, {64, 64, 64}, {256, 64, 64}, DType::BF16, DType::BF16}}) {
    SCOPED_TRACE(c.name());
    const LoraGroup group(c);
    set_gpu_lora_kernels(GpuLoraKernels::Fused);
    const int64_t input_grad = cuda_ops::lora_input_grad_sm90a_runs();
    expect_runs_close(group.run(Device::CUDA, /*accumulate_dx=*/false), group.run(Device::CPU, /*accumulate_dx=*/false),
                      "fused (Hopper kernels), dx written");
    EXPECT_EQ(cuda_ops::lora_input_grad_sm90a_runs() - input_grad, hopper ? 1 : 0);
  }
}

// Ranks other than 64 on Hopper (ops/cuda/lora_fused.cpp): each adapter as ceil(r / 64) slots of
// the rank-64 kernels, the last padded with zero rows, slots of one adapter sharing its mask, at
// most 3 slots a launch. Against the CPU (xa, outputs, dx added to and written, dA, dB), the steps
// in parts against the whole steps bit for bit, and the launches counted: ranks under 64 (8, 16, a
// mix with 64), over it (100 + 28, 128), six slots in two launches, both 16-bit types, fp32 dx.
// Elsewhere (no Hopper kernels) the groups take the mma kernels or the separate products.
TEST_F(GpuOpsLoraFused, OtherRanksRunTheHopperKernelsInSlots) {
  const bool hopper = cuda::lora_fused_sm90a_unavailable().empty();
  cuda_ops::set_lora_rank_slots(true);
  set_gpu_lora_kernels(GpuLoraKernels::Fused);
  struct SlotCase {
    GroupCase c;
    int launches;  // ceil(Σ slots / 3)
  };
  for (const SlotCase& s : {SlotCase{{300, 512, {16}, {256}, DType::BF16, DType::BF16}, 1},
                            SlotCase{{300, 256, {8, 8}, {64, 64}, DType::BF16, DType::BF16}, 1},
                            SlotCase{{3000, 512, {32, 16, 48}, {256, 64, 64}, DType::BF16, DType::BF16}, 1},
                            SlotCase{{77, 256, {64, 16, 16}, {256, 64, 64}, DType::F16, DType::F16}, 1},
                            SlotCase{{300, 512, {100, 28}, {128, 64}, DType::BF16, DType::F32}, 1},
                            SlotCase{{1000, 256, {128}, {128}, DType::BF16, DType::BF16}, 1},
                            SlotCase{{1000, 384, {128, 128, 128}, {64, 64, 64}, DType::BF16, DType::BF16}, 2}}) {
    const GroupCase& c = s.c;
    SCOPED_TRACE(c.name());
    const LoraGroup group(c);
    for (bool accumulate_dx : {true, false}) {
      SCOPED_TRACE(accumulate_dx ? "dx added to" : "dx written");
      const int64_t down = cuda_ops::lora_down_sm90a_runs(), input_grad = cuda_ops::lora_input_grad_sm90a_runs(),
                    weight_grad = cuda_ops::lora_weight_grad_sm90a_runs();
      const GroupRun gpu = group.run(Device::CUDA, accumulate_dx);
      EXPECT_EQ(cuda_ops::lora_down_sm90a_runs() - down, hopper ? s.launches : 0) << cuda::lora_fused_sm90a_unavailable();
      EXPECT_EQ(cuda_ops::lora_input_grad_sm90a_runs() - input_grad, hopper ? s.launches : 0);
      EXPECT_EQ(cuda_ops::lora_weight_grad_sm90a_runs() - weight_grad, hopper ? s.launches : 0);
      expect_runs_close(gpu, group.run(Device::CPU, accumulate_dx), "rank slots vs cpu");
      const GroupRun parts = group.run(Device::CUDA, accumulate_dx, /*in_parts=*/true);
      EXPECT_EQ(test::values_of(parts.dx), test::values_of(gpu.dx)) << "dx in parts";
      for (size_t i = 0; i < gpu.dA.size(); ++i)
        EXPECT_EQ(test::values_of(parts.dA[i]), test::values_of(gpu.dA[i])) << "dA " << i << " in parts";
    }
  }
}

// lora_down_group with a copy of x (the folded GEMM's [x | xa], model/llama_layer.cpp): on Hopper
// the down kernel stores the x tiles it loads into the block, elsewhere copy_block does. Either
// way: the block holds x bit for bit, the columns around it are untouched, and xa is what the
// plain call gives; rows past the last 128-row tile, 1 to 3 adapters, one split and several.
TEST_F(GpuOpsLoraFused, DownProductCopiesXIntoABlock) {
  set_gpu_lora_kernels(GpuLoraKernels::Fused);
  for (const GroupCase& c : {GroupCase{300, 512, {64, 64, 64}, {64, 64, 64}, DType::BF16, DType::BF16},
                             GroupCase{8192, 1024, {64, 64}, {64, 64}, DType::BF16, DType::BF16},
                             GroupCase{1, 128, {64}, {64}, DType::F16, DType::F16},
                             GroupCase{300, 512, {16, 128}, {64, 64}, DType::BF16, DType::BF16},  // rank slots
                             GroupCase{300, 256, {128, 128, 128}, {64, 64, 64}, DType::BF16, DType::BF16}}) {
    SCOPED_TRACE(c.name());
    const LoraGroup group(c);
    LoraGroup::Placed p = group.place(Device::CUDA);
    const int64_t R = p.xa.shape().last(), wide_cols = c.in + R + 8;  // 8 spare columns after the block
    const Tensor before = on_gpu(random_tensor(Shape{c.M, wide_cols}, c.dtype, 70).view());
    Tensor wide = on_gpu(before.view());
    const int64_t down = cuda_ops::lora_down_sm90a_runs();
    lora_down_group(p.xa, p.x, p.sites, MatrixView(wide.view(), R, c.in));  // x after R leading columns
    const bool hopper = cuda_ops::lora_down_sm90a_runs() > down;
    Tensor xa_plain = Tensor::empty(p.xa.shape(), c.dtype, Device::CUDA);
    lora_down_group(xa_plain, p.x, p.sites);
    const std::vector<double> got = test::values_of(wide), old = test::values_of(before), x = test::values_of(p.x);
    int64_t wrong = 0, touched = 0;
    for (int64_t r = 0; r < c.M; ++r)
      for (int64_t col = 0; col < wide_cols; ++col) {
        const size_t at = static_cast<size_t>(r * wide_cols + col);
        if (col >= R && col < R + c.in)
          wrong += got[at] != x[static_cast<size_t>(r * c.in + col - R)];
        else
          touched += got[at] != old[at];
      }
    EXPECT_EQ(wrong, 0) << "x values not copied" << (hopper ? " (by the Hopper down kernel)" : "");
    EXPECT_EQ(touched, 0) << "values outside the block changed";
    EXPECT_EQ(test::values_of(p.xa), test::values_of(xa_plain)) << "xa differs from the call without the copy";
  }
}

// The Hopper input gradient's two ways to dx (kernels/lora_fused_sm90a.cu): dx of the operands'
// type and 16-byte aligned goes through shared memory and the copy engine ("staged"), other dx
// through each thread's own loads and stores. The same sums, rounded once with dx's old value
// added in the same order, so the same bits: dx at a 16-byte aligned address against the same
// values 4 bytes past one, added to and written, rows past the last 128-row tile, 1 to 3 adapters.
TEST_F(GpuOpsLoraFused, HopperInputGradientStagedGivesThePerThreadBits) {
  if (!cuda::lora_fused_sm90a_unavailable().empty()) GTEST_SKIP() << cuda::lora_fused_sm90a_unavailable();
  const int64_t M = 300, in = 512;
  for (int count = 1; count <= 3; ++count)
    for (bool accumulate : {true, false}) {
      SCOPED_TRACE(fmt::format("{} adapters, dx {}", count, accumulate ? "added to" : "written"));
      const Tensor dxa = on_gpu(random_tensor(Shape{M, 64 * count}, DType::BF16, 50).view());
      std::vector<Tensor> A;
      cuda::LoraFusedGroup g;
      for (int j = 0; j < count; ++j) {
        A.push_back(on_gpu(random_tensor(Shape{64, in}, DType::BF16, 51 + j, -0.2f, 0.2f).view()));
        g.A[j] = A.back().view().data;
        g.rank[j] = 64;
        g.first[j] = 64 * j;
        g.mixed_key[j] = 0x9e3779b97f4a7c15ull * (j + 3);
      }
      g.count = count;
      g.total_rank = 64 * count;
      g.threshold = 6554;  // p = 0.1
      g.keep_scale = 1.0f / 0.9f;
      const Tensor dx0 = on_gpu(random_tensor(Shape{M, in}, DType::BF16, 60).view());
      const size_t bytes = static_cast<size_t>(M * in) * 2;
      auto run_at = [&](size_t offset) {  // dx at `offset` bytes into a 16-byte aligned buffer
        Tensor buffer = Tensor::empty(Shape{M * in + 8}, DType::BF16, Device::CUDA);
        uint8_t* dx = static_cast<uint8_t*>(buffer.view().data) + offset;
        cuda::check(cudaMemcpyAsync(dx, dx0.view().data, bytes, cudaMemcpyDeviceToDevice, cuda::stream()), "copy dx");
        cuda::lora_input_grad_sm90a(dx, cuda::KType::BF16, accumulate, dxa.view().data, cuda::KType::BF16, g, M, in,
                                    cuda::stream());
        std::vector<uint16_t> out(static_cast<size_t>(M * in));
        cuda::check(cudaMemcpyAsync(out.data(), dx, bytes, cudaMemcpyDeviceToHost, cuda::stream()), "copy back");
        cuda::check(cudaStreamSynchronize(cuda::stream()), "sync");
        return out;
      };
      const std::vector<uint16_t> staged = run_at(0), per_thread = run_at(4);
      int64_t differ = 0;
      for (size_t i = 0; i < staged.size(); ++i) differ += staged[i] != per_thread[i];
      EXPECT_EQ(differ, 0) << "of " << staged.size() << " dx values";
    }
}

// dx written rather than added to (a group of one runs its adapter's part first,
// model/llama_layer.cpp): the old dx (random here) must not show, on either path.
TEST_F(GpuOpsLoraFused, WrittenInputGradientMatchesTheCpu) {
  for (const GroupCase& c : {GroupCase{300, 512, {64}, {256}, DType::BF16, DType::F32},
                             GroupCase{77, 256, {64, 16, 16}, {256, 64, 64}, DType::BF16, DType::BF16}}) {
    SCOPED_TRACE(c.name());
    const LoraGroup group(c);
    const GroupRun cpu = group.run(Device::CPU, /*accumulate_dx=*/false);
    for (GpuLoraKernels k : {GpuLoraKernels::Separate, GpuLoraKernels::Fused}) {
      set_gpu_lora_kernels(k);
      expect_runs_close(group.run(Device::CUDA, /*accumulate_dx=*/false), cpu,
                        k == GpuLoraKernels::Fused ? "fused, dx written" : "separate, dx written");
    }
  }
}

// FSDPQ_LORA_KERNELS=auto, the default: the fused kernels where the Hopper ones run (an H100 or
// H200), the separate path elsewhere.
TEST_F(GpuOpsLoraFused, AutoTakesTheHopperKernelsOnHopper) {
  use_automatic_gpu_lora_kernels();
  const bool hopper = cuda::lora_fused_sm90a_unavailable().empty();
  EXPECT_EQ(gpu_lora_kernels(), hopper ? GpuLoraKernels::Fused : GpuLoraKernels::Separate)
      << cuda::lora_fused_sm90a_unavailable();
}

// The same inputs twice: the same bits (fixed split and reduction orders).
TEST_F(GpuOpsLoraFused, RepeatsBitForBit) {
  set_gpu_lora_kernels(GpuLoraKernels::Fused);
  const LoraGroup group({3000, 512, {64, 64, 64}, {512, 128, 128}, DType::BF16, DType::BF16});
  const GroupRun a = group.run(Device::CUDA), b = group.run(Device::CUDA);
  EXPECT_EQ(test::values_of(a.xa), test::values_of(b.xa));
  EXPECT_EQ(test::values_of(a.dx), test::values_of(b.dx));
  for (size_t i = 0; i < a.dA.size(); ++i) EXPECT_EQ(test::values_of(a.dA[i]), test::values_of(b.dA[i]));
}

// The backward's steps in parts (each of dB, d(xa), dx and dA on its own, as the layer's adapter
// stream runs them) give the bits of the whole steps: the Hopper kernels (one adapter, three), the
// mma kernels (ranks they do not take), dx added to and written.
TEST_F(GpuOpsLoraFused, BackwardInPartsGivesTheWholeBits) {
  set_gpu_lora_kernels(GpuLoraKernels::Fused);
  for (const GroupCase& c : {GroupCase{3000, 512, {64, 64, 64}, {512, 128, 128}, DType::BF16, DType::BF16},
                             GroupCase{300, 512, {64}, {256}, DType::BF16, DType::F32},
                             GroupCase{77, 256, {64, 16, 16}, {256, 64, 64}, DType::F16, DType::F16}})
    for (bool accumulate_dx : {true, false}) {
      SCOPED_TRACE(fmt::format("{}, dx {}", c.name(), accumulate_dx ? "added to" : "written"));
      const LoraGroup group(c);
      const GroupRun whole = group.run(Device::CUDA, accumulate_dx);
      const GroupRun parts = group.run(Device::CUDA, accumulate_dx, /*in_parts=*/true);
      EXPECT_EQ(test::values_of(parts.dx), test::values_of(whole.dx));
      for (size_t i = 0; i < whole.dA.size(); ++i) {
        EXPECT_EQ(test::values_of(parts.dA[i]), test::values_of(whole.dA[i])) << "dA " << i;
        EXPECT_EQ(test::values_of(parts.dB[i]), test::values_of(whole.dB[i])) << "dB " << i;
      }
    }
}

// Groups the kernels do not take run the separate path, and still match the CPU: a rank that is
// not a multiple of 16, a width that is not a multiple of 128, fp32 operands, and no dropout
// (one stacked cuBLAS product, no masks at all).
TEST_F(GpuOpsLoraFused, OtherGroupsTakeTheSeparatePath) {
  set_gpu_lora_kernels(GpuLoraKernels::Fused);
  struct Other {
    GroupCase c;
    float dropout;
    double tolerance;
  };
  // (Ranks off multiples of 16 take the separate path too, but on Hopper the rank slots:
  // OtherRanksRunTheHopperKernelsInSlots.)
  for (const Other& o : {Other{{100, 200, {8, 8}, {64, 64}, DType::BF16, DType::BF16}, 0.1f, 2e-2},
                         Other{{100, 200, {16}, {64}, DType::BF16, DType::BF16}, 0.1f, 2e-2},
                         Other{{100, 256, {16}, {64}, DType::F32, DType::F32}, 0.1f, 1e-5},
                         Other{{100, 256, {16, 16}, {64, 64}, DType::BF16, DType::BF16}, 0.0f, 2e-2}}) {
    SCOPED_TRACE(o.c.name() + fmt::format(" dropout {}", o.dropout));
    const LoraGroup group(o.c, o.dropout);
    const int64_t before = cuda_ops::lora_fused_runs();
    const GroupRun gpu = group.run(Device::CUDA), cpu = group.run(Device::CPU);
    EXPECT_EQ(cuda_ops::lora_fused_runs(), before);
    expect_close(gpu.dx, cpu.dx, o.tolerance, "dx");
    expect_close(gpu.xa, cpu.xa, o.tolerance, "xa");
    for (size_t i = 0; i < gpu.dA.size(); ++i) expect_close(gpu.dA[i], cpu.dA[i], o.tolerance, "dA");
  }
}

// Llama-2-7B's groups at ctx 2048 bs 4 (8192 rows), r 64, dropout 0.1: the whole group forward +
// backward, fused against separate (FSDPQ_GPU_PERF=1 prints; never a pass/fail condition).
TEST_F(GpuOpsLoraFused, Perf) {
  if (!test::perf_mode()) GTEST_SKIP() << "FSDPQ_GPU_PERF=1 prints the timings";
  const int64_t M = 8192;
  const std::vector<std::pair<std::string, GroupCase>> groups = {
      {"q,k,v", {M, 4096, {64, 64, 64}, {4096, 4096, 4096}, DType::BF16, DType::BF16}},
      {"gate,up", {M, 4096, {64, 64}, {11008, 11008}, DType::BF16, DType::BF16}},
      {"o", {M, 4096, {64}, {4096}, DType::BF16, DType::BF16}},
      {"down", {M, 11008, {64}, {4096}, DType::BF16, DType::BF16}}};
  for (const auto& [name, c] : groups) {
    LoraGroup::Placed placed = LoraGroup(c).place(Device::CUDA);
    Tensor dxa = Tensor::empty(placed.xa.shape(), DType::F32, Device::CUDA);
    for (GpuLoraKernels k : {GpuLoraKernels::Separate, GpuLoraKernels::Fused}) {
      set_gpu_lora_kernels(k);
      const std::string what = fmt::format("lora group {} {} M {}", name, k == GpuLoraKernels::Fused ? "fused" : "separate", M);
      test::report_perf(what + " (forward + backward)", 0, 0, [&] { placed.step(); });
      test::report_perf(what + " forward", 0, 0, [&] { lora_forward_group(placed.ys, placed.xa, placed.x, placed.sites); });
      test::report_perf(what + " backward dB, d(xa)", 0, 0, [&] { placed.backward_output(dxa); });
      test::report_perf(what + " backward dA, dx", 0, 0, [&] { placed.backward_input(dxa); });
      if (c.ranks.size() == 1)  // o and down run their adapter's part first, writing dx (model/llama_layer.cpp)
        test::report_perf(what + " backward dA, dx written", 0, 0, [&] { placed.backward_input(dxa, false); });
    }
    // The folded forward's down product with and without its copy of x into [x | xa]
    // (model/llama_layer.cpp): what writing x into that buffer in the first place would save.
    set_gpu_lora_kernels(GpuLoraKernels::Fused);
    Tensor wide = Tensor::empty(Shape{M, c.in + placed.xa.shape()[1]}, c.dtype, Device::CUDA);
    const std::string what = fmt::format("lora group {} fused M {}", name, M);
    test::report_perf(what + " down product", 0, 0, [&] { lora_down_group(placed.xa, placed.x, placed.sites); });
    test::report_perf(what + " down product copying x", 0, 0,
                      [&] { lora_down_group(placed.xa, placed.x, placed.sites, MatrixView(wide.view(), 0, c.in)); });
  }
}

// The same groups across LoRA ranks, with the kernels auto picks (FSDPQ_GPU_PERF=1 prints): the
// Hopper kernels as they are at rank 64; at other ranks with and without the rank slots (without:
// the mma kernels for multiples of 16 up to a group's 256, else the separate products). What a
// user's rank costs against fsdp_qlora's 64.
TEST_F(GpuOpsLoraFused, PerfAcrossRanks) {
  if (!test::perf_mode()) GTEST_SKIP() << "FSDPQ_GPU_PERF=1 prints the timings";
  use_automatic_gpu_lora_kernels();
  const int64_t M = 8192;
  for (int64_t r : {8, 16, 32, 64, 128}) {
    const std::vector<std::pair<std::string, GroupCase>> groups = {
        {"q,k,v", {M, 4096, {r, r, r}, {4096, 4096, 4096}, DType::BF16, DType::BF16}},
        {"gate,up", {M, 4096, {r, r}, {11008, 11008}, DType::BF16, DType::BF16}},
        {"down", {M, 11008, {r}, {4096}, DType::BF16, DType::BF16}}};
    for (const auto& [name, c] : groups)
      for (bool slots : {false, true}) {
        if (slots && r == 64) continue;  // (rank 64 takes the Hopper kernels as it is)
        cuda_ops::set_lora_rank_slots(slots);
        LoraGroup::Placed placed = LoraGroup(c).place(Device::CUDA);
        Tensor dxa = Tensor::empty(placed.xa.shape(), DType::F32, Device::CUDA);
        const int64_t before = cuda_ops::lora_fused_runs(), hopper = cuda_ops::lora_down_sm90a_runs();
        placed.step();
        const char* path = cuda_ops::lora_down_sm90a_runs() > hopper ? (slots && r != 64 ? "hopper slots" : "hopper")
                           : cuda_ops::lora_fused_runs() > before  ? "mma"
                                                                   : "separate";
        const std::string what = fmt::format("lora rank {} group {} ({}) M {}", r, name, path, M);
        test::report_perf(what + " forward", 0, 0, [&] { lora_forward_group(placed.ys, placed.xa, placed.x, placed.sites); });
        test::report_perf(what + " backward dB, d(xa)", 0, 0, [&] { placed.backward_output(dxa); });
        test::report_perf(what + " backward dA, dx", 0, 0, [&] { placed.backward_input(dxa); });
      }
  }
  cuda_ops::set_lora_rank_slots(true);
}

}  // namespace
}  // namespace fsdpq
