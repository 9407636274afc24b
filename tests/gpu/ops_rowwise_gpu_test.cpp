// GPU parity of the elementwise, rmsnorm, swiglu, rope, embedding and cross-entropy ops: the same
// public op on random CPU tensors and on their GPU copies (the op dispatches by device), every
// output compared against the CPU reference with a stated tolerance. Perf mode
// (FSDPQ_GPU_PERF=1) adds one timing line per op at Llama-2-7B shapes.
//
// Tolerances (normalized L2 error, op_parity.h):
//  - exact (0): ops whose GPU arithmetic is the CPU's operation for operation with one IEEE
//    rounding each (gathers, single adds/multiplies, conversions, embedding's in-order sums).
//  - fp32 outputs: 1e-5 where only a reduction order differs (block trees vs the CPU's lanes),
//    1e-6 for the elementwise exp-based ones (CUDA's expf vs the host's exp: an ulp or two).
//  - 16-bit outputs: one rounding of the output type; the fp32 values before it agree to ~1e-6, so
//    a result differs at most by one ulp where the fp32 value sits next to a rounding boundary:
//    bf16 (ulp 2^-8 relative) 1e-2, f16 (ulp 2^-11) 2e-3 — both far above what rare 1-ulp flips
//    give, far below what any indexing or formula error gives.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gpu/op_parity.h"
#include "ops/cross_entropy.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "ops/swiglu.h"
#include "util/error.h"

namespace fsdpq {
namespace {

using test::expect_close;
using test::on_cpu;
using test::on_gpu;
using test::random_tensor;
using test::report_perf;
using test::use_gpu;
using test::values_of;

constexpr DType kFloatTypes[] = {DType::F32, DType::BF16, DType::F16};

// The tolerance of an output of this dtype (see the file comment); f32 is the fp32 one.
double tol_for(DType dtype, double f32) {
  return dtype == DType::BF16 ? 1e-2 : dtype == DType::F16 ? 2e-3 : f32;
}

// t and F32 (once when t is F32): an operand's own dtype and the fp32 variant.
std::vector<DType> and_f32(DType t) { return t == DType::F32 ? std::vector<DType>{t} : std::vector<DType>{t, DType::F32}; }

std::string name_of(DType dtype) { return std::string(dtype_name(dtype)); }

// Bit-for-bit equality of the values of two tensors (either device).
void expect_exact(const TensorView& gpu, const TensorView& cpu, const std::string& what) {
  const std::vector<double> got = values_of(gpu), want = values_of(cpu);
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t mismatches = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i] && !(std::isnan(got[i]) && std::isnan(want[i]))) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++mismatches;
    }
  EXPECT_EQ(mismatches, 0) << what << ": " << mismatches << " of " << got.size() << " differ; first at " << first
                           << " (gpu " << (first >= 0 ? got[static_cast<size_t>(first)] : 0.0) << ", cpu "
                           << (first >= 0 ? want[static_cast<size_t>(first)] : 0.0) << ")";
}

