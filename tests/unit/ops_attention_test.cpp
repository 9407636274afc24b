#include "ops/attention.h"
#include "ops_test_support.h"

#include <gtest/gtest.h>

#include <cmath>

namespace fsdpq {
namespace {

using test::random_tensor;
using test::to_doubles;

struct Reference {
  std::vector<double> out, lse;
};

// Causal softmax(q kᵀ / sqrt(D)) v in double, query head h reading kv head h / (H / KV).
Reference naive_attention(const TensorView& q, const TensorView& k, const TensorView& v) {
  const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], D = q.shape[3], KV = k.shape[2];
  const std::vector<double> qd = to_doubles(q), kd = to_doubles(k), vd = to_doubles(v);
  Reference ref{std::vector<double>(qd.size(), 0.0), std::vector<double>(static_cast<size_t>(B * H * T))};
  auto at = [&](int64_t b, int64_t t, int64_t heads, int64_t h) { return static_cast<size_t>(((b * T + t) * heads + h) * D); };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / (H / KV);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<double> s(static_cast<size_t>(t + 1));
        double m = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0.0;
          for (int64_t i = 0; i < D; ++i) dot += qd[at(b, t, H, h) + i] * kd[at(b, j, KV, kvh) + i];
          s[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(D));
          m = std::max(m, s[static_cast<size_t>(j)]);
        }
        double sum = 0.0;
        for (double& e : s) sum += (e = std::exp(e - m));
        for (int64_t j = 0; j <= t; ++j)
          for (int64_t i = 0; i < D; ++i)
            ref.out[at(b, t, H, h) + i] += s[static_cast<size_t>(j)] / sum * vd[at(b, j, KV, kvh) + i];
        ref.lse[static_cast<size_t>((b * H + h) * T + t)] = m + std::log(sum);
      }
    }
  return ref;
}

struct Inputs {
  Tensor q, k, v;
};

Inputs make_inputs(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D, DType dtype, uint32_t seed) {
  return Inputs{random_tensor(Shape{B, T, H, D}, dtype, seed, -2.0f, 2.0f),
                random_tensor(Shape{B, T, KV, D}, dtype, seed + 1, -2.0f, 2.0f),
                random_tensor(Shape{B, T, KV, D}, dtype, seed + 2)};
}

TEST(OpsAttention, ForwardMatchesNaiveForMhaGqaAndMqa) {
  const int64_t B = 2, T = 9, H = 4, D = 16;
  for (int64_t KV : {4, 2, 1}) {
    Inputs in = make_inputs(B, T, H, KV, D, DType::F32, 41);
    Tensor out = Tensor::empty(in.q.shape(), DType::F32);
    Tensor lse = Tensor::empty(Shape{B, H, T}, DType::F32);
    attention_forward(out, lse, in.q, in.k, in.v);
    const Reference ref = naive_attention(in.q, in.k, in.v);
    EXPECT_LE(test::max_abs_diff(to_doubles(out), ref.out), 2e-6) << "KV=" << KV;
    EXPECT_LE(test::max_abs_diff(to_doubles(lse), ref.lse), 2e-6) << "KV=" << KV;
  }
}

TEST(OpsAttention, ForwardBf16WithinBf16Rounding) {
  const int64_t B = 1, T = 12, H = 4, KV = 2, D = 32;
  Inputs in = make_inputs(B, T, H, KV, D, DType::BF16, 42);
  Tensor out = Tensor::empty(in.q.shape(), DType::BF16);
  Tensor lse = Tensor::empty(Shape{B, H, T}, DType::F32);
  attention_forward(out, lse, in.q, in.k, in.v);
  const Reference ref = naive_attention(in.q, in.k, in.v);  // from the same bf16 inputs
  const std::vector<double> got = to_doubles(out);
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(test::within_bf16_ulps(got[i], ref.out[i], 1.0) || std::abs(got[i] - ref.out[i]) < 1e-5)
        << i << ": " << got[i] << " vs " << ref.out[i];
}

