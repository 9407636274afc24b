// DoRA on one linear (ops/dora.h) against a naive double-precision evaluation of PEFT's formula,
// and its backward against central finite differences with the weight norm held constant (the
// norm is detached in DoRA, so that is the function whose gradient the backward computes).
#include "ops/dora.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops_test_support.h"

#include <gtest/gtest.h>

#include <cmath>

namespace fsdpq {
namespace {

using test::random_tensor;
using test::to_doubles;

struct DoraSetup {
  int64_t M = 6, in = 20, out = 12, rank = 4;
  Tensor x, W, A, B, m, norm;
  LoraParams params;
  explicit DoraSetup(uint32_t seed) {
    x = random_tensor(Shape{M, in}, DType::F32, seed);
    W = random_tensor(Shape{out, in}, DType::F32, seed + 1);
    A = random_tensor(Shape{rank, in}, DType::F32, seed + 2);
    B = random_tensor(Shape{out, rank}, DType::F32, seed + 3);
    m = random_tensor(Shape{out}, DType::F32, seed + 4, 0.5f, 3.0f);
    norm = Tensor::empty(Shape{out}, DType::F32);
    params.alpha = 6.0f;
    params.training = true;
    params.dropout_key = 4242;
  }
  float scaling() const { return params.alpha / static_cast<float>(rank); }
  void compute_norm() { dora_weight_norm(norm, W, A, B, scaling()); }
  DoraSite site() const { return DoraSite{W, A, B, m, params}; }

  // ‖W + s·B·A‖ per row, in double.
  std::vector<double> naive_norm() const {
    const std::vector<double> w = to_doubles(W), a = to_doubles(A), b = to_doubles(B);
    std::vector<double> n(static_cast<size_t>(out));
    for (int64_t o = 0; o < out; ++o) {
      double sum = 0.0;
      for (int64_t i = 0; i < in; ++i) {
        double v = w[static_cast<size_t>(o * in + i)];
        for (int64_t r = 0; r < rank; ++r) v += scaling() * b[static_cast<size_t>(o * rank + r)] * a[static_cast<size_t>(r * in + i)];
        sum += v * v;
      }
      n[static_cast<size_t>(o)] = std::sqrt(sum);
    }
    return n;
  }

  // PEFT's y = x·Wᵀ + (g − 1) ⊙ x'·Wᵀ + g ⊙ s·x'·Aᵀ·Bᵀ in double, g = m / norm (the op's norm).
  std::vector<double> naive_forward() const {
    const std::vector<double> xd = to_doubles(x), w = to_doubles(W), a = to_doubles(A), b = to_doubles(B),
                              md = to_doubles(m), nd = to_doubles(norm);
    const bool dropping = params.training && params.dropout > 0.0f;
    std::vector<double> y(static_cast<size_t>(M * out));
    for (int64_t t = 0; t < M; ++t) {
      std::vector<double> dropped(static_cast<size_t>(in));
      for (int64_t i = 0; i < in; ++i) {
        const double v = xd[static_cast<size_t>(t * in + i)];
        const bool keep = !dropping || lora_dropout_keeps(params.dropout_key, static_cast<uint64_t>(t * in + i), params.dropout);
        dropped[static_cast<size_t>(i)] = !dropping ? v : keep ? v / (1.0 - params.dropout) : 0.0;
      }
      for (int64_t o = 0; o < out; ++o) {
        double base = 0.0, base_dropped = 0.0, lora = 0.0;
        for (int64_t i = 0; i < in; ++i) {
          base += xd[static_cast<size_t>(t * in + i)] * w[static_cast<size_t>(o * in + i)];
          base_dropped += dropped[static_cast<size_t>(i)] * w[static_cast<size_t>(o * in + i)];
        }
        for (int64_t r = 0; r < rank; ++r) {
          double xa = 0.0;
          for (int64_t i = 0; i < in; ++i) xa += dropped[static_cast<size_t>(i)] * a[static_cast<size_t>(r * in + i)];
          lora += xa * b[static_cast<size_t>(o * rank + r)];
        }
        const double g = md[static_cast<size_t>(o)] / nd[static_cast<size_t>(o)];
        y[static_cast<size_t>(t * out + o)] = base + (g - 1.0) * base_dropped + g * scaling() * lora;
      }
    }
    return y;
  }

