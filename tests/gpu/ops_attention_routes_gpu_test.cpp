// Every GPU route of the attention op against the CPU op on the same random inputs, over issue
// #22's shapes: T = 1, 17, 128, 512, 2048, 4096; GQA 32/8 and MHA 32/32; D 64 and 128; BF16 and
// F16. The CPU's results are computed once per case and each route is compared with them, through
// the public op (gpu_attention_kernels picks the route):
//   simt                    kernels/attention.cu everywhere
//   mma                     kernels/attention_mma.cu (the default)
//   cudnn                   cuDNN's forward; the deterministic backward (cuDNN's where the memory
//                           rule allows it, else mma: on Hopper always mma, docs/cuda.md)
//   cudnn-nondeterministic  cuDNN's forward and non-deterministic backward
//   wgmma                   the Hopper forward (kernels/attention_sm90a.cu), mma's backward
// BF16 cases pass what the model passes (q, k, v, out BF16; dout and gradients F32: the cuDNN
// route converts them), F16 cases keep every operand F16 (no conversion). The backward starts from
// the CPU's out and lse, so it is compared alone. Beyond T = 1 the cuDNN routes must really run on
// cuDNN (the forward, and cudnn-nondeterministic's backward): a silent fallback fails the test; at
// T = 1 cuDNN may decline (it refuses the backward of s_q = s_kv = 1). On a Hopper GPU the wgmma
// route must run every forward on its kernel (elsewhere it falls back, and says so in its ROUTE
// line). Each (case, route) prints one ROUTE line with its errors and where each pass ran.
//
// Tolerances (normalized L2 error, tests/gpu/op_parity.h):
//  - lse 1e-5 everywhere: every route computes it in fp32 from scores that are exact products of
//    16-bit values; only the summation order (and exp2 against exp) differ, ~1e-6.
//  - out 1e-2 (BF16) / 2e-3 (F16): the tensor-core routes (mma, cuDNN, wgmma) round P to the 16-bit type
//    before P V (≤ 2^-9 / 2^-12 per weight, random signs), then out is rounded once on store
//    (2^-9 / 2^-12 relative); the SIMT route only the latter.
//  - dq, dk, dv: SIMT does fp32 math and rounds once on store: 1e-4 into F32 (dS = P (dP - rowsum)
//    is a difference of similar terms), 2e-3 into F16. The tensor-core routes round P, dS and dout
//    to the 16-bit type before their products (three ~2^-9 sources for BF16), and cuDNN also stores
//    dq, dk, dv in the 16-bit type before they are widened to F32 (one more): 2e-2 for both.
//  - T = 1: dq = dk = 0 exactly (P = 1, dP = rowsum(dO O)); every route gives rounding noise of
//    ~1e-7, so those two are compared absolutely (1e-5).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <vector>

#include "gpu/attention_test_support.h"
#include "kernels/attention_sm90a.cuh"
#include "ops/attention_cudnn.h"
#include "ops/cuda/attention_wgmma.h"

