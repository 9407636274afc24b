// The cuDNN route of attention (ops/attention_cudnn.h, backend/cudnn_sdpa.h) beyond parity (which
// ops_attention_routes_gpu_test.cpp checks for every route): determinism, the memory rule's
// premises, falling back where cuDNN declines (once logged), and the perf rows beside the
// tensor-core kernels (FSDPQ_GPU_PERF=1).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "gpu/attention_test_support.h"
#include "kernels/attention_mma.cuh"
#include "kernels/attention_sm90a.cuh"
#include "ops/attention_cudnn.h"
#include "ops/cuda/attention_wgmma.h"
#include "ops/rope.h"

namespace fsdpq {
namespace {

using test::AttentionCase;

// dq, dk, dv of one backward through the op, as one vector of values.
std::vector<double> gradients_of(test::GpuAttention& g) {
  std::vector<double> all = test::values_of(g.dq);
  for (const Tensor* t : {&g.dk, &g.dv}) {
    const std::vector<double> x = test::values_of(*t);
    all.insert(all.end(), x.begin(), x.end());
  }
  return all;
}

int64_t differing(const std::vector<double>& a, const std::vector<double>& b) {
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

const AttentionCase kModelCase{2, 300, 32, 8, 128, DType::BF16, DType::F32, DType::F32};

TEST(GpuOpsAttentionCudnn, LoadsCudnnAtFirstUse) {
  test::use_gpu();
  FSDPQ_NEED_CUDNN();
  std::string why;
  const cudnn::Library* lib = cudnn::library(&why);
  ASSERT_NE(lib, nullptr);
  std::printf("CUDNN %s from %s\n", cudnn::version_text(lib->version).c_str(), lib->path.c_str());
  EXPECT_GE(lib->version, cudnn::kMinimumVersion);
}

// Two backwards of one forward through the op: their gradients, and how many ran on cuDNN.
struct TwoBackwards {
  std::vector<std::vector<double>> gradients;
  int64_t on_cudnn = 0;
};
TwoBackwards two_backwards(const AttentionCase& c, uint32_t seed) {
  const test::AttentionInputs in(c, seed);
  test::GpuAttention g(c, in);
  g.forward();
  TwoBackwards result;
  const CudnnAttentionCounts before = cudnn_attention_counts();
  for (int run = 0; run < 2; ++run) {
    g.backward(g.out, g.lse);
    result.gradients.push_back(gradients_of(g));
  }
  result.on_cudnn = cudnn_attention_counts().backward_ran - before.backward_ran;
  return result;
}

// FSDPQ_ATTENTION=cudnn's backward is deterministic whichever kernels run it: two runs, same bits.
TEST(GpuOpsAttentionCudnn, CudnnRouteBackwardIsDeterministic) {
  test::use_gpu();
  FSDPQ_NEED_CUDNN();
  const test::UseAttentionKernels use(GpuAttentionKernels::Cudnn);
  const TwoBackwards two = two_backwards(kModelCase, 5);
  const std::vector<std::vector<double>>& runs = two.gradients;
  const bool on_cudnn = two.on_cudnn == 2;
  std::printf("deterministic backward of %s ran on %s\n", kModelCase.name().c_str(),
              on_cudnn ? "cuDNN" : "fsdpq's kernels (cuDNN declined)");
  EXPECT_EQ(differing(runs[0], runs[1]), 0);
}

// The default route (auto, FSDPQ_ATTENTION unset) is FSDPQ_ATTENTION=cudnn: cuDNN's forward where
// cuDNN is loaded, and a deterministic backward, the same bits as the cudnn route's.
TEST(GpuOpsAttentionCudnn, DefaultIsCudnnForwardDeterministicBackward) {
  test::use_gpu();
  FSDPQ_NEED_CUDNN();
  ASSERT_EQ(gpu_attention_kernels(), GpuAttentionKernels::Auto) << "FSDPQ_ATTENTION is set in the environment";
  const test::AttentionInputs in(kModelCase, 7);
  auto outputs_and_gradients = [&](GpuAttentionKernels kernels, CudnnAttentionCounts* ran) {
    const test::UseAttentionKernels use(kernels);
    test::GpuAttention g(kModelCase, in);
    const CudnnAttentionCounts before = cudnn_attention_counts();
    g.forward();
    g.backward(g.out, g.lse);
    const CudnnAttentionCounts after = cudnn_attention_counts();
    ran->forward_ran = after.forward_ran - before.forward_ran;
    ran->backward_ran = after.backward_ran - before.backward_ran;
    std::vector<double> all = test::values_of(g.out);
    const std::vector<double> grads = gradients_of(g);
    all.insert(all.end(), grads.begin(), grads.end());
    return all;
  };
  CudnnAttentionCounts by_default, by_name;
  const std::vector<double> first = outputs_and_gradients(GpuAttentionKernels::Auto, &by_default);
  const std::vector<double> second = outputs_and_gradients(GpuAttentionKernels::Auto, &by_default);
  const std::vector<double> named = outputs_and_gradients(GpuAttentionKernels::Cudnn, &by_name);
  EXPECT_EQ(by_default.forward_ran, 1) << "the default forward did not run on cuDNN";
  EXPECT_EQ(differing(first, second), 0) << "the default route is not deterministic";
  EXPECT_EQ(differing(first, named), 0) << "the default route differs from FSDPQ_ATTENTION=cudnn";
}

// cuDNN's own deterministic backward, where fsdpq uses it (not on Hopper: the memory rule).
TEST(GpuOpsAttentionCudnn, CudnnDeterministicBackwardRepeatsBitForBit) {
  test::use_gpu();
  FSDPQ_NEED_CUDNN();
  const std::string why = cudnn::why_not_sdpa_backward(kModelCase.sdpa(), cudnn::SdpaBackward::Deterministic);
  if (!why.empty()) GTEST_SKIP() << "fsdpq does not use it here: " << why;
  const AttentionCase c{kModelCase.B, kModelCase.T, kModelCase.H, kModelCase.KV, kModelCase.D, DType::BF16,
                        DType::BF16, DType::BF16};
  const test::AttentionInputs in(c, 6);
  test::GpuAttention g(c, in);
  g.forward();
  std::vector<std::vector<double>> runs;
  for (int run = 0; run < 2; ++run) {
    cudnn::sdpa_backward(c.sdpa(), cudnn::SdpaBackward::Deterministic, g.dq.view().data, g.dk.view().data,
                         g.dv.view().data, g.dout.view().data, g.q.view().data, g.k.view().data, g.v.view().data,
                         g.out.view().data, g.lse.data<float>());
    runs.push_back(gradients_of(g));
  }
  EXPECT_EQ(differing(runs[0], runs[1]), 0);
}

// The faster backward runs on cuDNN; its dQ sums come in varying order, so two runs agree to
// rounding, not necessarily bit for bit (how many values differ is printed).
TEST(GpuOpsAttentionCudnn, NondeterministicBackwardRunsOnCudnn) {
  test::use_gpu();
  FSDPQ_NEED_CUDNN();
  const test::UseAttentionKernels use(GpuAttentionKernels::CudnnNondeterministic);
  const TwoBackwards two = two_backwards(kModelCase, 7);
  const std::vector<std::vector<double>>& runs = two.gradients;
  EXPECT_EQ(two.on_cudnn, 2)
      << cudnn::why_not_sdpa_backward(kModelCase.sdpa(), cudnn::SdpaBackward::Nondeterministic);
  EXPECT_LE(test::relative_error(runs[1], runs[0]), 1e-3);
  std::printf("non-deterministic backward of %s: %lld of %zu gradient values differ between two runs\n",
              kModelCase.name().c_str(), static_cast<long long>(differing(runs[0], runs[1])), runs[0].size());
}

// The memory rule's premise for Hopper: cuDNN's deterministic backward there holds a [T, T] bf16
// matrix per (b, h) in its workspace. Should this fail, that backward is linear after all and the
// rule in backend/cudnn_sdpa.cpp can let it run.
TEST(GpuOpsAttentionCudnn, DeterministicBackwardOnHopperHoldsATxTMatrix) {
  test::use_gpu();
  FSDPQ_NEED_CUDNN();
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  if (major != 9) GTEST_SKIP() << "not a Hopper GPU (compute capability " << major << ".x)";
  const cudnn::SdpaShape s{1, 1024, 32, 8, 128, cudnn::SdpaType::BF16};
  const cudnn::GraphWorkspace ws = cudnn::sdpa_backward_workspace(s, cudnn::SdpaBackward::Deterministic);
  if (ws.bytes < 0) GTEST_SKIP() << "cuDNN refuses its deterministic backward here: " << ws.why_not;
  const int64_t dp_matrix = s.B * s.H * s.T * s.T * 2;
  std::printf("deterministic backward workspace of %s: %.1f MiB (a [T, T] bf16 matrix per head: %.1f MiB)\n",
              s.to_string().c_str(), ws.bytes / 1048576.0, dp_matrix / 1048576.0);
  EXPECT_GE(ws.bytes, dp_matrix);
}

// The rule holds for the backward fsdpq runs on cuDNN: its workspace grows linearly with T and
// stays far below a [T, T] matrix per head.
TEST(GpuOpsAttentionCudnn, NondeterministicBackwardWorkspaceIsLinearInT) {
  test::use_gpu();
  FSDPQ_NEED_CUDNN();
  std::vector<int64_t> bytes;
  for (int64_t T : {1024, 2048, 4096}) {
    const cudnn::SdpaShape s{1, T, 32, 8, 128, cudnn::SdpaType::BF16};
    const cudnn::GraphWorkspace ws = cudnn::sdpa_backward_workspace(s, cudnn::SdpaBackward::Nondeterministic);
    ASSERT_GE(ws.bytes, 0) << ws.why_not;
    std::printf("non-deterministic backward workspace of %s: %.1f MiB\n", s.to_string().c_str(),
                ws.bytes / 1048576.0);
    EXPECT_LE(ws.bytes, cudnn::sdpa_backward_workspace_limit(s));
    if (T == 4096) EXPECT_LT(ws.bytes, s.B * s.H * s.T * s.T * 2 / 4) << "room for a [T, T] matrix per head";
    bytes.push_back(ws.bytes);
  }
  EXPECT_LE(bytes[2], 2 * bytes[1] + (int64_t{1} << 20)) << "more than doubled from T 2048 to 4096: not linear";
}

// The op's result when `kernels` run it, as values (for comparing routes bit for bit).
std::vector<double> forward_with(GpuAttentionKernels kernels, test::GpuAttention& g) {
  const test::UseAttentionKernels use(kernels);
  g.forward();
  std::vector<double> all = test::values_of(g.out);
  const std::vector<double> lse = test::values_of(g.lse);
  all.insert(all.end(), lse.begin(), lse.end());
  return all;
}

std::vector<double> backward_with(GpuAttentionKernels kernels, test::GpuAttention& g) {
  const test::UseAttentionKernels use(kernels);
  g.backward(g.out, g.lse);
  return gradients_of(g);
}

// The Hopper backward (the default's on Hopper, where cuDNN's deterministic one is declined)
// writes every gradient once in a fixed order: two runs give the same bits, GQA included.
TEST(GpuOpsAttentionWgmma, BackwardRepeatsBitForBit) {
  test::use_gpu();
  if (const std::string& why = cuda::attention_sm90a_unavailable(); !why.empty()) GTEST_SKIP() << why;
  for (const AttentionCase& c : {kModelCase, AttentionCase{2, 1000, 32, 8, 64, DType::F16, DType::F16, DType::F16}}) {
    const test::AttentionInputs in(c, 5);
    test::GpuAttention g(c, in);
    forward_with(GpuAttentionKernels::Wgmma, g);
    std::vector<std::vector<double>> runs;
    for (int run = 0; run < 2; ++run) {
      const cuda_ops::WgmmaAttentionCounts before = cuda_ops::wgmma_attention_counts();
      runs.push_back(backward_with(GpuAttentionKernels::Wgmma, g));
      EXPECT_EQ(cuda_ops::wgmma_attention_counts().backward_ran - before.backward_ran, 1) << c.name();
    }
    EXPECT_EQ(differing(runs[0], runs[1]), 0) << c.name();
  }
}

// Gradients that are not 16-byte aligned (here one element into a larger buffer: the kernels'
// paired stores would fault on them) are declined by the Hopper route, and the op runs the mma
// kernels instead: the same bits as the mma route into aligned gradients.
TEST(GpuOpsAttentionWgmma, MisalignedGradientsTakeTheMmaKernels) {
  test::use_gpu();
  if (const std::string& why = cuda::attention_sm90a_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const AttentionCase c{2, 200, 8, 8, 64, DType::BF16, DType::BF16, DType::BF16};
  const test::AttentionInputs in(c, 9);
  test::GpuAttention g(c, in);
  forward_with(GpuAttentionKernels::Wgmma, g);
  const std::vector<double> mma = backward_with(GpuAttentionKernels::TensorCores, g);
  // dq one element into a buffer one element longer: 2-byte aligned.
  Tensor buffer = Tensor::empty(Shape{g.dq.view().numel() + 1}, c.grad, Device::CUDA);
  const TensorView shifted{static_cast<uint8_t*>(buffer.view().data) + dtype_size(c.grad), c.grad, g.dq.view().shape,
                           Device::CUDA};
  const test::UseAttentionKernels use(GpuAttentionKernels::Wgmma);
  const cuda_ops::WgmmaAttentionCounts before = cuda_ops::wgmma_attention_counts();
  attention_backward(shifted, g.dk, g.dv, g.dout, g.q, g.k, g.v, g.out, g.lse);
  const cuda_ops::WgmmaAttentionCounts after = cuda_ops::wgmma_attention_counts();
  EXPECT_EQ(after.backward_declined - before.backward_declined, 1);
  EXPECT_EQ(after.backward_ran - before.backward_ran, 0);
  std::vector<double> got = test::values_of(shifted);
  for (const Tensor* t : {&g.dk, &g.dv}) {
    const std::vector<double> x = test::values_of(*t);
    got.insert(got.end(), x.begin(), x.end());
  }
  EXPECT_EQ(differing(got, mma), 0);
}

// attention_rope_backward on the Hopper kernels (RoPE's backward applied as they store dq and dk)
// against its two steps (attention_backward, then rope_backward on dq and dk): fp32 gradients bit
// for bit (the same fp32 arithmetic: only a 16-bit store rounds), 16-bit ones within one rounding
// (the two steps round dq and dk before rotating: normalised error 1e-2 bf16, 2e-3 f16, as the
// rowwise ops' 16-bit outputs), dv bit for bit; plain positions, per-token ones, and packed rows
// (examples of 37 tokens: segment starts and positions restarting with each, as the layer runs
// them), GQA, D 128 and 64, T not a multiple of the tiles; the wgmma route ran both.
TEST(GpuOpsAttentionWgmma, RopeBackwardInTheStoresMatchesTheTwoSteps) {
  test::use_gpu();
  if (const std::string& why = cuda::attention_sm90a_unavailable(); !why.empty()) GTEST_SKIP() << why;
  const test::UseAttentionKernels use(GpuAttentionKernels::Wgmma);
  enum class Rows { Plain, PerTokenPositions, Packed };
  for (const AttentionCase& c : {kModelCase, AttentionCase{2, 300, 32, 8, 128, DType::BF16, DType::BF16, DType::BF16},
                                 AttentionCase{2, 1000, 32, 8, 64, DType::F16, DType::F16, DType::F16}})
    for (Rows rows : {Rows::Plain, Rows::PerTokenPositions, Rows::Packed}) {
      SCOPED_TRACE(c.name() + (rows == Rows::Plain ? "" : rows == Rows::Packed ? " packed" : " per-token positions"));
      const RopeTable table = make_rope_table(c.D, 4096, 10000.0);
      Tensor positions_host = Tensor::empty(Shape{c.B, c.T}, DType::I32), starts_host = Tensor::empty(Shape{c.B, c.T}, DType::I32);
      for (int64_t i = 0; i < c.B * c.T; ++i) {
        const int64_t t = i % c.T;
        positions_host.data<int32_t>()[i] = static_cast<int32_t>(rows == Rows::Packed ? t % 37 : (i * 7) % 301);
        starts_host.data<int32_t>()[i] = static_cast<int32_t>(t - t % 37);
      }
      const Tensor positions = test::on_gpu(positions_host.view()), starts = test::on_gpu(starts_host.view());
      const TensorView pos = rows == Rows::Plain ? TensorView{} : positions.view();
      const TensorView segments = rows == Rows::Packed ? starts.view() : TensorView{};
      const test::AttentionInputs in(c, 9);
      test::GpuAttention two(c, in), fused(c, in);
      attention_forward(two.out, two.lse, two.q, two.k, two.v, segments);
      attention_forward(fused.out, fused.lse, fused.q, fused.k, fused.v, segments);
      const cuda_ops::WgmmaAttentionCounts before = cuda_ops::wgmma_attention_counts();
      attention_backward(two.dq, two.dk, two.dv, two.dout, two.q, two.k, two.v, two.out, two.lse, segments);
      rope_backward(two.dq, table, 3, pos);
      rope_backward(two.dk, table, 3, pos);
      attention_rope_backward(fused.dq, fused.dk, fused.dv, fused.dout, fused.q, fused.k, fused.v, fused.out,
                              fused.lse, table, 3, pos, segments);
      EXPECT_EQ(cuda_ops::wgmma_attention_counts().backward_ran - before.backward_ran, 2);
      if (c.grad == DType::F32) {
        EXPECT_EQ(differing(test::values_of(fused.dq), test::values_of(two.dq)), 0) << "dq";
        EXPECT_EQ(differing(test::values_of(fused.dk), test::values_of(two.dk)), 0) << "dk";
      } else {
        const double tolerance = c.grad == DType::BF16 ? 1e-2 : 2e-3;
        test::expect_close(fused.dq, two.dq, tolerance, "dq");
        test::expect_close(fused.dk, two.dk, tolerance, "dk");
      }
      EXPECT_EQ(differing(test::values_of(fused.dv), test::values_of(two.dv)), 0) << "dv";
    }
}

// Where cuDNN declines, the op runs exactly what it runs without cuDNN (the wgmma route: the Hopper
// kernels where they fit, else the mma ones), and says why once: operand types cuDNN does not take (F16 q, k, v with an F32 out), and a shape it refuses
// (the backward of T = 1).
TEST(GpuOpsAttentionCudnn, FallsBackWhereCudnnDeclinesAndSaysSoOnce) {
  test::use_gpu();
  FSDPQ_NEED_CUDNN();
  {
    const AttentionCase c{1, 40, 8, 2, 64, DType::F16, DType::F16, DType::F16};
    const test::AttentionInputs in(c, 8);
    test::GpuAttention g(c, in);
    g.out = Tensor::empty(c.q_shape(), DType::F32, Device::CUDA);  // F32 out: not for cuDNN
    const std::vector<double> own = forward_with(GpuAttentionKernels::Wgmma, g);
    const CudnnAttentionCounts before = cudnn_attention_counts();
    testing::internal::CaptureStderr();
    const std::vector<double> first = forward_with(GpuAttentionKernels::Cudnn, g);
    const std::string first_log = testing::internal::GetCapturedStderr();
    testing::internal::CaptureStderr();
    const std::vector<double> second = forward_with(GpuAttentionKernels::Cudnn, g);
    const std::string second_log = testing::internal::GetCapturedStderr();
    EXPECT_EQ(cudnn_attention_counts().forward_declined - before.forward_declined, 2);
    EXPECT_TRUE(first == own && second == own) << "the fallback is not the op's own forward";
    EXPECT_NE(first_log.find("attention forward runs on fsdpq's own kernels, not cuDNN: q, k, v, out are F16, F16, "
                             "F16, F32"),
              std::string::npos)
        << first_log;
    EXPECT_EQ(second_log, "") << "the same reason was logged twice";
  }
  {
    const AttentionCase c{2, 1, 8, 2, 128, DType::BF16, DType::F32, DType::F32};
    const test::AttentionInputs in(c, 9);
    test::GpuAttention g(c, in);
    forward_with(GpuAttentionKernels::TensorCores, g);
    const std::vector<double> own = backward_with(GpuAttentionKernels::Wgmma, g);
    const CudnnAttentionCounts before = cudnn_attention_counts();
    const std::vector<double> fallback = backward_with(GpuAttentionKernels::CudnnNondeterministic, g);
    const CudnnAttentionCounts after = cudnn_attention_counts();
    if (after.backward_ran > before.backward_ran) GTEST_SKIP() << "this cuDNN runs the T = 1 backward";
    EXPECT_EQ(after.backward_declined - before.backward_declined, 1);
    EXPECT_TRUE(fallback == own) << "the fallback is not the op's own backward";
  }
}

// Without cuDNN the route declines with the loader's reason and the op runs its own kernels (the
// wgmma route's choice). Only
// meaningful in a process that cannot find cuDNN (scripts/device_attention.sh runs one).
TEST(GpuOpsAttentionCudnn, FallsBackWithoutCudnn) {
  test::use_gpu();
  const std::string why = test::why_no_cudnn();
  if (why.empty()) GTEST_SKIP() << "cuDNN is loaded here; run this test with it off the library path";
  const AttentionCase c{1, 64, 8, 2, 128, DType::BF16, DType::F32, DType::F32};
  const test::AttentionInputs in(c, 10);
  test::GpuAttention g(c, in);
  const std::vector<double> own = forward_with(GpuAttentionKernels::Wgmma, g);
  const CudnnAttentionCounts before = cudnn_attention_counts();
  testing::internal::CaptureStderr();
  const std::vector<double> fallback = forward_with(GpuAttentionKernels::Cudnn, g);
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(cudnn_attention_counts().forward_declined - before.forward_declined, 1);
  EXPECT_TRUE(fallback == own);
  EXPECT_NE(log.find("LD_LIBRARY_PATH"), std::string::npos) << log;
  std::printf("without cuDNN: %s", log.c_str());
}

// Perf mode: TFLOP/s of each route (mma, the Hopper wgmma kernels, cuDNN) at B·T = 16k, H 32, D 128,
// causal, T 512, 2048, 8192 (and GQA 32/8 at T 2048), everything BF16 as PyTorch's SDPA runs it (bench/attention_torch.py prints its
// backends in the same format), plus the op with the model's F32 dout and gradients. FLOPs as
// FlashAttention counts them: forward 4·B·H·T²·D / 2 (causal), backward 2.5× that.
void perf_case(int64_t T, int64_t KV) {
  const AttentionCase c{16384 / T, T, 32, KV, 128, DType::BF16, DType::BF16, DType::BF16};
  const test::AttentionInputs in(c, 11);
  test::GpuAttention g(c, in);
  const double fwd = 4.0 * c.B * c.H * c.T * c.T * c.D / 2;
  const std::string shape = "T" + std::to_string(T) + " B" + std::to_string(c.B) + " H32 KV" + std::to_string(KV) +
                            " D128 bf16";
  const cudnn::SdpaShape s = c.sdpa();
  Tensor workspace =
      Tensor::empty(Shape{cuda::attention_mma_workspace_floats(c.B, c.H, c.T)}, DType::F32, Device::CUDA);
  const cuda::KType bf = cuda::KType::BF16;
  void *q = g.q.view().data, *k = g.k.view().data, *v = g.v.view().data, *out = g.out.view().data;
  void *dout = g.dout.view().data, *dq = g.dq.view().data, *dk = g.dk.view().data, *dv = g.dv.view().data;
  float* lse = g.lse.data<float>();
  test::report_perf("attention mma fwd " + shape, 0, fwd, [&] {
    cuda::attention_mma_forward(out, bf, lse, q, bf, k, bf, v, bf, nullptr, c.B, c.T, c.H, c.KV, c.D, cuda::stream());
  });
  if (const std::string& why = cuda::attention_sm90a_unavailable(); !why.empty())
    std::printf("PERF attention wgmma fwd %s: declined: %s\n", shape.c_str(), why.c_str());
  else
    test::report_perf("attention wgmma fwd " + shape, 0, fwd, [&] {
      cuda::attention_sm90a_forward(out, lse, q, k, v, bf, nullptr, c.B, c.T, c.H, c.KV, c.D, cuda::stream());
    });
  test::report_perf("attention mma bwd " + shape, 0, 2.5 * fwd, [&] {
    cuda::attention_mma_backward(dq, bf, dk, bf, dv, bf, dout, bf, q, bf, k, bf, v, bf, out, bf, lse, nullptr,
                                 workspace.data<float>(), c.B, c.T, c.H, c.KV, c.D, cuda::stream());
  });
  if (cuda::attention_sm90a_unavailable().empty()) {
    Tensor wgmma_workspace = Tensor::empty(
        Shape{cuda::attention_sm90a_backward_workspace_bytes(bf, bf, c.B, c.T, c.H, c.D, false) / 4 + 1}, DType::F32,
        Device::CUDA);
    test::report_perf("attention wgmma bwd " + shape, 0, 2.5 * fwd, [&] {
      cuda::attention_sm90a_backward(dq, bf, dk, bf, dv, bf, dout, bf, q, k, v, bf, out, bf, lse, nullptr,
                                     wgmma_workspace.data<float>(), c.B, c.T, c.H, c.KV, c.D, cuda::stream());
    });
  }
  if (const std::string why = cudnn::why_not_sdpa_forward(s); !why.empty()) {
    std::printf("PERF attention cudnn fwd %s: declined: %s\n", shape.c_str(), why.c_str());
    return;
  }
  test::report_perf("attention cudnn fwd " + shape, 0, fwd, [&] { cudnn::sdpa_forward(s, out, lse, q, k, v); });
  for (const auto algorithm : {cudnn::SdpaBackward::Nondeterministic, cudnn::SdpaBackward::Deterministic}) {
    const std::string route = algorithm == cudnn::SdpaBackward::Deterministic ? "cudnn-deterministic"
                                                                             : "cudnn-nondeterministic";
    if (const std::string why = cudnn::why_not_sdpa_backward(s, algorithm); !why.empty()) {
      std::printf("PERF attention %s bwd %s: declined: %s\n", route.c_str(), shape.c_str(), why.c_str());
      continue;
    }
    test::report_perf("attention " + route + " bwd " + shape, 0, 2.5 * fwd,
                      [&] { cudnn::sdpa_backward(s, algorithm, dq, dk, dv, dout, q, k, v, out, lse); });
  }
}

// The op end to end with the model's types (F32 dout and gradients: the cuDNN route converts them).
void perf_op_model_types(int64_t T) {
  const AttentionCase c{16384 / T, T, 32, 32, 128, DType::BF16, DType::F32, DType::F32};
  const test::AttentionInputs in(c, 12);
  test::GpuAttention g(c, in);
  const double fwd = 4.0 * c.B * c.H * c.T * c.T * c.D / 2;
  const std::string shape = "T" + std::to_string(T) + " B" + std::to_string(c.B) + " H32 KV32 D128 bf16";
  using Named = std::pair<const char*, GpuAttentionKernels>;
  for (const auto& [name, kernels] : {Named{"mma", GpuAttentionKernels::TensorCores},
                                      Named{"wgmma", GpuAttentionKernels::Wgmma},
                                      Named{"cudnn-nondeterministic", GpuAttentionKernels::CudnnNondeterministic}}) {
    const test::UseAttentionKernels use(kernels);
    g.forward();
    test::report_perf(std::string("attention op-") + name + " bwd " + shape + " (f32 dout/grads)", 0, 2.5 * fwd,
                      [&] { g.backward(g.out, g.lse); });
  }
}

TEST(GpuOpsAttentionCudnn, Perf) {
  test::use_gpu();
  if (!test::perf_mode()) GTEST_SKIP() << "set FSDPQ_GPU_PERF=1";
  FSDPQ_NEED_CUDNN();
  if (const char* only = std::getenv("FSDPQ_PERF_T")) {  // one length alone (ncu: scripts/device_wgmma.sh)
    perf_case(std::atoll(only), 32);
    return;
  }
  for (int64_t T : {512, 2048, 8192}) perf_case(T, 32);
  perf_case(2048, 8);
  for (int64_t T : {512, 2048, 8192}) perf_op_model_types(T);
}

}  // namespace
}  // namespace fsdpq
