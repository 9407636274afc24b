#include "ops/lora.h"

#include "backend/cuda_backend.h"
#include "ops/matmul.h"
#include "ops_test_support.h"
#include "util/error.h"

#include <gtest/gtest.h>

#include <cmath>

namespace fsdpq {
namespace {

using test::random_tensor;
using test::to_doubles;

struct LoraSetup {
  int64_t M = 7, in = 20, out = 12, rank = 4;
  Tensor x, A, B, y0;
  LoraSetup(DType dtype, uint32_t seed) {
    x = random_tensor(Shape{M, in}, dtype, seed);
    A = random_tensor(Shape{rank, in}, dtype, seed + 1);
    B = random_tensor(Shape{out, rank}, dtype, seed + 2);
    y0 = random_tensor(Shape{M, out}, dtype, seed + 3);  // the base layer's output
  }
  // y0 + scaling * dropout(x) Aᵀ Bᵀ in double, with the mask from lora_dropout_keeps.
  std::vector<double> naive(const LoraParams& p) const {
    const std::vector<double> xd = to_doubles(x), ad = to_doubles(A), bd = to_doubles(B);
    std::vector<double> y = to_doubles(y0);
    const double scaling = static_cast<double>(p.alpha) / static_cast<double>(rank);
    const bool dropping = p.training && p.dropout > 0.0f;
    for (int64_t m = 0; m < M; ++m) {
      std::vector<double> xa(static_cast<size_t>(rank), 0.0);
      for (int64_t r = 0; r < rank; ++r)
        for (int64_t i = 0; i < in; ++i) {
          double xi = xd[static_cast<size_t>(m * in + i)];
          if (dropping)
            xi = lora_dropout_keeps(p.dropout_key, static_cast<uint64_t>(m * in + i), p.dropout) ? xi / (1.0 - p.dropout) : 0.0;
          xa[static_cast<size_t>(r)] += xi * ad[static_cast<size_t>(r * in + i)];
        }
      for (int64_t o = 0; o < out; ++o)
        for (int64_t r = 0; r < rank; ++r)
          y[static_cast<size_t>(m * out + o)] += scaling * xa[static_cast<size_t>(r)] * bd[static_cast<size_t>(o * rank + r)];
    }
    return y;
  }
  Tensor run(const LoraParams& p, DType xa_dtype = DType::F32) const {
    Tensor y = Tensor::empty(y0.shape(), y0.dtype());
    std::copy(static_cast<const char*>(y0.view().data), static_cast<const char*>(y0.view().data) + y0.nbytes(),
              static_cast<char*>(y.view().data));
    Tensor xa = Tensor::empty(Shape{M, rank}, xa_dtype);
    lora_forward(y, xa, x, A, B, p);
    return y;
  }
};

// FSDPQ_LORA_KERNELS=auto before CUDA is up (here: the CPU tests never start it) answers the
// separate path: what `fsdpq plan` counts without a GPU. (GpuOpsLoraFused.AutoTakesTheHopperKernelsOnHopper
// checks the GPU's answer.)
TEST(OpsLora, AutomaticGpuKernelsAreSeparateBeforeCudaIsUp) {
  if (cuda_initialized()) GTEST_SKIP() << "CUDA is up in this process: the GPU test checks auto's answer there";
  const GpuLoraKernels saved = gpu_lora_kernels();
  use_automatic_gpu_lora_kernels();
  EXPECT_EQ(gpu_lora_kernels(), GpuLoraKernels::Separate);
  set_gpu_lora_kernels(GpuLoraKernels::Fused);
  EXPECT_EQ(gpu_lora_kernels(), GpuLoraKernels::Fused);
  set_gpu_lora_kernels(saved);
}

TEST(OpsLora, ForwardMatchesNaiveWithAndWithoutDropout) {
  LoraSetup s(DType::F32, 81);
  LoraParams p;
  p.alpha = 16.0f;
  EXPECT_LE(test::max_abs_diff(to_doubles(s.run(p)), s.naive(p)), 1e-5);
  p.training = true;
  p.dropout = 0.3f;
  p.dropout_key = 1234;
  EXPECT_LE(test::max_abs_diff(to_doubles(s.run(p)), s.naive(p)), 1e-5);
}

TEST(OpsLora, DropoutZeroIsExactlyTheUndroppedPath) {
  LoraSetup s(DType::BF16, 82);
  LoraParams eval;
  eval.alpha = 8.0f;
  LoraParams train_p0 = eval;
  train_p0.training = true;
  LoraParams eval_with_p = eval;  // dropout only acts in training
  eval_with_p.dropout = 0.5f;
  const std::vector<double> reference = to_doubles(s.run(eval));
  EXPECT_EQ(to_doubles(s.run(train_p0)), reference);
  EXPECT_EQ(to_doubles(s.run(eval_with_p)), reference);

  // And it is the plain composition of the two linear ops.
  Tensor xa = Tensor::empty(Shape{s.M, s.rank}, DType::F32);
  Tensor y = s.run(eval);
  std::copy(static_cast<const char*>(s.y0.view().data), static_cast<const char*>(s.y0.view().data) + s.y0.nbytes(),
            static_cast<char*>(y.view().data));
  linear_forward(xa, s.x, s.A);
  linear_forward(y, xa, s.B, true, 8.0f / 4.0f);
  EXPECT_EQ(to_doubles(y), reference);
}

// The mask's definition (ops/lora.h), written out again: the GPU kernel implements the same
// function, and a change to it changes every run's masks, so it must be deliberate.
TEST(OpsLora, DropoutMaskIsTheDocumentedFunction) {
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  const float p = 0.3f;
  const uint32_t threshold = static_cast<uint32_t>(std::llround(0.3 * 65536.0));
  for (uint64_t key : {0ull, 12345ull, 0xFFFFFFFFFFFFFFFFull})
    for (uint64_t index = 0; index < 4000; ++index) {
      const uint64_t word = mix(mix(key) + (index / 4 + 1) * 0x9E3779B97F4A7C15ull);
      const bool keep = ((word >> (16 * (index % 4))) & 0xFFFF) >= threshold;
      ASSERT_EQ(lora_dropout_keeps(key, index, p), keep) << "key " << key << " index " << index;
    }
}

TEST(OpsLora, DropoutMaskIsDeterministicPerKey) {
  const int64_t n = 100000;
  const float p = 0.1f;
  int64_t kept = 0, differ = 0, same_again = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool a = lora_dropout_keeps(42, static_cast<uint64_t>(i), p);
    kept += a;
    same_again += a == lora_dropout_keeps(42, static_cast<uint64_t>(i), p);
    differ += a != lora_dropout_keeps(43, static_cast<uint64_t>(i), p);
  }
  EXPECT_EQ(same_again, n);
  // Keep rate 0.9 (sd of the count ≈ 95); two independent masks differ on 2·p·(1-p) = 18%.
  EXPECT_NEAR(static_cast<double>(kept) / n, 0.9, 0.005);
  EXPECT_NEAR(static_cast<double>(differ) / n, 0.18, 0.01);
  for (int64_t i = 0; i < 1000; ++i) EXPECT_TRUE(lora_dropout_keeps(7, static_cast<uint64_t>(i), 0.0f));