TEST(OpsAttention, GqaQueryHeadsReadTheirGroupsKvHead) {
  // H = 4, KV = 2: heads 0, 1 read kv head 0; heads 2, 3 read kv head 1.
  const int64_t B = 1, T = 6, H = 4, KV = 2, D = 8;
  Inputs in = make_inputs(B, T, H, KV, D, DType::F32, 43);
  Tensor out1 = Tensor::empty(in.q.shape(), DType::F32), out2 = Tensor::empty(in.q.shape(), DType::F32);
  Tensor lse = Tensor::empty(Shape{B, H, T}, DType::F32);
  attention_forward(out1, lse, in.q, in.k, in.v);
  for (int64_t t = 0; t < T; ++t)  // change kv head 0 only
    for (int64_t i = 0; i < D; ++i) {
      in.k.data<float>()[(t * KV + 0) * D + i] += 0.5f;
      in.v.data<float>()[(t * KV + 0) * D + i] -= 0.25f;
    }
  attention_forward(out2, lse, in.q, in.k, in.v);
  for (int64_t h = 0; h < H; ++h) {
    bool changed = false;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < D; ++i) {
        const int64_t at = (t * H + h) * D + i;
        changed |= out1.data<float>()[at] != out2.data<float>()[at];
      }
    EXPECT_EQ(changed, h < 2) << "head " << h;
  }
}

TEST(OpsAttention, FutureTokensDoNotChangeEarlierOutputs) {
  const int64_t B = 2, T = 8, H = 4, KV = 2, D = 8, changed_position = 5;
  Inputs in = make_inputs(B, T, H, KV, D, DType::F32, 44);
  Tensor out1 = Tensor::empty(in.q.shape(), DType::F32), out2 = Tensor::empty(in.q.shape(), DType::F32);
  Tensor lse = Tensor::empty(Shape{B, H, T}, DType::F32);
  attention_forward(out1, lse, in.q, in.k, in.v);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t i = 0; i < H * D; ++i) in.q.data<float>()[(b * T + changed_position) * H * D + i] *= -1.5f;
    for (int64_t i = 0; i < KV * D; ++i) {
      in.k.data<float>()[(b * T + changed_position) * KV * D + i] += 1.0f;
      in.v.data<float>()[(b * T + changed_position) * KV * D + i] += 1.0f;
    }
  }
  attention_forward(out2, lse, in.q, in.k, in.v);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H * D; ++i) {
        const int64_t at = (b * T + t) * H * D + i;
        if (t < changed_position)
          EXPECT_EQ(out1.data<float>()[at], out2.data<float>()[at]) << "b " << b << " t " << t;
        else
          EXPECT_NE(out1.data<float>()[at], out2.data<float>()[at]) << "b " << b << " t " << t;
      }
}

TEST(OpsAttention, BackwardMatchesFiniteDifferences) {
  const int64_t B = 2, T = 5, H = 4, KV = 2, D = 4;
  Inputs in = make_inputs(B, T, H, KV, D, DType::F32, 45);
  Tensor out = Tensor::empty(in.q.shape(), DType::F32);
  Tensor lse = Tensor::empty(Shape{B, H, T}, DType::F32);
  const std::vector<double> w = test::random_weights(out.numel(), 46);
  auto loss = [&] {
    attention_forward(out, lse, in.q, in.k, in.v);
    return test::weighted_sum(out, w);
  };
  const std::vector<double> numeric_dq = test::numerical_gradient(in.q, loss, 1e-2f);
  const std::vector<double> numeric_dk = test::numerical_gradient(in.k, loss, 1e-2f);
  const std::vector<double> numeric_dv = test::numerical_gradient(in.v, loss, 1e-2f);

  attention_forward(out, lse, in.q, in.k, in.v);
  Tensor dout = Tensor::empty(out.shape(), DType::F32);
  for (int64_t i = 0; i < out.numel(); ++i) dout.data<float>()[i] = static_cast<float>(w[static_cast<size_t>(i)]);
  Tensor dq = Tensor::empty(in.q.shape(), DType::F32);
  Tensor dk = Tensor::empty(in.k.shape(), DType::F32), dv = Tensor::empty(in.v.shape(), DType::F32);
  attention_backward(dq, dk, dv, dout, in.q, in.k, in.v, out, lse);
  EXPECT_LE(test::relative_error(to_doubles(dq), numeric_dq), 1e-3);
  EXPECT_LE(test::relative_error(to_doubles(dk), numeric_dk), 1e-3);
  EXPECT_LE(test::relative_error(to_doubles(dv), numeric_dv), 1e-3);
}

