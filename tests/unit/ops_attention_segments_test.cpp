// Attention over packed rows (segment_start, ops/attention.h): each example of a row attends only
// to its own earlier tokens, exactly as if it were alone in its row.
#include "ops/attention.h"
#include "ops_test_support.h"

#include <gtest/gtest.h>

#include <cstring>

namespace fsdpq {
namespace {

using test::random_tensor;
using test::to_doubles;

// segment_start [B, T] of rows made of examples of the given lengths (each row's lengths sum to T).
Tensor segment_starts(const std::vector<std::vector<int>>& rows, int64_t T) {
  Tensor starts = Tensor::empty(Shape{static_cast<int64_t>(rows.size()), T}, DType::I32);
  int32_t* s = starts.data<int32_t>();
  for (size_t b = 0; b < rows.size(); ++b) {
    int32_t at = 0;
    for (int len : rows[b]) {
      for (int i = 0; i < len; ++i) s[static_cast<int64_t>(b) * T + at + i] = at;
      at += len;
    }
    EXPECT_EQ(at, T) << "row " << b << " of the test's own layout";
  }
  return starts;
}

struct Pass {
  Tensor q, k, v, dout, out, lse, dq, dk, dv;
  Pass(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, uint32_t seed)
      : q(random_tensor(Shape{B, T, H, D}, DType::F32, seed, -2.0f, 2.0f)),
        k(random_tensor(Shape{B, T, KV, D}, DType::F32, seed + 1, -2.0f, 2.0f)),
        v(random_tensor(Shape{B, T, KV, D}, DType::F32, seed + 2)),
        dout(random_tensor(Shape{B, T, H, D}, DType::F32, seed + 3)),
        out(Tensor::empty(Shape{B, T, H, D}, DType::F32)),
        lse(Tensor::empty(Shape{B, H, T}, DType::F32)),
        dq(Tensor::empty(Shape{B, T, H, D}, DType::F32)),
        dk(Tensor::empty(Shape{B, T, KV, D}, DType::F32)),
        dv(Tensor::empty(Shape{B, T, KV, D}, DType::F32)) {}
  void run(const TensorView& segment_start = {}) {
    attention_forward(out, lse, q, k, v, segment_start);
    attention_backward(dq, dk, dv, dout, q, k, v, out, lse, segment_start);
  }
};

// Tokens [t0, t0 + n) of row b of a [B, T, heads, D] tensor into row 0 of `single` ([1, n, heads, D]),
// or back with `to_packed`.
void copy_tokens(Tensor& packed, Tensor& single, int64_t b, int64_t t0, int64_t n, bool to_packed) {
  const int64_t T = packed.shape()[1], width = packed.shape()[2] * packed.shape()[3];
  float* p = packed.data<float>() + (b * T + t0) * width;
  float* s = single.data<float>();
  const size_t bytes = sizeof(float) * static_cast<size_t>(n * width);
  to_packed ? std::memcpy(p, s, bytes) : std::memcpy(s, p, bytes);
}

TEST(OpsAttentionSegments, EachExampleOfAPackedRowComputesAsIfAlone) {
  const int64_t T = 10, H = 4, KV = 2, D = 8;
  // Row 0: four examples; row 1: one example over the whole row; row 2: an example, then padding
  // slots as one-token segments.
  const std::vector<std::vector<int>> rows = {{3, 4, 1, 2}, {10}, {6, 1, 1, 1, 1}};
  const Tensor starts = segment_starts(rows, T);
  Pass packed(3, T, H, KV, D, 71);
  packed.run(starts);

  for (size_t b = 0; b < rows.size(); ++b) {
    int64_t t0 = 0;
    for (int len : rows[b]) {
      Pass alone(1, len, H, KV, D, 1);
      copy_tokens(packed.q, alone.q, static_cast<int64_t>(b), t0, len, false);
      copy_tokens(packed.k, alone.k, static_cast<int64_t>(b), t0, len, false);
      copy_tokens(packed.v, alone.v, static_cast<int64_t>(b), t0, len, false);
      copy_tokens(packed.dout, alone.dout, static_cast<int64_t>(b), t0, len, false);
      alone.run();
      // The same sums in the same order: equal bits, not merely close values.
      for (auto [packed_tensor, alone_tensor] :
           {std::pair{&packed.out, &alone.out}, {&packed.dq, &alone.dq}, {&packed.dk, &alone.dk}, {&packed.dv, &alone.dv}}) {
        Tensor slice = Tensor::empty(alone_tensor->shape(), DType::F32);
        copy_tokens(*packed_tensor, slice, static_cast<int64_t>(b), t0, len, false);
        EXPECT_EQ(to_doubles(slice), to_doubles(*alone_tensor)) << "row " << b << " example at " << t0;
      }
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < len; ++t)
          EXPECT_EQ(packed.lse.data<float>()[(static_cast<int64_t>(b) * H + h) * T + t0 + t],
                    alone.lse.data<float>()[h * len + t]);
      t0 += len;
    }
  }
}

TEST(OpsAttentionSegments, AnotherExampleInTheRowDoesNotChangeATokensOutput) {
  const int64_t T = 12, H = 2, KV = 1, D = 8;
  const Tensor starts = segment_starts({{5, 7}}, T);
  Pass first(1, T, H, KV, D, 72), second(1, T, H, KV, D, 72);
  // The second example (tokens 5..11) differs; the first (0..4) does not.
  Pass other(1, 7, H, KV, D, 99);
  copy_tokens(second.q, other.q, 0, 5, 7, true);
  copy_tokens(second.k, other.k, 0, 5, 7, true);
  copy_tokens(second.v, other.v, 0, 5, 7, true);
  first.run(starts);
  second.run(starts);
  const int64_t width = H * D;
  for (int64_t t = 0; t < T; ++t) {
    bool same = true;
    for (int64_t i = 0; i < width; ++i) same &= first.out.data<float>()[t * width + i] == second.out.data<float>()[t * width + i];
    EXPECT_EQ(same, t < 5) << "token " << t;
  }
  // Backward: the first example's gradients ignore the second example's tokens too.
  for (int64_t i = 0; i < 5 * width; ++i) EXPECT_EQ(first.dq.data<float>()[i], second.dq.data<float>()[i]);
  for (int64_t i = 0; i < 5 * KV * D; ++i) EXPECT_EQ(first.dk.data<float>()[i], second.dk.data<float>()[i]);
}

TEST(OpsAttentionSegments, WithoutSegmentsIsPlainCausalAttention) {
  Pass plain(2, 9, 4, 2, 8, 73), whole(2, 9, 4, 2, 8, 73);
  plain.run();
  whole.run(segment_starts({{9}, {9}}, 9));  // one example per row: every start 0
  EXPECT_EQ(to_doubles(plain.out), to_doubles(whole.out));
  EXPECT_EQ(to_doubles(plain.dk), to_doubles(whole.dk));
}

TEST(OpsAttentionSegments, BackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 7, H = 4, KV = 2, D = 4;
  const Tensor starts = segment_starts({{3, 4}, {2, 2, 3}}, T);
  Pass p(B, T, H, KV, D, 74);
  const std::vector<double> w = test::random_weights(p.out.numel(), 75);
  auto loss = [&] {
    attention_forward(p.out, p.lse, p.q, p.k, p.v, starts);
    return test::weighted_sum(p.out, w);
  };
  const std::vector<double> numeric_dq = test::numerical_gradient(p.q, loss, 1e-2f);
  const std::vector<double> numeric_dk = test::numerical_gradient(p.k, loss, 1e-2f);
  const std::vector<double> numeric_dv = test::numerical_gradient(p.v, loss, 1e-2f);
  for (int64_t i = 0; i < p.out.numel(); ++i) p.dout.data<float>()[i] = static_cast<float>(w[static_cast<size_t>(i)]);
  p.run(starts);
  EXPECT_LE(test::relative_error(to_doubles(p.dq), numeric_dq), 1e-3);
  EXPECT_LE(test::relative_error(to_doubles(p.dk), numeric_dk), 1e-3);
  EXPECT_LE(test::relative_error(to_doubles(p.dv), numeric_dv), 1e-3);
}

TEST(OpsAttentionSegments, BadSegmentStartsAreLogicErrors) {
  Pass p(1, 4, 2, 1, 8, 76);
  Tensor starts = segment_starts({{2, 2}}, 4);
  starts.data<int32_t>()[1] = 2;  // token 1 cannot start at 2: that is after it
  EXPECT_THROW(attention_forward(p.out, p.lse, p.q, p.k, p.v, starts), std::logic_error);
  starts.data<int32_t>()[1] = -1;
  EXPECT_THROW(attention_forward(p.out, p.lse, p.q, p.k, p.v, starts), std::logic_error);
  const Tensor wrong_shape = Tensor::empty(Shape{1, 3}, DType::I32);
  EXPECT_THROW(attention_forward(p.out, p.lse, p.q, p.k, p.v, wrong_shape), std::logic_error);
  const Tensor wrong_type = Tensor::empty(Shape{1, 4}, DType::F32);
  EXPECT_THROW(attention_backward(p.dq, p.dk, p.dv, p.dout, p.q, p.k, p.v, p.out, p.lse, wrong_type),
               std::logic_error);
}

}  // namespace
}  // namespace fsdpq