  LoraSetup s(DType::F32, 83);
  LoraParams params;
  params.training = true;
  params.dropout = 0.5f;
  params.dropout_key = 99;
  const std::vector<double> first = to_doubles(s.run(params));
  EXPECT_EQ(to_doubles(s.run(params)), first);
  params.dropout_key = 100;
  EXPECT_NE(to_doubles(s.run(params)), first);
}

TEST(OpsLora, BackwardMatchesFiniteDifferences) {
  for (float dropout : {0.0f, 0.4f}) {
    LoraSetup s(DType::F32, 84);
    LoraParams p;
    p.alpha = 6.0f;
    p.training = true;
    p.dropout = dropout;
    p.dropout_key = 555;
    Tensor y = Tensor::empty(s.y0.shape(), DType::F32);
    Tensor xa = Tensor::empty(Shape{s.M, s.rank}, DType::F32);
    const std::vector<double> w = test::random_weights(y.numel(), 85);
    auto loss = [&] {
      std::fill(y.data<float>(), y.data<float>() + y.numel(), 0.0f);
      lora_forward(y, xa, s.x, s.A, s.B, p);
      return test::weighted_sum(y, w);
    };
    const std::vector<double> numeric_dx = test::numerical_gradient(s.x, loss, 1e-2f);
    const std::vector<double> numeric_dA = test::numerical_gradient(s.A, loss, 1e-2f);
    const std::vector<double> numeric_dB = test::numerical_gradient(s.B, loss, 1e-2f);

    loss();  // leaves xa from the unperturbed forward
    Tensor dy = Tensor::empty(y.shape(), DType::F32);
    for (int64_t i = 0; i < y.numel(); ++i) dy.data<float>()[i] = static_cast<float>(w[static_cast<size_t>(i)]);
    // dx, dA, dB accumulate onto what is there.
    Tensor dx = random_tensor(s.x.shape(), DType::F32, 86);
    Tensor dA = random_tensor(s.A.shape(), DType::F32, 87), dB = random_tensor(s.B.shape(), DType::F32, 88);
    const std::vector<double> dx0 = to_doubles(dx), dA0 = to_doubles(dA), dB0 = to_doubles(dB);
    lora_backward(dx, dA, dB, dy, s.x, xa, s.A, s.B, p);
    auto added = [](const Tensor& t, const std::vector<double>& before) {
      std::vector<double> v = to_doubles(t);
      for (size_t i = 0; i < v.size(); ++i) v[i] -= before[i];
      return v;
    };
    EXPECT_LE(test::relative_error(added(dx, dx0), numeric_dx), 1e-3) << "dropout " << dropout;
    EXPECT_LE(test::relative_error(added(dA, dA0), numeric_dA), 1e-3) << "dropout " << dropout;
    EXPECT_LE(test::relative_error(added(dB, dB0), numeric_dB), 1e-3) << "dropout " << dropout;

    // Without dx (the input gradient is not needed), dA and dB are the same.
    Tensor dA2 = Tensor::empty(s.A.shape(), DType::F32), dB2 = Tensor::empty(s.B.shape(), DType::F32);
    std::copy(dA0.begin(), dA0.end(), dA2.data<float>());
    std::copy(dB0.begin(), dB0.end(), dB2.data<float>());
    TensorView no_dx{nullptr, DType::F32, s.x.shape(), Device::CPU};
    lora_backward(no_dx, dA2, dB2, dy, s.x, xa, s.A, s.B, p);
    EXPECT_EQ(to_doubles(dA2), to_doubles(dA));
    EXPECT_EQ(to_doubles(dB2), to_doubles(dB));
  }
}

// Three adapters on one input (q/k/v): the group reads x once, and computes what the adapters
// compute one by one: xa, y, dA and dB bit for bit (per element the same sums), dx to fp32
// rounding without dropout (one GEMM sums over the stacked ranks) and bit for bit with it (each
// adapter's masked part is added in turn, as one by one).
TEST(OpsLora, GroupEqualsItsAdaptersOneByOne) {
  const int64_t M = 9, in = 24;
  const std::vector<int64_t> outs = {16, 8, 8}, ranks = {4, 2, 4};
  for (DType dtype : {DType::F32, DType::BF16})
    for (float dropout : {0.0f, 0.25f}) {
      SCOPED_TRACE(fmt::format("{} dropout {}", dtype_name(dtype), dropout));
      Tensor x = random_tensor(Shape{M, in}, dtype, 90);
      std::vector<Tensor> As, Bs, ys, dys, ys_alone, xas_alone;
      std::vector<LoraSite> sites;
      std::vector<TensorView> y_views, dy_views;
      int64_t total_rank = 0;
      for (size_t i = 0; i < outs.size(); ++i) {
        As.push_back(random_tensor(Shape{ranks[i], in}, dtype, 91 + 10 * i));
        Bs.push_back(random_tensor(Shape{outs[i], ranks[i]}, dtype, 92 + 10 * i));
        ys.push_back(random_tensor(Shape{M, outs[i]}, dtype, 93 + 10 * i));
        ys_alone.push_back(random_tensor(Shape{M, outs[i]}, dtype, 93 + 10 * i));
        dys.push_back(random_tensor(Shape{M, outs[i]}, DType::F32, 94 + 10 * i));
        xas_alone.push_back(Tensor::empty(Shape{M, ranks[i]}, dtype));
        sites.push_back(LoraSite{As[i].view(), Bs[i].view(), LoraParams{8.0f, dropout, true, 700 + i}});
        y_views.push_back(ys[i].view());
        dy_views.push_back(dys[i].view());
        total_rank += ranks[i];
      }
      Tensor xa = Tensor::empty(Shape{M, total_rank}, dtype);
      lora_forward_group(y_views, xa, x, sites);
      for (size_t i = 0; i < sites.size(); ++i)
        lora_forward(ys_alone[i], xas_alone[i], x, As[i], Bs[i], sites[i].params);

      Tensor dx = random_tensor(Shape{M, in}, DType::F32, 95), dx_alone = random_tensor(Shape{M, in}, DType::F32, 95);
      std::vector<Tensor> dA, dB, dA_alone, dB_alone;
      std::vector<LoraSiteGrads> grads;
      for (size_t i = 0; i < sites.size(); ++i) {
        dA.push_back(random_tensor(As[i].shape(), DType::F32, 96 + i));
        dB.push_back(random_tensor(Bs[i].shape(), DType::F32, 97 + i));
        dA_alone.push_back(random_tensor(As[i].shape(), DType::F32, 96 + i));
        dB_alone.push_back(random_tensor(Bs[i].shape(), DType::F32, 97 + i));
        grads.push_back(LoraSiteGrads{dA[i].view(), dB[i].view()});
      }
      lora_backward_group(dx, grads, dy_views, x, xa, sites);
      for (size_t i = 0; i < sites.size(); ++i)
        lora_backward(dx_alone, dA_alone[i], dB_alone[i], dys[i], x, xas_alone[i], As[i], Bs[i], sites[i].params);

      int64_t first = 0;
      for (size_t i = 0; i < sites.size(); ++i) {
        EXPECT_EQ(to_doubles(ys[i]), to_doubles(ys_alone[i])) << "y " << i;
        for (int64_t m = 0; m < M; ++m)
          for (int64_t r = 0; r < ranks[i]; ++r)
            ASSERT_EQ(load_f32(xa.view(), m * total_rank + first + r), load_f32(xas_alone[i].view(), m * ranks[i] + r))
                << "xa " << i;
        EXPECT_EQ(to_doubles(dA[i]), to_doubles(dA_alone[i])) << "dA " << i;
        EXPECT_EQ(to_doubles(dB[i]), to_doubles(dB_alone[i])) << "dB " << i;
        first += ranks[i];
      }
      if (dropout > 0.0f)
        EXPECT_EQ(to_doubles(dx), to_doubles(dx_alone));
      else
        EXPECT_LE(test::relative_error(to_doubles(dx), to_doubles(dx_alone)), 1e-6);
    }
}

// lora_backward_input with accumulate_dx false writes the adapters' part into dx: what adding it
// to zeros gives, bit for bit, whatever dx held (every path: stacked, per adapter, dropout).
TEST(OpsLora, WrittenInputGradientIsTheAddedOneOnZeros) {
  const int64_t M = 9, in = 24;
  for (const std::vector<int64_t>& ranks : {std::vector<int64_t>{4}, std::vector<int64_t>{4, 2, 4}})
    for (DType dtype : {DType::F32, DType::BF16})
      for (float dropout : {0.0f, 0.25f}) {
        SCOPED_TRACE(fmt::format("{} adapters {} dropout {}", ranks.size(), dtype_name(dtype), dropout));
        Tensor x = random_tensor(Shape{M, in}, dtype, 50);
        std::vector<Tensor> As, Bs, dA_added, dA_written;
        std::vector<LoraSite> sites;
        int64_t total_rank = 0;
        for (size_t i = 0; i < ranks.size(); ++i) {
          As.push_back(random_tensor(Shape{ranks[i], in}, dtype, 51 + i));
          Bs.push_back(random_tensor(Shape{8, ranks[i]}, dtype, 61 + i));
          dA_added.push_back(Tensor::zeros(As[i].shape(), DType::F32));
          dA_written.push_back(Tensor::zeros(As[i].shape(), DType::F32));
          sites.push_back(LoraSite{As[i].view(), Bs[i].view(), LoraParams{8.0f, dropout, true, 900 + i}});
          total_rank += ranks[i];
        }
        const Tensor xa = random_tensor(Shape{M, total_rank}, dtype, 70);
        const Tensor dxa = random_tensor(Shape{M, total_rank}, DType::F32, 71);
        Tensor added = Tensor::zeros(Shape{M, in}, DType::F32), written = random_tensor(Shape{M, in}, DType::F32, 72);
        std::vector<TensorView> added_views, written_views;
        for (size_t i = 0; i < ranks.size(); ++i) {
          added_views.push_back(dA_added[i].view());
          written_views.push_back(dA_written[i].view());
        }
        lora_backward_input(added, added_views, dxa, x, xa, sites);
        lora_backward_input(written, written_views, dxa, x, xa, sites, /*accumulate_dx=*/false);
        EXPECT_EQ(to_doubles(written), to_doubles(added));
        for (size_t i = 0; i < ranks.size(); ++i) EXPECT_EQ(to_doubles(dA_written[i]), to_doubles(dA_added[i]));
      }
}

// The backward's steps with parts left out (a null dB or dxa, no dA, a null dx), each part in a
// call of its own, give the bits of the whole steps: every path (stacked, per adapter, dropout),
// dx added to and written.
TEST(OpsLora, BackwardStepsInPartsGiveTheWholeBits) {
  const int64_t M = 9, in = 24;
  for (const std::vector<int64_t>& ranks : {std::vector<int64_t>{4}, std::vector<int64_t>{4, 2, 4}})
    for (DType dtype : {DType::F32, DType::BF16})
      for (float dropout : {0.0f, 0.25f})
        for (bool accumulate_dx : {true, false}) {
          SCOPED_TRACE(fmt::format("{} adapters {} dropout {} accumulate {}", ranks.size(), dtype_name(dtype), dropout,
                                   accumulate_dx));
          const Tensor x = random_tensor(Shape{M, in}, dtype, 50);
          std::vector<Tensor> As, Bs, dys;
          std::vector<LoraSite> sites;
          int64_t total_rank = 0;
          for (size_t i = 0; i < ranks.size(); ++i) {
            As.push_back(random_tensor(Shape{ranks[i], in}, dtype, 51 + i));
            Bs.push_back(random_tensor(Shape{8, ranks[i]}, dtype, 61 + i));
            dys.push_back(random_tensor(Shape{M, 8}, DType::F32, 81 + i));
            sites.push_back(LoraSite{As[i].view(), Bs[i].view(), LoraParams{8.0f, dropout, true, 900 + i}});
            total_rank += ranks[i];
          }
          const Tensor xa = random_tensor(Shape{M, total_rank}, dtype, 70);
          struct Grads {
            Tensor dx, dxa;
            std::vector<Tensor> dA, dB;
            std::vector<TensorView> dA_views;
          };
          auto fresh = [&] {
            Grads g{random_tensor(Shape{M, in}, DType::F32, 72), Tensor::zeros(Shape{M, total_rank}, DType::F32), {}, {}, {}};
            for (size_t i = 0; i < ranks.size(); ++i) {
              g.dA.push_back(random_tensor(As[i].shape(), DType::F32, 73 + i));
              g.dB.push_back(random_tensor(Bs[i].shape(), DType::F32, 76 + i));
              g.dA_views.push_back(g.dA[i].view());
            }
            return g;
          };
          Grads whole = fresh(), parts = fresh();
          for (size_t i = 0; i < ranks.size(); ++i) lora_backward_output(whole.dxa, i, whole.dB[i], dys[i], x, xa, sites);
          lora_backward_input(whole.dx, whole.dA_views, whole.dxa, x, xa, sites, accumulate_dx);
          for (size_t i = 0; i < ranks.size(); ++i) lora_backward_output(parts.dxa, i, TensorView{}, dys[i], x, xa, sites);
          for (size_t i = 0; i < ranks.size(); ++i) lora_backward_output(TensorView{}, i, parts.dB[i], dys[i], x, xa, sites);
          lora_backward_input(parts.dx, {}, parts.dxa, x, xa, sites, accumulate_dx);
          lora_backward_input(TensorView{}, parts.dA_views, parts.dxa, x, xa, sites);
          EXPECT_EQ(to_doubles(parts.dxa), to_doubles(whole.dxa));
          EXPECT_EQ(to_doubles(parts.dx), to_doubles(whole.dx));
          for (size_t i = 0; i < ranks.size(); ++i) {
            EXPECT_EQ(to_doubles(parts.dA[i]), to_doubles(whole.dA[i])) << "dA " << i;
            EXPECT_EQ(to_doubles(parts.dB[i]), to_doubles(whole.dB[i])) << "dB " << i;
          }
        }
}

TEST(OpsLora, GroupChecksItsArguments) {
  Tensor x = random_tensor(Shape{5, 8}, DType::F32, 1);
  Tensor A0 = random_tensor(Shape{2, 8}, DType::F32, 2), B0 = random_tensor(Shape{4, 2}, DType::F32, 3);
  Tensor A1 = random_tensor(Shape{3, 8}, DType::F32, 4), B1 = random_tensor(Shape{4, 3}, DType::F32, 5);
  Tensor y0 = Tensor::zeros(Shape{5, 4}, DType::F32), y1 = Tensor::zeros(Shape{5, 4}, DType::F32);
  const TensorView ys[] = {y0, y1};
  LoraSite sites[] = {{A0, B0, LoraParams{}}, {A1, B1, LoraParams{}}};
  Tensor narrow_xa = Tensor::empty(Shape{5, 4}, DType::F32);  // Σr is 5
  EXPECT_THROW(lora_forward_group(ys, narrow_xa, x, sites), std::logic_error);
  Tensor xa = Tensor::empty(Shape{5, 5}, DType::F32);
  sites[1].params.dropout = 0.5f;  // a group shares one probability
  EXPECT_THROW(lora_forward_group(ys, xa, x, sites), std::logic_error);
  sites[1].params.dropout = 0.0f;
  EXPECT_THROW(lora_forward_group(std::span(ys, 1), xa, x, sites), std::logic_error);
  lora_forward_group(ys, xa, x, sites);
}

TEST(OpsLora, DropoutOfOneIsRejected) {
  LoraSetup s(DType::F32, 89);
  LoraParams p;
  p.training = true;
  p.dropout = 1.0f;
  EXPECT_THROW(s.run(p), UserError);
}

// lora_down_group with a copy of x (the folded GEMM's [x | xa]): xa as the plain call gives it,
// x bit for bit in the block, the columns around it untouched; a block of another shape or dtype
// is refused, naming both.
TEST(OpsLora, DownGroupCopiesXIntoABlock) {
  const int64_t M = 5, in = 16, R = 8;
  const Tensor x = random_tensor(Shape{M, in}, DType::BF16, 120);
  const Tensor A0 = random_tensor(Shape{4, in}, DType::BF16, 121), A1 = random_tensor(Shape{4, in}, DType::BF16, 122);
  const Tensor B0 = random_tensor(Shape{6, 4}, DType::BF16, 123), B1 = random_tensor(Shape{6, 4}, DType::BF16, 124);
  const LoraSite sites[] = {{A0.view(), B0.view(), LoraParams{8.0f, 0.25f, true, 7}},
                            {A1.view(), B1.view(), LoraParams{8.0f, 0.25f, true, 8}}};
  Tensor xa = Tensor::empty(Shape{M, R}, DType::BF16), xa_plain = Tensor::empty(Shape{M, R}, DType::BF16);
  const Tensor before = random_tensor(Shape{M, R + in + 3}, DType::BF16, 125);
  Tensor wide = copy_to(before.view(), Device::CPU);
  lora_down_group(xa.view(), x.view(), sites, MatrixView(wide.view(), R, in));
  lora_down_group(xa_plain.view(), x.view(), sites);
  for (int64_t i = 0; i < M * R; ++i) EXPECT_EQ(load_f32(xa.view(), i), load_f32(xa_plain.view(), i)) << i;
  for (int64_t r = 0; r < M; ++r)
    for (int64_t c = 0; c < R + in + 3; ++c) {
      const int64_t at = r * (R + in + 3) + c;
      const float want = c >= R && c < R + in ? load_f32(x.view(), r * in + c - R) : load_f32(before.view(), at);
      EXPECT_EQ(load_f32(wide.view(), at), want) << "row " << r << " column " << c;
    }
  Tensor narrow = Tensor::empty(Shape{M, in - 1}, DType::BF16);
  try {
    lora_down_group(xa.view(), x.view(), sites, MatrixView(narrow.view()));
    FAIL() << "a block of another shape was taken";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("x's copy"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fsdpq