Tensor make_i32(const std::vector<int32_t>& values) {
  Tensor t = Tensor::empty(Shape{static_cast<int64_t>(values.size())}, DType::I32);
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

std::vector<int32_t> random_ids(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = dist(rng);
  return ids;
}

void sync() { cuda_synchronize(); }

// ---------------------------------------------------------------------------------------------
// elementwise

TEST(GpuOpsElementwise, SingleRoundingOpsMatchTheCpuExactly) {
  use_gpu();
  // One IEEE add, multiply or conversion per element on both devices: bit-identical. Sizes of
  // whole 8-element groups take the 16-byte kernel, the others the element one.
  for (int64_t n : {int64_t{1}, int64_t{37}, int64_t{65537}, int64_t{8}, int64_t{65536}}) {
    for (DType out_t : kFloatTypes)
      for (DType a_t : kFloatTypes)
        for (DType b_t : kFloatTypes) {
          const std::string what = fmt::format("residual_add n={} {}={}+{}", n, name_of(out_t), name_of(a_t), name_of(b_t));
          Tensor a = random_tensor(Shape{n}, a_t, 1), b = random_tensor(Shape{n}, b_t, 2);
          Tensor out = Tensor::empty(Shape{n}, out_t);
          Tensor ga = on_gpu(a), gb = on_gpu(b), gout = Tensor::empty(Shape{n}, out_t, Device::CUDA);
          residual_add(out, a, b);
          residual_add(gout, ga, gb);
          expect_exact(gout, out, what);
        }
    for (DType y_t : kFloatTypes)
      for (DType x_t : kFloatTypes) {
        Tensor x = random_tensor(Shape{n}, x_t, 3);
        Tensor gx = on_gpu(x);
        Tensor y = Tensor::empty(Shape{n}, y_t), gy = Tensor::empty(Shape{n}, y_t, Device::CUDA);
        copy_convert(y, x);
        copy_convert(gy, gx);
        expect_exact(gy, y, fmt::format("copy_convert n={} {}<-{}", n, name_of(y_t), name_of(x_t)));
      }
    for (DType t : kFloatTypes) {
      Tensor x = random_tensor(Shape{n}, t, 4);
      Tensor gx = on_gpu(x);
      scale_in_place(x, 0.37f);
      scale_in_place(gx, 0.37f);
      expect_exact(gx, x, fmt::format("scale_in_place n={} {}", n, name_of(t)));

      Tensor acc = random_tensor(Shape{n}, DType::F32, 5);
      Tensor gacc = on_gpu(acc);
      Tensor src = random_tensor(Shape{n}, t, 6);
      Tensor gsrc = on_gpu(src);
      accumulate(acc, src);
      accumulate(gacc, gsrc);
      expect_exact(gacc, acc, fmt::format("accumulate n={} F32+={}", n, name_of(t)));
    }
  }
}

TEST(GpuOpsElementwise, LargeAndAliasedResidualAdd) {
  use_gpu();
  // A 7B residual stream (4096 tokens x 4096), with and without a ragged tail (the element and the
  // 16-byte kernels).
  for (const int64_t n : {int64_t{4096} * 4096 + 3, int64_t{4096} * 4096})
  for (DType t : kFloatTypes) {
    Tensor a = random_tensor(Shape{n}, t, 7), b = random_tensor(Shape{n}, t, 8);
    Tensor ga = on_gpu(a), gb = on_gpu(b);
    residual_add(a, a, b);  // out aliases a, as the model's residual stream does
    residual_add(ga, ga, gb);
    expect_exact(ga, a, "residual_add in place " + name_of(t));
  }
}

TEST(GpuOpsElementwise, AddScaled) {
  use_gpu();
  // y + f*x: two roundings in fp32 on both devices (no FMA on the GPU); 1e-6 / the 16-bit
  // tolerances only guard against a host compiler that contracts to an FMA.
  for (int64_t n : {int64_t{1}, int64_t{1001}, int64_t{4096 * 1024 + 5}, int64_t{4096 * 1024}})
    for (DType y_t : kFloatTypes)
      for (DType x_t : kFloatTypes) {
        Tensor y = random_tensor(Shape{n}, y_t, 9), x = random_tensor(Shape{n}, x_t, 10);
        Tensor gy = on_gpu(y), gx = on_gpu(x);
        add_scaled(y, x, -0.71f);
        add_scaled(gy, gx, -0.71f);
        expect_close(gy, y, tol_for(y_t, 1e-6), fmt::format("add_scaled n={} {}+={}", n, name_of(y_t), name_of(x_t)));
      }
  // Aliased: y += f*y, element and 16-byte kernels.
  for (const int64_t n : {333, 336}) {
    Tensor y = random_tensor(Shape{n}, DType::BF16, 11);
    Tensor gy = on_gpu(y);
    add_scaled(y, y, 0.5f);
    add_scaled(gy, gy, 0.5f);
    expect_close(gy, y, 1e-2, fmt::format("add_scaled aliased n={}", n));
  }
  // Whole groups at an address that is not 16-byte aligned: the element kernel.
  Tensor a = random_tensor(Shape{1 + 4096}, DType::BF16, 12), b = random_tensor(Shape{1 + 4096}, DType::BF16, 13);
  Tensor ga = on_gpu(a), gb = on_gpu(b);
  const TensorView a1 = a.view().slice_rows(1, 4096), b1 = b.view().slice_rows(1, 4096);
  const TensorView ga1 = ga.view().slice_rows(1, 4096), gb1 = gb.view().slice_rows(1, 4096);
  add_scaled(a1, b1, 0.25f);
  add_scaled(ga1, gb1, 0.25f);
  expect_close(ga, a, 1e-2, "add_scaled at an unaligned address");
}

TEST(GpuOpsElementwise, FillZeroAndSumOfSquares) {
  use_gpu();
  for (DType t : kFloatTypes) {
    Tensor x = random_tensor(Shape{4097}, t, 12);
    Tensor gx = on_gpu(x);
    fill_zero(gx);
    for (double v : values_of(gx)) ASSERT_EQ(v, 0.0) << name_of(t);
  }
  Tensor empty_gpu = Tensor::empty(Shape{0}, DType::F32, Device::CUDA);
  fill_zero(empty_gpu);
  EXPECT_EQ(sum_of_squares(empty_gpu), 0.0);
  // fp64 sums of the same fp32 squares in another order: relative differences ~1e-16·sqrt(n).
  for (int64_t n : {int64_t{1}, int64_t{4095}, int64_t{4096}, int64_t{4097}, int64_t{11008 * 4096 + 17}})
    for (DType t : kFloatTypes) {
      Tensor x = random_tensor(Shape{n}, t, 13);
      Tensor gx = on_gpu(x);
      const double cpu = sum_of_squares(x), gpu = sum_of_squares(gx);
      EXPECT_LE(std::abs(gpu - cpu), 1e-12 * cpu) << "sum_of_squares n=" << n << " " << name_of(t) << ": gpu " << gpu
                                                  << " cpu " << cpu;
      EXPECT_EQ(sum_of_squares(gx), gpu) << "sum_of_squares repeats bit for bit";
    }
}

TEST(GpuOpsElementwise, Perf) {
  use_gpu();
  const int64_t n = 4096 * 4096;
  Tensor a = on_gpu(random_tensor(Shape{n}, DType::BF16, 14)), b = on_gpu(random_tensor(Shape{n}, DType::BF16, 15));
  report_perf("residual_add bf16 4096x4096 in place", 3.0 * 2 * n, 0, [&] { residual_add(a, a, b); });
  Tensor acc = on_gpu(random_tensor(Shape{n}, DType::F32, 16));
  report_perf("accumulate f32 += bf16 4096x4096", (4.0 * 2 + 2) * n, 0, [&] { accumulate(acc, b); });
  const int64_t big = 4096 * 11008;
  Tensor g = on_gpu(random_tensor(Shape{big}, DType::F32, 17));
  report_perf("sum_of_squares f32 4096x11008 (with the host copy)", 4.0 * big, 0, [&] { (void)sum_of_squares(g); });
}

// ---------------------------------------------------------------------------------------------
// rmsnorm

struct RowShape {
  int64_t rows, C;
};
// rstd is an fp32 reduction in another order, so the file's 1e-5. Not 1e-6: the CPU's own sum
// (eight lanes of C / 8 terms, ops/rmsnorm.cpp) errs by ~sqrt(C / 8)·2⁻²⁴, 2.3e-6 at C 12288, and
// the H200 measured 1.3e-6 and 1.6e-6 there (stop 38).
constexpr double kRstdTolerance = 1e-5;
constexpr RowShape kNormShapes[] = {{1, 7}, {3, 130}, {257, 1031}, {4096, 4096}};

TEST(GpuOpsRmsnorm, ForwardMatchesCpu) {
  use_gpu();
  for (const RowShape& s : kNormShapes)
    for (DType x_t : kFloatTypes)
      for (DType w_t : and_f32(x_t)) {
        const std::string what = fmt::format("rmsnorm_forward [{}, {}] x={} w={}", s.rows, s.C, name_of(x_t), name_of(w_t));
        Tensor x = random_tensor(Shape{s.rows, s.C}, x_t, 20, -2.0f, 2.0f);
        Tensor w = random_tensor(Shape{s.C}, w_t, 21, 0.5f, 1.5f);
        Tensor y = Tensor::empty(x.shape(), x_t), rstd = Tensor::empty(Shape{s.rows}, DType::F32);
        rmsnorm_forward(y, rstd, x, w, 1e-5f);
        Tensor gx = on_gpu(x), gw = on_gpu(w);
        Tensor gy = Tensor::empty(x.shape(), x_t, Device::CUDA), grstd = Tensor::empty(Shape{s.rows}, DType::F32, Device::CUDA);
        rmsnorm_forward(gy, grstd, gx, gw, 1e-5f);
        // rstd: the fp32 sum of squares in another order: the file's reduction tolerance.
        expect_close(grstd, rstd, kRstdTolerance, what + " rstd");
        expect_close(gy, y, tol_for(x_t, 1e-5), what + " y");
        // In place (y aliases x) gives the same bits as out of place.
        rmsnorm_forward(gx, grstd, gx, gw, 1e-5f);
        expect_exact(gx, gy, what + " in place");
      }
}

TEST(GpuOpsRmsnorm, BackwardMatchesCpuWithDxAliasingDy) {
  use_gpu();
  for (const RowShape& s : kNormShapes)
    for (DType x_t : kFloatTypes)
      for (DType w_t : and_f32(x_t)) {
        const std::string what = fmt::format("rmsnorm_backward [{}, {}] x={} w={}", s.rows, s.C, name_of(x_t), name_of(w_t));
        Tensor x = random_tensor(Shape{s.rows, s.C}, x_t, 22, -2.0f, 2.0f);
        Tensor w = random_tensor(Shape{s.C}, w_t, 23, 0.5f, 1.5f);
        Tensor dy = random_tensor(x.shape(), x_t, 24);
        Tensor y = Tensor::empty(x.shape(), x_t), rstd = Tensor::empty(Shape{s.rows}, DType::F32);
        rmsnorm_forward(y, rstd, x, w, 1e-5f);
        Tensor dweight = random_tensor(Shape{s.C}, DType::F32, 25);  // accumulated into
        Tensor gx = on_gpu(x), gw = on_gpu(w), gdy = on_gpu(dy), grstd = on_gpu(rstd), gdweight = on_gpu(dweight);
        Tensor dx = Tensor::empty(x.shape(), x_t);
        rmsnorm_backward(dx, dweight, dy, x, w, rstd);
        Tensor gdx = Tensor::empty(x.shape(), x_t, Device::CUDA);
        rmsnorm_backward(gdx, gdweight, gdy, gx, gw, grstd);
        // dx: the row's dot product in another order; dweight: fp32 column sums in row chunks.
        expect_close(gdx, dx, tol_for(x_t, 1e-5), what + " dx");
        expect_close(gdweight, dweight, 1e-5, what + " dweight");
        // dx aliasing dy (the model's case): the same bits as out of place, and dweight adds the
        // same sum again.
        rmsnorm_backward(gdy, gdweight, gdy, gx, gw, grstd);
        expect_exact(gdy, gdx, what + " dx aliasing dy");
        Tensor twice = on_cpu(gdweight);
        Tensor cpu_twice = on_cpu(dweight.view());
        rmsnorm_backward(dx, cpu_twice, dy, x, w, rstd);
        expect_close(twice, cpu_twice, 1e-5, what + " dweight accumulated twice");
        // A frozen weight: no dweight, the same dx bits.
        Tensor gdx_frozen = Tensor::empty(x.shape(), x_t, Device::CUDA);
        rmsnorm_backward(gdx_frozen, TensorView{}, on_gpu(dy), gx, gw, grstd);
        expect_exact(gdx_frozen, gdx, what + " dx without dweight");
      }
}

// The layer's fused pairs (rmsnorm.h) against the CPU's pair of ops: rows that fit the vectorized
// kernels with 1, 2 and 4 chunks per thread (C 4096, 8192, 12288: the last partly filled), a narrow
// row (C 96: most threads idle), and rows they do not take (C 130, 7: the pair on the GPU). x2 is
// residual_add's exactly (the same two roundings); y, rstd and the gradient as the plain ops'
// tests state them.
constexpr RowShape kFusedNormShapes[] = {{37, 4096}, {5, 8192}, {3, 12288}, {9, 96}, {3, 130}, {2, 7}};

TEST(GpuOpsRmsnorm, ResidualRmsnormForwardMatchesThePair) {
  use_gpu();
  for (const RowShape& s : kFusedNormShapes)
    for (DType x_t : kFloatTypes)
      for (DType w_t : and_f32(x_t)) {
        const std::string what = fmt::format("residual_rmsnorm_forward [{}, {}] x={} w={}", s.rows, s.C, name_of(x_t), name_of(w_t));
        Tensor o = random_tensor(Shape{s.rows, s.C}, x_t, 40, -2.0f, 2.0f), res = random_tensor(o.shape(), x_t, 41, -2.0f, 2.0f);
        Tensor w = random_tensor(Shape{s.C}, w_t, 42, 0.5f, 1.5f);
        Tensor gx2 = on_gpu(o), gres = on_gpu(res), gw = on_gpu(w);
        Tensor y = Tensor::empty(o.shape(), x_t), rstd = Tensor::empty(Shape{s.rows}, DType::F32);
        residual_rmsnorm_forward(o, y, rstd, res, w, 1e-5f);  // o becomes x2
        Tensor gy = Tensor::empty(o.shape(), x_t, Device::CUDA), grstd = Tensor::empty(Shape{s.rows}, DType::F32, Device::CUDA);
        residual_rmsnorm_forward(gx2, gy, grstd, gres, gw, 1e-5f);
        expect_exact(gx2, o, what + " x2");
        expect_close(grstd, rstd, kRstdTolerance, what + " rstd");
        expect_close(gy, y, tol_for(x_t, 1e-5), what + " y");
      }
}

TEST(GpuOpsRmsnorm, BackwardAddMatchesThePair) {
  use_gpu();
  for (const RowShape& s : kFusedNormShapes)
    for (DType x_t : kFloatTypes)
      for (DType w_t : and_f32(x_t)) {
        const std::string what = fmt::format("rmsnorm_backward_add [{}, {}] x={} w={}", s.rows, s.C, name_of(x_t), name_of(w_t));
        Tensor x = random_tensor(Shape{s.rows, s.C}, x_t, 43, -2.0f, 2.0f), w = random_tensor(Shape{s.C}, w_t, 44, 0.5f, 1.5f);
        Tensor dy = random_tensor(x.shape(), x_t, 45), acc = random_tensor(x.shape(), x_t, 46);
        Tensor y = Tensor::empty(x.shape(), x_t), rstd = Tensor::empty(Shape{s.rows}, DType::F32);
        rmsnorm_forward(y, rstd, x, w, 1e-5f);
        Tensor gx = on_gpu(x), gw = on_gpu(w), gdy = on_gpu(dy), gacc = on_gpu(acc), grstd = on_gpu(rstd);
        rmsnorm_backward_add(acc, TensorView{}, dy, x, w, rstd);
        rmsnorm_backward_add(gacc, TensorView{}, gdy, gx, gw, grstd);
        expect_close(gacc, acc, tol_for(x_t, 1e-5), what + " d_acc");
      }
}

TEST(GpuOpsRmsnorm, Perf) {
  use_gpu();
  const int64_t rows = 4096, C = 4096;
  Tensor x = on_gpu(random_tensor(Shape{rows, C}, DType::BF16, 26)), w = on_gpu(random_tensor(Shape{C}, DType::BF16, 27));
  Tensor y = Tensor::empty(Shape{rows, C}, DType::BF16, Device::CUDA);
  Tensor rstd = Tensor::empty(Shape{rows}, DType::F32, Device::CUDA);
  report_perf("rmsnorm_forward bf16 rows=4096 C=4096", 2.0 * 2 * rows * C, 0, [&] { rmsnorm_forward(y, rstd, x, w, 1e-5f); });
  Tensor dy = on_gpu(random_tensor(Shape{rows, C}, DType::BF16, 28));
  Tensor dweight = Tensor::zeros(Shape{C}, DType::F32, Device::CUDA);
  report_perf("rmsnorm_backward bf16 rows=4096 C=4096 (dx aliasing dy)", 2.0 * 2 * 2 * rows * C + 2.0 * rows * C, 0,
              [&] { rmsnorm_backward(dy, dweight, dy, x, w, rstd); });
  // The layer's pairs: the fused op against the two ops (bytes: what the fused op moves).
  Tensor res = on_gpu(random_tensor(Shape{rows, C}, DType::BF16, 29)), acc = on_gpu(random_tensor(Shape{rows, C}, DType::BF16, 30));
  report_perf("residual_rmsnorm_forward bf16 rows=4096 C=4096", 2.0 * 4 * rows * C, 0,
              [&] { residual_rmsnorm_forward(x, y, rstd, res, w, 1e-5f); });
  report_perf("residual_add + rmsnorm_forward bf16 rows=4096 C=4096", 2.0 * 4 * rows * C, 0, [&] {
    residual_add(x, res, x);
    rmsnorm_forward(y, rstd, x, w, 1e-5f);
  });
  report_perf("rmsnorm_backward_add bf16 rows=4096 C=4096", 2.0 * 4 * rows * C, 0,
              [&] { rmsnorm_backward_add(acc, TensorView{}, dy, x, w, rstd); });
  report_perf("rmsnorm_backward + residual_add bf16 rows=4096 C=4096", 2.0 * 4 * rows * C, 0, [&] {
    rmsnorm_backward(dy, TensorView{}, dy, x, w, rstd);
    residual_add(acc, acc, dy);
  });
}

// ---------------------------------------------------------------------------------------------
// swiglu

constexpr RowShape kMlpShapes[] = {{1, 1}, {3, 1001}, {2048, 11008}};

TEST(GpuOpsSwiglu, ForwardMatchesCpu) {
  use_gpu();
  for (const RowShape& s : kMlpShapes)
    for (DType a_t : kFloatTypes)
      for (DType h_t : and_f32(a_t)) {
        const std::string what = fmt::format("swiglu_forward [{}, {}] act={} h={}", s.rows, s.C, name_of(a_t), name_of(h_t));
        Tensor gate = random_tensor(Shape{s.rows, s.C}, a_t, 30, -4.0f, 4.0f), up = random_tensor(gate.shape(), a_t, 31);
        Tensor h = Tensor::empty(gate.shape(), h_t);
        swiglu_forward(h, gate, up);
        Tensor ggate = on_gpu(gate), gup = on_gpu(up), gh = Tensor::empty(gate.shape(), h_t, Device::CUDA);
        swiglu_forward(gh, ggate, gup);
        expect_close(gh, h, tol_for(h_t, 1e-6), what);
        if (h_t == a_t) {  // h aliasing gate
          swiglu_forward(ggate, ggate, gup);
          expect_exact(ggate, gh, what + " h aliasing gate");
        }
      }
}

TEST(GpuOpsSwiglu, BackwardMatchesCpuWithDgateAliasingGate) {
  use_gpu();
  for (const RowShape& s : kMlpShapes)
    for (DType a_t : kFloatTypes)
      for (DType d_t : and_f32(a_t)) {
        if (s.rows * s.C > (1 << 20) && d_t != a_t) continue;  // 7B shape: the model's combinations only
        const std::string what = fmt::format("swiglu_backward [{}, {}] act={} grad={}", s.rows, s.C, name_of(a_t), name_of(d_t));
        Tensor gate = random_tensor(Shape{s.rows, s.C}, a_t, 32, -4.0f, 4.0f), up = random_tensor(gate.shape(), a_t, 33);
        Tensor dh = random_tensor(gate.shape(), d_t, 34);
        Tensor dgate = Tensor::empty(gate.shape(), d_t), dup = Tensor::empty(gate.shape(), d_t);
        swiglu_backward(dgate, dup, dh, gate, up);
        Tensor ggate = on_gpu(gate), gup = on_gpu(up), gdh = on_gpu(dh);
        Tensor gdgate = Tensor::empty(gate.shape(), d_t, Device::CUDA), gdup = Tensor::empty(gate.shape(), d_t, Device::CUDA);
        swiglu_backward(gdgate, gdup, gdh, ggate, gup);
        expect_close(gdgate, dgate, tol_for(d_t, 1e-6), what + " dgate");
        expect_close(gdup, dup, tol_for(d_t, 1e-6), what + " dup");
        if (d_t == a_t) {
          // dgate written into gate and dup into up (the model reuses the activation buffers).
          swiglu_backward(ggate, gup, gdh, ggate, gup);
          expect_exact(ggate, gdgate, what + " dgate aliasing gate");
          expect_exact(gup, gdup, what + " dup aliasing up");
        }
        // dgate aliasing dh.
        Tensor gdh2 = on_gpu(dh), gup2 = on_gpu(up), ggate2 = on_gpu(gate);
        Tensor gdup2 = Tensor::empty(gate.shape(), d_t, Device::CUDA);
        swiglu_backward(gdh2, gdup2, gdh2, ggate2, gup2);
        expect_exact(gdh2, gdgate, what + " dgate aliasing dh");
      }
}

// The 16-bit kernels (16-byte accesses where every array is 16-byte aligned) give the element
// kernels' bits: the same inputs one element into their buffers (2 bytes: not aligned) take the
// element kernels. n not a multiple of 8: the last chunk's elements one by one.
TEST(GpuOpsSwiglu, SixteenByteKernelsGiveTheElementKernelsBits) {
  use_gpu();
  const int64_t n = 3 * 11008 + 5;
  auto shifted = [](Tensor& t, int64_t count) {  // elements 1 .. count of t: 2 bytes in
    TensorView v = t.view();
    v.data = static_cast<char*>(v.data) + 2;
    v.shape = Shape{count};
    return v;
  };
  for (DType t : {DType::BF16, DType::F16}) {
    SCOPED_TRACE(name_of(t));
    const Tensor gate = random_tensor(Shape{n + 1}, t, 37, -4.0f, 4.0f), up = random_tensor(Shape{n + 1}, t, 38);
    const Tensor dh = random_tensor(Shape{n + 1}, t, 39);
    Tensor g = on_gpu(gate), u = on_gpu(up), d = on_gpu(dh);
    // Aligned: elements 0 .. n - 1 of fresh copies of elements 1 .. n.
    Tensor ga = on_gpu(Tensor::empty(Shape{n}, t)), ua = on_gpu(Tensor::empty(Shape{n}, t)), da = on_gpu(Tensor::empty(Shape{n}, t));
    copy_block(MatrixView(ga.view().reshaped(Shape{1, n})), MatrixView(shifted(g, n).reshaped(Shape{1, n})));
    copy_block(MatrixView(ua.view().reshaped(Shape{1, n})), MatrixView(shifted(u, n).reshaped(Shape{1, n})));
    copy_block(MatrixView(da.view().reshaped(Shape{1, n})), MatrixView(shifted(d, n).reshaped(Shape{1, n})));
    Tensor h_vec = Tensor::empty(Shape{n}, t, Device::CUDA), h_elem = Tensor::empty(Shape{n + 1}, t, Device::CUDA);
    swiglu_forward(h_vec, ga, ua);
    swiglu_forward(shifted(h_elem, n), shifted(g, n), shifted(u, n));
    EXPECT_EQ(test::values_of(h_vec.view()), test::values_of(shifted(h_elem, n)));
    Tensor dg_vec = Tensor::empty(Shape{n}, t, Device::CUDA), du_vec = Tensor::empty(Shape{n}, t, Device::CUDA);
    Tensor dg_elem = Tensor::empty(Shape{n + 1}, t, Device::CUDA), du_elem = Tensor::empty(Shape{n + 1}, t, Device::CUDA);
    swiglu_backward(dg_vec, du_vec, da, ga, ua);
    swiglu_backward(shifted(dg_elem, n), shifted(du_elem, n), shifted(d, n), shifted(g, n), shifted(u, n));
    EXPECT_EQ(test::values_of(dg_vec.view()), test::values_of(shifted(dg_elem, n)));
    EXPECT_EQ(test::values_of(du_vec.view()), test::values_of(shifted(du_elem, n)));
  }
}

TEST(GpuOpsSwiglu, Perf) {
  use_gpu();
  const int64_t n = int64_t{4096} * 11008;
  Tensor gate = on_gpu(random_tensor(Shape{n}, DType::BF16, 35)), up = on_gpu(random_tensor(Shape{n}, DType::BF16, 36));
  Tensor h = Tensor::empty(Shape{n}, DType::BF16, Device::CUDA);
  report_perf("swiglu_forward bf16 4096x11008", 3.0 * 2 * n, 0, [&] { swiglu_forward(h, gate, up); });
  report_perf("swiglu_backward bf16 4096x11008 (dgate into gate, dup into up)", 5.0 * 2 * n, 0,
              [&] { swiglu_backward(gate, up, h, gate, up); });
}

// ---------------------------------------------------------------------------------------------
// rope

struct RopeCase {
  int64_t B, T, heads, D, offset;
};
// Both kernels: D 2 and 10 take the narrow one; the rest the wide one (8 pairs of up to 8 heads a
// thread), 12 heads with a partial second group of heads.
constexpr RopeCase kRopeCases[] = {{1, 1, 1, 2, 0},     {2, 7, 3, 10, 0},      {1, 33, 5, 128, 3},
                                   {2, 19, 8, 64, 100}, {2, 9, 12, 16, 1},     {1, 4096, 32, 128, 0},
                                   {3, 65, 8, 128, 7}};

TEST(GpuOpsRope, ForwardAndBackwardMatchCpu) {
  use_gpu();
  RopeScalingParams llama3;
  llama3.type = RopeScalingParams::Type::Llama3;
  for (const RopeCase& c : kRopeCases)
    for (const bool scaled : {false, true}) {
      const RopeTable table = make_rope_table(c.D, c.offset + c.T + 5, scaled ? 500000.0 : 10000.0,
                                              scaled ? llama3 : RopeScalingParams{});
      for (DType t : kFloatTypes) {
        const std::string what =
            fmt::format("rope [{}, {}, {}, {}] offset {} {}{}", c.B, c.T, c.heads, c.D, c.offset, name_of(t), scaled ? " llama3" : "");
        Tensor x = random_tensor(Shape{c.B, c.T, c.heads, c.D}, t, 40);
        Tensor gx = on_gpu(x);
        rope_forward(x, table, c.offset);
        rope_forward(gx, table, c.offset);
        // The same fp32 tables and the same multiply/add roundings: equal up to an FMA the host
        // compiler might contract (it does not on x86-64 without -mfma).
        expect_close(gx, x, tol_for(t, 1e-6), what + " forward");
        rope_backward(x, table, c.offset);
        rope_backward(gx, table, c.offset);
        expect_close(gx, x, tol_for(t, 1e-6), what + " backward");
      }
    }
  // Positions past the table are a logic_error on the GPU too.
  const RopeTable table = make_rope_table(16, 8, 10000.0);
  Tensor gx = on_gpu(random_tensor(Shape{1, 8, 2, 16}, DType::F32, 41));
  EXPECT_NO_THROW(rope_forward(gx, table, 0));
  EXPECT_THROW(rope_forward(gx, table, 1), std::logic_error);
}

// Packed rows: per-token positions (each example restarts at 0), against the CPU.
TEST(GpuOpsRope, PerTokenPositionsMatchCpu) {
  use_gpu();
  for (const RopeCase& c : kRopeCases) {
    const RopeTable table = make_rope_table(c.D, c.offset + c.T + 5, 10000.0);
    Tensor positions = Tensor::empty(Shape{c.B, c.T}, DType::I32);
    for (int64_t b = 0; b < c.B; ++b)  // positions restart every few tokens, as examples of a packed row do
      for (int64_t t = 0; t < c.T; ++t) positions.data<int32_t>()[b * c.T + t] = static_cast<int32_t>(t % (b + 3 + 8 * (t / 50 % 3)));
    Tensor gpositions = on_gpu(positions);
    for (DType t : kFloatTypes) {
      const std::string what = fmt::format("rope positions [{}, {}, {}, {}] offset {} {}", c.B, c.T, c.heads, c.D,
                                           c.offset, name_of(t));
      Tensor x = random_tensor(Shape{c.B, c.T, c.heads, c.D}, t, 43);
      Tensor gx = on_gpu(x);
      rope_forward(x, table, c.offset, positions);
      rope_forward(gx, table, c.offset, gpositions);
      expect_close(gx, x, tol_for(t, 1e-6), what + " forward");
      rope_backward(x, table, c.offset, positions);
      rope_backward(gx, table, c.offset, gpositions);
      expect_close(gx, x, tol_for(t, 1e-6), what + " backward");
    }
  }
}

TEST(GpuOpsRope, Perf) {
  use_gpu();
  const RopeTable table = make_rope_table(128, 4096, 10000.0);
  Tensor q = on_gpu(random_tensor(Shape{1, 4096, 32, 128}, DType::BF16, 42));
  report_perf("rope_forward bf16 q [1, 4096, 32, 128]", 2.0 * 2 * q.numel(), 0, [&] { rope_forward(q, table, 0); });
  report_perf("rope_backward bf16 q [1, 4096, 32, 128]", 2.0 * 2 * q.numel(), 0, [&] { rope_backward(q, table, 0); });
}

// ---------------------------------------------------------------------------------------------
// embedding

struct EmbeddingCase {
  int64_t V, C, N;
};
constexpr EmbeddingCase kEmbeddingCases[] = {{1, 1, 1}, {37, 129, 19}, {5, 70, 200}, {32000, 4096, 2048}};

TEST(GpuOpsEmbedding, ForwardAndBackwardMatchCpuExactly) {
  use_gpu();
  // A gather and one conversion; the backward adds the tokens in order per column like the CPU.
  for (const EmbeddingCase& c : kEmbeddingCases) {
    Tensor ids = make_i32(random_ids(c.N, c.V, 50));  // V = 5, N = 200: many repeated ids
    Tensor gids = on_gpu(ids);
    for (DType table_t : kFloatTypes)
      for (DType out_t : and_f32(table_t)) {
        if (c.V * c.C > (1 << 20) && out_t != table_t) continue;  // 7B shape: the model's combinations only
        const std::string what = fmt::format("embedding V={} C={} N={} table={} out={}", c.V, c.C, c.N, name_of(table_t), name_of(out_t));
        Tensor table = random_tensor(Shape{c.V, c.C}, table_t, 51);
        Tensor out = Tensor::empty(Shape{c.N, c.C}, out_t);
        embedding_forward(out, ids, table);
        Tensor gtable = on_gpu(table), gout = Tensor::empty(Shape{c.N, c.C}, out_t, Device::CUDA);
        embedding_forward(gout, gids, gtable);
        expect_exact(gout, out, what + " forward");

        Tensor dout = random_tensor(Shape{c.N, c.C}, out_t, 52);
        Tensor dtable = random_tensor(Shape{c.V, c.C}, DType::F32, 53);  // accumulated into
        Tensor gdout = on_gpu(dout), gdtable = on_gpu(dtable);
        embedding_backward(dtable, ids, dout);
        embedding_backward(gdtable, gids, gdout);
        expect_exact(gdtable, dtable, what + " backward");
      }
  }
}

TEST(GpuOpsEmbedding, OutOfRangeIdIsTheCpusUserError) {
  use_gpu();
  const int64_t V = 10, C = 4;
  Tensor table = random_tensor(Shape{V, C}, DType::F32, 54);
  Tensor gtable = on_gpu(table);
  for (const std::vector<int32_t>& values : {std::vector<int32_t>{1, 2, 10, -1}, std::vector<int32_t>{-1, 3, 99, 0},
                                             std::vector<int32_t>{0, 0, 0, 0, 0, 0, 0, 2147483647}}) {
    Tensor ids = make_i32(values);
    Tensor gids = on_gpu(ids);
    const int64_t N = ids.numel();
    std::string cpu_message, gpu_message, cpu_back, gpu_back;
    Tensor out = Tensor::empty(Shape{N, C}, DType::F32), gout = Tensor::empty(Shape{N, C}, DType::F32, Device::CUDA);
    try { embedding_forward(out, ids, table); } catch (const UserError& e) { cpu_message = e.what(); }
    try { embedding_forward(gout, gids, gtable); } catch (const UserError& e) { gpu_message = e.what(); }
    EXPECT_FALSE(gpu_message.empty());
    EXPECT_EQ(gpu_message, cpu_message);
    Tensor dtable = Tensor::zeros(Shape{V, C}, DType::F32), gdtable = Tensor::zeros(Shape{V, C}, DType::F32, Device::CUDA);
    Tensor dout = random_tensor(Shape{N, C}, DType::F32, 55);
    Tensor gdout = on_gpu(dout);
    try { embedding_backward(dtable, ids, dout); } catch (const UserError& e) { cpu_back = e.what(); }
    try { embedding_backward(gdtable, gids, gdout); } catch (const UserError& e) { gpu_back = e.what(); }
    EXPECT_FALSE(gpu_back.empty());
    EXPECT_EQ(gpu_back, cpu_back);
    for (double v : values_of(gdtable)) ASSERT_EQ(v, 0.0) << "a rejected backward leaves dtable alone";
  }
}

TEST(GpuOpsEmbedding, Perf) {
  use_gpu();
  const int64_t V = 32000, C = 4096, N = 4096;
  Tensor ids = on_gpu(make_i32(random_ids(N, V, 56)));
  Tensor table = on_gpu(random_tensor(Shape{V, C}, DType::BF16, 57));
  Tensor out = Tensor::empty(Shape{N, C}, DType::BF16, Device::CUDA);
  report_perf("embedding_forward bf16 N=4096 C=4096 (with the id check)", 2.0 * 2 * N * C, 0,
              [&] { embedding_forward(out, ids, table); });
  Tensor dtable = Tensor::zeros(Shape{V, C}, DType::F32, Device::CUDA);
  report_perf("embedding_backward f32 += bf16 N=4096 C=4096 (with the id check)", (2.0 + 8.0) * N * C, 0,
              [&] { embedding_backward(dtable, ids, out); });
}

// ---------------------------------------------------------------------------------------------
// cross entropy

struct CeCase {
  int64_t B, T, V;
};
constexpr CeCase kCeCases[] = {{2, 5, 11}, {3, 17, 1031}, {1, 2048, 32000}, {2, 333, 32000}, {1, 48, 128256}};

// Random labels with about one in five ignored.
std::vector<int32_t> random_labels(int64_t n, int64_t V, uint32_t seed) {
  std::vector<int32_t> labels = random_ids(n, V, seed);
  std::mt19937 rng(seed + 1);
  for (int32_t& label : labels)
    if (rng() % 5 == 0) label = kIgnoreIndex;
  return labels;
}

TEST(GpuOpsCrossEntropy, LossAndGradientsMatchCpu) {
  use_gpu();
  for (const CeCase& c : kCeCases)
    for (DType t : kFloatTypes)
      for (DType g_t : and_f32(t)) {
        if (c.B * c.T * c.V > (1 << 20) && g_t != t) continue;  // 7B shapes: the model's combinations only
        const std::string what = fmt::format("cross_entropy B={} T={} V={} logits={} dlogits={}", c.B, c.T, c.V, name_of(t), name_of(g_t));
        const int64_t rows = c.B * c.T;
        Tensor logits = random_tensor(Shape{rows, c.V}, t, 60, -8.0f, 8.0f);
        Tensor labels = make_i32(random_labels(rows, c.V, 61));
        const int64_t count = cross_entropy_count_targets(labels, c.B, c.T);
        const float scale = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
        Tensor dlogits = Tensor::empty(logits.shape(), g_t);
        const CrossEntropyResult cpu = cross_entropy_forward_backward(logits, labels, c.B, c.T, dlogits, scale);
        Tensor glogits = on_gpu(logits), glabels = on_gpu(labels), gdlogits = Tensor::empty(logits.shape(), g_t, Device::CUDA);
        EXPECT_EQ(cross_entropy_count_targets(glabels, c.B, c.T), count) << what;
        const CrossEntropyResult gpu = cross_entropy_forward_backward(glogits, glabels, c.B, c.T, gdlogits, scale);
        EXPECT_EQ(gpu.count, cpu.count) << what;
        // Per-row fp32 losses (~log V) differ by a few fp32 ulps (sum order, online rescaling).
        EXPECT_LE(std::abs(gpu.loss_sum - cpu.loss_sum), 1e-5 * std::abs(cpu.loss_sum) + 1e-6) << what << ": gpu "
                                                                                              << gpu.loss_sum << " cpu " << cpu.loss_sum;
        expect_close(gdlogits, dlogits, tol_for(g_t, 1e-5), what + " dlogits");
        {  // The row op (no host round trip): the same kernel, so the same bits, its losses summed here.
          Tensor rows_dlogits = Tensor::empty(logits.shape(), g_t, Device::CUDA);
          Tensor row_loss = Tensor::empty(Shape{rows}, DType::F32, Device::CUDA);
          cross_entropy_rows_forward_backward(glogits, labels, glabels, c.B, c.T, rows_dlogits, scale, row_loss);
          const std::vector<double> loss = values_of(row_loss);
          const int32_t* label = labels.data<int32_t>();
          double sum = 0.0;
          for (int64_t row = 0; row < rows; ++row)
            if (row % c.T + 1 < c.T && label[row + 1] != kIgnoreIndex) sum += loss[static_cast<size_t>(row)];
          EXPECT_EQ(sum, gpu.loss_sum) << what << " row op";
          expect_exact(rows_dlogits, gdlogits, what + " row op's dlogits");
        }
        if (g_t == t) {  // dlogits into the logits buffer (the model's case): the same bits
          const CrossEntropyResult again = cross_entropy_forward_backward(glogits, glabels, c.B, c.T, glogits, scale);
          EXPECT_EQ(again.loss_sum, gpu.loss_sum) << what << " aliased";
          expect_exact(glogits, gdlogits, what + " dlogits aliasing logits");
        }
      }
}

TEST(GpuOpsCrossEntropy, FullyIgnoredBatchGivesZeros) {
  use_gpu();
  const int64_t B = 2, T = 4, V = 50;
  Tensor logits = on_gpu(random_tensor(Shape{B * T, V}, DType::BF16, 62));
  Tensor labels = on_gpu(make_i32(std::vector<int32_t>(B * T, kIgnoreIndex)));
  const float inf_scale = 1.0f / static_cast<float>(cross_entropy_count_targets(labels, B, T));  // 1/0
  const CrossEntropyResult r = cross_entropy_forward_backward(logits, labels, B, T, logits, inf_scale);
  EXPECT_EQ(r.count, 0);
  EXPECT_EQ(r.loss_sum, 0.0);
  for (double v : values_of(logits)) ASSERT_EQ(v, 0.0);
}

TEST(GpuOpsCrossEntropy, BadLabelIsTheCpusUserError) {
  use_gpu();
  const int64_t B = 2, T = 4, V = 11;
  Tensor logits = random_tensor(Shape{B * T, V}, DType::F32, 63);
  for (int32_t bad : {11, -1, -101}) {
    std::vector<int32_t> values = {1, 2, 3, 4, 5, 6, 7, 8};
    values[6] = bad;
    Tensor labels = make_i32(values);
    Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
    Tensor glogits = on_gpu(logits), glabels = on_gpu(labels), gdlogits = Tensor::empty(logits.shape(), DType::F32, Device::CUDA);
    std::string cpu_message, gpu_message;
    try { cross_entropy_forward_backward(logits, labels, B, T, dlogits, 1.0f); } catch (const UserError& e) { cpu_message = e.what(); }
    try { cross_entropy_forward_backward(glogits, glabels, B, T, gdlogits, 1.0f); } catch (const UserError& e) { gpu_message = e.what(); }
    EXPECT_FALSE(gpu_message.empty()) << bad;
    EXPECT_EQ(gpu_message, cpu_message);
  }
}

TEST(GpuOpsCrossEntropy, Perf) {
  use_gpu();
  const int64_t B = 1, T = 2048, V = 32000;
  Tensor logits = on_gpu(random_tensor(Shape{B * T, V}, DType::BF16, 64, -8.0f, 8.0f));
  Tensor labels = on_gpu(make_i32(random_labels(B * T, V, 65)));
  report_perf("cross_entropy bf16 N=2048 V=32000 (dlogits into logits, with the host round trips)",
              2.0 * 3 * B * T * V, 0, [&] { (void)cross_entropy_forward_backward(logits, labels, B, T, logits, 1e-3f); });
}

}  // namespace
}  // namespace fsdpq
