#include "backend/cuda_backend.h"
#include "ops/gemm.h"
#include "ops/matmul.h"
#include "ops_test_support.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>

namespace fsdpq {
namespace {

using test::random_tensor;
using test::to_doubles;

struct MatmulShape {
  int64_t M, N, K;
};

// Covers the micro-tile (6 x 16), the depth block (256), the row block (up to 120) and the column
// block (1024): exact multiples, one past, and odd sizes.
const MatmulShape kShapes[] = {{1, 1, 1},   {5, 7, 3},     {6, 16, 256}, {13, 37, 300},
                               {130, 70, 45}, {7, 1030, 20}, {33, 17, 513}};

// Checks got[m, n] against sum_k a(m, k) b(k, n) (+ old) in double, with the tolerance of an
// fp32 sum (1e-5 of sum |a b|) plus one rounding of the output to its dtype.
void expect_matches(const TensorView& got, const std::function<double(int64_t, int64_t, int64_t)>& product,
                    const std::vector<double>& old, float scale, int64_t rows, int64_t cols, int64_t depth,
                    const char* what) {
  int failures = 0;
  for (int64_t m = 0; m < rows && failures < 5; ++m)
    for (int64_t n = 0; n < cols && failures < 5; ++n) {
      double sum = 0.0, magnitude = 0.0;
      for (int64_t k = 0; k < depth; ++k) {
        const double p = product(m, n, k);
        sum += p;
        magnitude += std::abs(p);
      }
      const double want = (old.empty() ? 0.0 : old[static_cast<size_t>(m * cols + n)]) + scale * sum;
      const double have = load_f32(got, m * cols + n);
      double tolerance = 1e-5 * std::abs(scale) * magnitude + 1e-6;
      if (got.dtype == DType::BF16) tolerance += std::ldexp(std::abs(want), -8);
      if (got.dtype == DType::F16) tolerance += std::ldexp(std::abs(want), -11);  // one half rounding
      if (std::abs(have - want) > tolerance) {
        ++failures;
        ADD_FAILURE() << what << " [" << m << ", " << n << "] of [" << rows << ", " << cols << "] depth " << depth
                      << ": " << have << " vs " << want;
      }
    }
}

void check_all_linear_ops(DType dtype, bool accumulate, float scale) {
  for (const MatmulShape& s : kShapes) {
    Tensor x = random_tensor(Shape{s.M, s.K}, dtype, 61);
    Tensor W = random_tensor(Shape{s.N, s.K}, dtype, 62);
    Tensor dy = random_tensor(Shape{s.M, s.N}, dtype, 63);
    const std::vector<double> xd = to_doubles(x), wd = to_doubles(W), dyd = to_doubles(dy);
    auto at = [](const std::vector<double>& v, int64_t i) { return v[static_cast<size_t>(i)]; };

    Tensor out = random_tensor(Shape{s.M, s.N}, dtype, 64);
    std::vector<double> old = accumulate ? to_doubles(out) : std::vector<double>{};
    linear_forward(out, x, W, accumulate, scale);
    expect_matches(out, [&](int64_t m, int64_t n, int64_t k) { return at(xd, m * s.K + k) * at(wd, n * s.K + k); },
                   old, scale, s.M, s.N, s.K, "linear_forward");

    Tensor dx = random_tensor(Shape{s.M, s.K}, dtype, 65);
    old = accumulate ? to_doubles(dx) : std::vector<double>{};
    linear_backward_input(dx, dy, W, accumulate, scale);
    expect_matches(dx, [&](int64_t m, int64_t k, int64_t n) { return at(dyd, m * s.N + n) * at(wd, n * s.K + k); },
                   old, scale, s.M, s.K, s.N, "linear_backward_input");

    Tensor dW = random_tensor(Shape{s.N, s.K}, DType::F32, 66);
    old = accumulate ? to_doubles(dW) : std::vector<double>{};
    linear_backward_weight(dW, dy, x, accumulate, scale);
    expect_matches(dW, [&](int64_t n, int64_t k, int64_t m) { return at(dyd, m * s.N + n) * at(xd, m * s.K + k); },
                   old, scale, s.N, s.K, s.M, "linear_backward_weight");
  }
}

TEST(OpsMatmul, F32MatchesTripleLoop) { check_all_linear_ops(DType::F32, false, 1.0f); }
TEST(OpsMatmul, Bf16MatchesTripleLoop) { check_all_linear_ops(DType::BF16, false, 1.0f); }
TEST(OpsMatmul, F16MatchesTripleLoop) { check_all_linear_ops(DType::F16, false, 1.0f); }
TEST(OpsMatmul, AccumulateAndScale) {
  check_all_linear_ops(DType::F32, true, 0.5f);
  check_all_linear_ops(DType::BF16, true, -2.0f);
  check_all_linear_ops(DType::F16, true, 3.0f);
}

TEST(OpsMatmul, PortableKernelMatchesTripleLoop) {
  gemm_force_portable_kernel(true);
  EXPECT_STREQ(gemm_kernel_name(), "portable");
  check_all_linear_ops(DType::F32, true, 0.5f);
  check_all_linear_ops(DType::BF16, false, 1.0f);
  gemm_force_portable_kernel(false);
}

TEST(OpsMatmul, MixedDtypesAndBatchedActivations) {
  // bf16 weight, fp32 activations in [B, T, C] form, as in the autocast precisions.
  Tensor x = random_tensor(Shape{2, 9, 40}, DType::F32, 67);
  Tensor W = random_tensor(Shape{24, 40}, DType::BF16, 68);
  Tensor out = Tensor::empty(Shape{2, 9, 24}, DType::F32);
  linear_forward(out, x, W);
  const std::vector<double> xd = to_doubles(x), wd = to_doubles(W);
  expect_matches(out,
                 [&](int64_t m, int64_t n, int64_t k) {
                   return xd[static_cast<size_t>(m * 40 + k)] * wd[static_cast<size_t>(n * 40 + k)];
                 },
                 {}, 1.0f, 18, 24, 40, "mixed linear_forward");
}

TEST(OpsMatmul, ResultDoesNotDependOnTheThreadCount) {
  Tensor x = random_tensor(Shape{131, 300}, DType::BF16, 69);
  Tensor W = random_tensor(Shape{77, 300}, DType::BF16, 70);
  Tensor one = Tensor::empty(Shape{131, 77}, DType::F32), many = Tensor::empty(Shape{131, 77}, DType::F32);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  linear_forward(one, x, W);
  omp_set_num_threads(std::max(threads, 3));
  linear_forward(many, x, W);
  omp_set_num_threads(threads);
  EXPECT_EQ(to_doubles(one), to_doubles(many));
}

TEST(OpsMatmul, BackwardMatchesFiniteDifferences) {
  const int64_t M = 3, N = 4, K = 5;
  Tensor x = random_tensor(Shape{M, K}, DType::F32, 71);
  Tensor W = random_tensor(Shape{N, K}, DType::F32, 72);
  Tensor y = Tensor::empty(Shape{M, N}, DType::F32);
  const std::vector<double> w = test::random_weights(M * N, 73);
  auto loss = [&] {
    linear_forward(y, x, W);
    return test::weighted_sum(y, w);
  };
  const std::vector<double> numeric_dx = test::numerical_gradient(x, loss, 1e-2f);
  const std::vector<double> numeric_dW = test::numerical_gradient(W, loss, 1e-2f);
  Tensor dy = Tensor::empty(Shape{M, N}, DType::F32);
  for (int64_t i = 0; i < M * N; ++i) dy.data<float>()[i] = static_cast<float>(w[static_cast<size_t>(i)]);
  Tensor dx = Tensor::empty(Shape{M, K}, DType::F32), dW = Tensor::empty(Shape{N, K}, DType::F32);
  linear_backward_input(dx, dy, W);
  linear_backward_weight(dW, dy, x);
  EXPECT_LE(test::relative_error(to_doubles(dx), numeric_dx), 1e-4);
  EXPECT_LE(test::relative_error(to_doubles(dW), numeric_dW), 1e-4);
}

// A weight read as a block of a wider matrix's columns (a folded LoRA weight's base,
// model/llama_layer.h) gives the bits of the same weight on its own, forward and input gradient;
// a block past the matrix's end is a logic error.
TEST(OpsMatmul, WeightAsAColumnBlockEqualsTheWeightAlone) {
  const int64_t M = 11, N = 9, K = 40, wide = 52, first = 8;
  Tensor x = random_tensor(Shape{M, K}, DType::BF16, 76), dy = random_tensor(Shape{M, N}, DType::BF16, 77);
  Tensor folded = random_tensor(Shape{N, wide}, DType::BF16, 78);
  Tensor W = Tensor::empty(Shape{N, K}, DType::BF16);
  TensorView w = W.view();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) store_f32(w, n * K + k, load_f32(folded.view(), n * wide + first + k));
  const MatrixView block(folded.view(), first, K);
  Tensor y_alone = Tensor::empty(Shape{M, N}, DType::F32), y_block = Tensor::empty(Shape{M, N}, DType::F32);
  linear_forward(y_alone, x, W);
  linear_forward(y_block, x, block);
  EXPECT_EQ(to_doubles(y_block), to_doubles(y_alone));
  Tensor dx_alone = Tensor::empty(Shape{M, K}, DType::F32), dx_block = Tensor::empty(Shape{M, K}, DType::F32);
  linear_backward_input(dx_alone, dy, W);
  linear_backward_input(dx_block, dy, block);
  EXPECT_EQ(to_doubles(dx_block), to_doubles(dx_alone));
  EXPECT_THROW(linear_forward(y_block, x, MatrixView(folded.view(), wide - K + 1, K)), std::logic_error);
}

// The CPU's accumulating linear rounds the exact sum once: a LoRA update below the output's bf16
// spacing still counts, on average (ops_test_support.h).
TEST(OpsMatmul, AccumulatingIntoBf16KeepsASubUlpAddend) {
  const double kept = test::kept_fraction_of_a_sub_ulp_addend([](const TensorView& v) { return copy_to(v, Device::CPU); },
                                                              [](const TensorView& v) { return to_doubles(v); });
  EXPECT_NEAR(kept, 1.0, 0.15);
}

TEST(OpsMatmul, ShapeMismatchIsALogicError) {
  Tensor x = random_tensor(Shape{3, 5}, DType::F32, 74);
  Tensor W = random_tensor(Shape{4, 6}, DType::F32, 75);
  Tensor y = Tensor::empty(Shape{3, 4}, DType::F32);
  EXPECT_THROW(linear_forward(y, x, W), std::logic_error);
  Tensor ints = Tensor::empty(Shape{4, 5}, DType::I32);
  EXPECT_THROW(linear_forward(y, x, ints), std::logic_error);
}

}  // namespace
}  // namespace fsdpq