  struct Saved {
    Tensor xa, z;
  };
  Saved run(TensorView y) const {
    Saved s{Tensor::empty(Shape{M, rank}, DType::F32), Tensor::empty(Shape{M, out}, DType::F32)};
    dora_forward(y, DoraSaved{s.xa, s.z, norm}, x, site());
    return s;
  }
};

TEST(OpsDora, WeightNormMatchesNaive) {
  DoraSetup s(11);
  s.compute_norm();
  EXPECT_LE(test::relative_error(to_doubles(s.norm), s.naive_norm()), 1e-6);
  // A 16-bit weight is read as stored; the product B·A stays fp32.
  Tensor W16 = Tensor::empty(s.W.shape(), DType::BF16);
  copy_convert(W16, s.W);
  copy_convert(s.W, W16);
  Tensor norm16 = Tensor::empty(Shape{s.out}, DType::F32);
  dora_weight_norm(norm16, W16, s.A, s.B, s.scaling());
  s.compute_norm();
  EXPECT_EQ(to_doubles(norm16), to_doubles(s.norm));
}

// The expansion ‖w‖² + 2s·b·(A·wᵀ) + s²·b·(A·Aᵀ)·bᵀ against the direct norm of W + s·B·A: fp32 and
// bf16 weights, a zero B (the rows' own norms) and a B as large as A, where the cross terms matter.
TEST(OpsDora, ExpandedWeightNormMatchesTheDirectOne) {
  for (const float b_scale : {0.0f, 1.0f, 30.0f}) {
    DoraSetup s(13);
    scale_in_place(s.B, b_scale);
    s.compute_norm();
    Tensor expanded = Tensor::empty(Shape{s.out}, DType::F32);
    dora_weight_norm_expanded(expanded, s.W, s.A, s.B, s.scaling());
    EXPECT_LE(test::relative_error(to_doubles(expanded), to_doubles(s.norm)), 1e-6) << "B scaled by " << b_scale;
    EXPECT_LE(test::relative_error(to_doubles(expanded), s.naive_norm()), 1e-6) << "B scaled by " << b_scale;
    Tensor W16 = Tensor::empty(s.W.shape(), DType::BF16), B16 = Tensor::empty(s.B.shape(), DType::BF16);
    copy_convert(W16, s.W);
    copy_convert(B16, s.B);
    Tensor direct16 = Tensor::empty(Shape{s.out}, DType::F32), expanded16 = Tensor::empty(Shape{s.out}, DType::F32);
    dora_weight_norm(direct16, W16, s.A, B16, s.scaling());
    dora_weight_norm_expanded(expanded16, W16, s.A, B16, s.scaling());
    EXPECT_LE(test::relative_error(to_doubles(expanded16), to_doubles(direct16)), 1e-6) << "bf16, B scaled by " << b_scale;
  }
  DoraSetup s(14);
  Tensor norm = Tensor::empty(Shape{s.out}, DType::F32), wrong_h = Tensor::empty(Shape{s.out, s.rank + 1}, DType::F32);
  Tensor g = Tensor::empty(Shape{s.out, s.rank}, DType::F32);
  EXPECT_THROW(dora_norm_from_parts(norm, s.W, s.B, g, wrong_h, 1.0f), std::logic_error);
}

TEST(OpsDora, WeightNormIsChunkedByRows) {
  // 32 MiB of fp32 scratch at most: 8192 rows of 1024 values; a small weight whole; never fewer than one row.
  EXPECT_EQ(dora_norm_chunk_rows(100000, 1024), 8192);
  EXPECT_EQ(dora_norm_chunk_rows(10, 1024), 10);
  EXPECT_EQ(dora_norm_chunk_rows(4, int64_t{1} << 26), 1);
}

TEST(OpsDora, ForwardMatchesPeftsFormulaWithAndWithoutDropout) {
  for (const bool training : {false, true}) {
    DoraSetup s(21);
    s.params.training = training;
    s.params.dropout = 0.3f;
    s.compute_norm();
    Tensor y = Tensor::empty(Shape{s.M, s.out}, DType::F32);
    s.run(y);
    EXPECT_LE(test::max_abs_diff(to_doubles(y), s.naive_forward()), 1e-4) << "training " << training;
  }
}

TEST(OpsDora, InitialMagnitudeGivesTheBaseOutput) {
  // m = ‖W‖ with B = 0 (the magnitude's initial value): g = 1 exactly and y = x·Wᵀ, as PEFT starts.
  DoraSetup s(31);
  fill_zero(s.B);
  s.compute_norm();
  copy_convert(s.m, s.norm);
  Tensor y = Tensor::empty(Shape{s.M, s.out}, DType::F32), base = Tensor::empty(Shape{s.M, s.out}, DType::F32);
  s.params.training = false;
  s.run(y);
  linear_forward(base, s.x, s.W);
  EXPECT_EQ(to_doubles(y), to_doubles(base));
}

TEST(OpsDora, BackwardMatchesFiniteDifferencesWithTheNormDetached) {
  for (float dropout : {0.0f, 0.4f}) {
    DoraSetup s(41);
    s.params.dropout = dropout;
    s.compute_norm();  // then held constant: the finite differences see n as DoRA's backward does
    Tensor y = Tensor::empty(Shape{s.M, s.out}, DType::F32);
    const std::vector<double> w = test::random_weights(y.numel(), 42);
    auto loss = [&] {
      s.run(y);
      return test::weighted_sum(y, w);
    };
    const std::vector<double> numeric_dx = test::numerical_gradient(s.x, loss, 1e-2f);
    const std::vector<double> numeric_dA = test::numerical_gradient(s.A, loss, 1e-2f);
    const std::vector<double> numeric_dB = test::numerical_gradient(s.B, loss, 1e-2f);
    const std::vector<double> numeric_dm = test::numerical_gradient(s.m, loss, 1e-2f);

    const DoraSetup::Saved saved = s.run(y);
    Tensor dy = Tensor::empty(y.shape(), DType::F32);
    for (int64_t i = 0; i < y.numel(); ++i) dy.data<float>()[i] = static_cast<float>(w[static_cast<size_t>(i)]);
    // dA, dB, dm accumulate onto what is there; dx is written (accumulate_dx false).
    Tensor dx = random_tensor(s.x.shape(), DType::F32, 43);
    Tensor dA = random_tensor(s.A.shape(), DType::F32, 44), dB = random_tensor(s.B.shape(), DType::F32, 45),
           dm = random_tensor(s.m.shape(), DType::F32, 46);
    const std::vector<double> dA0 = to_doubles(dA), dB0 = to_doubles(dB), dm0 = to_doubles(dm);
    dora_backward(dx, false, dA, dB, dm, dy, s.x, DoraSaved{saved.xa, saved.z, s.norm}, s.site());
    auto added = [](const Tensor& t, const std::vector<double>& before) {
      std::vector<double> v = to_doubles(t);
      for (size_t i = 0; i < v.size(); ++i) v[i] -= before[i];
      return v;
    };
    EXPECT_LE(test::relative_error(to_doubles(dx), numeric_dx), 1e-3) << "dropout " << dropout;
    EXPECT_LE(test::relative_error(added(dA, dA0), numeric_dA), 1e-3) << "dropout " << dropout;
    EXPECT_LE(test::relative_error(added(dB, dB0), numeric_dB), 1e-3) << "dropout " << dropout;
    EXPECT_LE(test::relative_error(added(dm, dm0), numeric_dm), 1e-3) << "dropout " << dropout;

    // accumulate_dx adds the same gradient onto what dx held.
    Tensor dx2 = random_tensor(s.x.shape(), DType::F32, 47);
    const std::vector<double> dx20 = to_doubles(dx2);
    dora_backward(dx2, true, dA, dB, dm, dy, s.x, DoraSaved{saved.xa, saved.z, s.norm}, s.site());
    EXPECT_LE(test::max_abs_diff(added(dx2, dx20), to_doubles(dx)), 1e-5) << "dropout " << dropout;
  }
}

TEST(OpsDora, ChecksItsArguments) {
  DoraSetup s(51);
  s.compute_norm();
  Tensor y = Tensor::empty(Shape{s.M, s.out}, DType::F32);
  Tensor xa = Tensor::empty(Shape{s.M, s.rank}, DType::F32), z = Tensor::empty(Shape{s.M, s.out}, DType::F32);
  Tensor short_m = Tensor::empty(Shape{s.out - 1}, DType::F32);
  DoraSite bad = s.site();
  bad.magnitude = short_m;
  EXPECT_THROW(dora_forward(y, DoraSaved{xa, z, s.norm}, s.x, bad), std::logic_error);
  Tensor wide_norm = Tensor::empty(Shape{s.out + 1}, DType::F32);
  EXPECT_THROW(dora_weight_norm(wide_norm, s.W, s.A, s.B, 1.0f), std::logic_error);
  Tensor wrong_z = Tensor::empty(Shape{s.M, s.out + 1}, DType::F32);
  EXPECT_THROW(dora_forward(y, DoraSaved{xa, wrong_z, s.norm}, s.x, s.site()), std::logic_error);
}

}  // namespace
}  // namespace fsdpq