TEST(OpsAttention, MismatchedHeadsAreALogicError) {
  Inputs in = make_inputs(1, 4, 3, 2, 8, DType::F32, 47);  // 3 query heads over 2 kv heads
  Tensor out = Tensor::empty(in.q.shape(), DType::F32);
  Tensor lse = Tensor::empty(Shape{1, 3, 4}, DType::F32);
  EXPECT_THROW(attention_forward(out, lse, in.q, in.k, in.v), std::logic_error);
}

// attention_rope_backward on the CPU is its two steps (attention_backward, then rope_backward on dq
// and dk), bit for bit, with and without per-token positions; a position offset past the table is
// refused, naming the op.
TEST(OpsAttention, RopeBackwardIsTheTwoStepsOnTheCpu) {
  const int64_t B = 2, T = 5, H = 4, KV = 2, D = 8;
  const Tensor q = random_tensor(Shape{B, T, H, D}, DType::F32, 130), k = random_tensor(Shape{B, T, KV, D}, DType::F32, 131);
  const Tensor v = random_tensor(Shape{B, T, KV, D}, DType::F32, 132), dout = random_tensor(Shape{B, T, H, D}, DType::F32, 133);
  Tensor out = Tensor::empty(q.shape(), DType::F32), lse = Tensor::empty(Shape{B, H, T}, DType::F32);
  attention_forward(out, lse, q, k, v);
  const RopeTable table = make_rope_table(D, 64, 10000.0);
  Tensor positions = Tensor::empty(Shape{B, T}, DType::I32);
  for (int64_t i = 0; i < B * T; ++i) positions.data<int32_t>()[i] = static_cast<int32_t>((i * 3) % 7);
  for (bool per_token : {false, true}) {
    const TensorView pos = per_token ? positions.view() : TensorView{};
    Tensor dq = Tensor::empty(q.shape(), DType::F32), dk = Tensor::empty(k.shape(), DType::F32);
    Tensor dv = Tensor::empty(v.shape(), DType::F32);
    attention_backward(dq, dk, dv, dout, q, k, v, out, lse);
    rope_backward(dq, table, 2, pos);
    rope_backward(dk, table, 2, pos);
    Tensor dq2 = Tensor::empty(q.shape(), DType::F32), dk2 = Tensor::empty(k.shape(), DType::F32);
    Tensor dv2 = Tensor::empty(v.shape(), DType::F32);
    attention_rope_backward(dq2, dk2, dv2, dout, q, k, v, out, lse, table, 2, pos);
    EXPECT_EQ(to_doubles(dq2), to_doubles(dq));
    EXPECT_EQ(to_doubles(dk2), to_doubles(dk));
    EXPECT_EQ(to_doubles(dv2), to_doubles(dv));
  }
  Tensor dq = Tensor::empty(q.shape(), DType::F32), dk = Tensor::empty(k.shape(), DType::F32);
  Tensor dv = Tensor::empty(v.shape(), DType::F32);
  try {
    attention_rope_backward(dq, dk, dv, dout, q, k, v, out, lse, table, 62, TensorView{});
    FAIL() << "an offset past the table was taken";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("attention_rope_backward"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace fsdpq