namespace fsdpq {
namespace {

using test::AttentionCase;

struct Route {
  const char* name;
  GpuAttentionKernels kernels;
  bool tensor_cores() const { return kernels != GpuAttentionKernels::Simt; }
  bool cudnn() const {
    return kernels == GpuAttentionKernels::Cudnn || kernels == GpuAttentionKernels::CudnnNondeterministic;
  }
  bool wgmma() const { return kernels == GpuAttentionKernels::Wgmma; }
};

const Route kRoutes[] = {{"simt", GpuAttentionKernels::Simt},
                         {"mma", GpuAttentionKernels::TensorCores},
                         {"cudnn", GpuAttentionKernels::Cudnn},
                         {"cudnn-nondeterministic", GpuAttentionKernels::CudnnNondeterministic},
                         {"wgmma", GpuAttentionKernels::Wgmma}};

double out_tolerance(DType t) { return t == DType::BF16 ? 1e-2 : 2e-3; }

double grad_tolerance(const Route& route, DType grad) {
  if (route.tensor_cores()) return 2e-2;
  return grad == DType::F32 ? 1e-4 : 2e-3;
}

// Normalized error of a GPU result against the CPU's, failing on inf / NaN and over `tolerance`.
double compared(const TensorView& gpu, const TensorView& cpu, double tolerance, const std::string& what) {
  const std::vector<double> got = test::values_of(gpu), want = test::values_of(cpu);
  for (double g : got)
    if (!std::isfinite(g)) {
      ADD_FAILURE() << what << ": the GPU result holds inf or NaN";
      return INFINITY;
    }
  const double err = test::relative_error(got, want);
  EXPECT_LE(err, tolerance) << what << ": normalized error " << err;
  return err;
}

double compared_absolutely(const TensorView& gpu, const TensorView& cpu, double tolerance, const std::string& what) {
  const double err = test::max_abs_diff(test::values_of(gpu), test::values_of(cpu));
  EXPECT_LE(err, tolerance) << what << ": max abs diff " << err;
  return err;
}

// Where the wgmma route's forward ran ("wgmma" or "fallback", from its counters); on Hopper it must
// be the wgmma kernel.
std::string wgmma_ran_on(const AttentionCase& c, bool backward, const cuda_ops::WgmmaAttentionCounts& before) {
  const cuda_ops::WgmmaAttentionCounts after = cuda_ops::wgmma_attention_counts();
  const int64_t ran = backward ? after.backward_ran - before.backward_ran : after.forward_ran - before.forward_ran;
  const int64_t declined = backward ? after.backward_declined - before.backward_declined
                                    : after.forward_declined - before.forward_declined;
  const std::string what = c.name() + (backward ? " wgmma backward" : " wgmma forward");
  EXPECT_EQ(ran + declined, 1) << what << ": did not ask it once";
  if (cuda::attention_sm90a_unavailable().empty()) EXPECT_EQ(ran, 1) << what << ": the kernel declined";
  return ran == 1 ? "wgmma" : "fallback";
}

// Where one pass of a route ran: the route's own kernels, or for a cuDNN route "cudnn" or
// "fallback" (from the route's counters). Beyond T = 1, cuDNN must take the forward of both cuDNN
// routes and the backward of cudnn-nondeterministic; `cudnn`'s backward may fall back (the memory
// rule, docs/cuda.md).
std::string ran_on(const Route& route, const AttentionCase& c, bool backward, const CudnnAttentionCounts& before) {
  if (!route.cudnn()) return route.name;
  const CudnnAttentionCounts after = cudnn_attention_counts();
  const int64_t ran = backward ? after.backward_ran - before.backward_ran : after.forward_ran - before.forward_ran;
  const int64_t declined = backward ? after.backward_declined - before.backward_declined
                                    : after.forward_declined - before.forward_declined;
  const std::string what = c.name() + " " + route.name + (backward ? " backward" : " forward");
  EXPECT_EQ(ran + declined, 1) << what << ": did not ask cuDNN once";
  const bool may_fall_back = c.T == 1 || (backward && route.kernels == GpuAttentionKernels::Cudnn);
  if (!may_fall_back) {
    const cudnn::SdpaShape s = c.sdpa();
    EXPECT_EQ(ran, 1) << what << ": cuDNN declined: "
                      << (backward ? cudnn::why_not_sdpa_backward(s, cudnn::SdpaBackward::Nondeterministic)
                                   : cudnn::why_not_sdpa_forward(s));
  }
  return ran == 1 ? "cudnn" : "fallback";
}

void check_route(const AttentionCase& c, const test::AttentionInputs& in, const test::AttentionReference& ref,
                 const Route& route) {
  const test::UseAttentionKernels use(route.kernels);
  const std::string what = c.name() + " " + route.name;
  test::GpuAttention g(c, in);
  const CudnnAttentionCounts before = cudnn_attention_counts();
  const cuda_ops::WgmmaAttentionCounts wgmma_before = cuda_ops::wgmma_attention_counts();
  g.forward();
  const std::string forward = route.wgmma() ? wgmma_ran_on(c, false, wgmma_before) : ran_on(route, c, false, before);
  const double out_err = compared(g.out, ref.out, out_tolerance(c.in), what + " out");
  const double lse_err = compared(g.lse, ref.lse, 1e-5, what + " lse");

  const Tensor ref_out = test::on_gpu(ref.out), ref_lse = test::on_gpu(ref.lse);
  const CudnnAttentionCounts before_backward = cudnn_attention_counts();
  const cuda_ops::WgmmaAttentionCounts wgmma_before_backward = cuda_ops::wgmma_attention_counts();
  g.backward(ref_out, ref_lse);
  const std::string backward =
      route.wgmma() ? wgmma_ran_on(c, true, wgmma_before_backward) : ran_on(route, c, true, before_backward);
  const double tol = grad_tolerance(route, c.grad);
  const double dq_err = c.T == 1 ? compared_absolutely(g.dq, ref.dq, 1e-5, what + " dq")
                                 : compared(g.dq, ref.dq, tol, what + " dq");
  const double dk_err = c.T == 1 ? compared_absolutely(g.dk, ref.dk, 1e-5, what + " dk")
                                 : compared(g.dk, ref.dk, tol, what + " dk");
  const double dv_err = compared(g.dv, ref.dv, tol, what + " dv");
  std::printf("ROUTE %s %s: out %.2e lse %.2e dq %.2e dk %.2e dv %.2e (forward on %s, backward on %s)%s\n",
              route.name, c.name().c_str(), out_err, lse_err, dq_err, dk_err, dv_err, forward.c_str(),
              backward.c_str(), c.T == 1 ? " [T1: dq, dk absolute]" : "");
}

// FSDPQ_TEST_ROUTES="wgmma mma" narrows a device run to those routes; unset, all of them run.
bool chosen(const Route& route) {
  const char* only = std::getenv("FSDPQ_TEST_ROUTES");
  if (only == nullptr || *only == '\0') return true;
  const std::string list = std::string(" ") + only + " ";
  return list.find(std::string(" ") + route.name + " ") != std::string::npos;
}

// Every route of one storage type and head dim, over the sequence lengths and head counts.
void check_all_routes(DType in, int64_t D, uint32_t seed) {
  test::use_gpu();
  const std::string no_cudnn = test::why_no_cudnn();
  if (!no_cudnn.empty() && test::cudnn_required()) FAIL() << "no cuDNN: " << no_cudnn;
  const DType dout_and_grads = in == DType::BF16 ? DType::F32 : DType::F16;
  for (int64_t T : {1, 17, 128, 512, 2048, 4096})
    for (const auto& [H, KV] : {std::pair<int64_t, int64_t>{32, 8}, {32, 32}}) {
      const AttentionCase c{T <= 128 ? 2 : 1, T, H, KV, D, in, dout_and_grads, dout_and_grads};
      const test::AttentionInputs inputs(c, seed += 10);
      const test::AttentionReference reference(c, inputs);
      for (const Route& route : kRoutes) {
        if (!chosen(route)) continue;
        if (route.cudnn() && !no_cudnn.empty()) {
          std::printf("ROUTE %s %s: skipped, no cuDNN (%s)\n", route.name, c.name().c_str(), no_cudnn.c_str());
          continue;
        }
        check_route(c, inputs, reference, route);
      }
    }
}

TEST(GpuOpsAttentionRoutes, Bf16D64) { check_all_routes(DType::BF16, 64, 100); }
TEST(GpuOpsAttentionRoutes, Bf16D128) { check_all_routes(DType::BF16, 128, 200); }
TEST(GpuOpsAttentionRoutes, F16D64) { check_all_routes(DType::F16, 64, 300); }
TEST(GpuOpsAttentionRoutes, F16D128) { check_all_routes(DType::F16, 128, 400); }

}  // namespace
}  // namespace fsdpq
