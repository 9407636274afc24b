#include "ops/swiglu.h"
#include "ops_test_support.h"

#include <gtest/gtest.h>

#include <cmath>

namespace fsdpq {
namespace {

using test::random_tensor;
using test::to_doubles;

TEST(OpsSwiglu, ForwardMatchesNaiveFormula) {
  Tensor gate = random_tensor(Shape{3, 50}, DType::F32, 51, -6.0f, 6.0f);
  Tensor up = random_tensor(Shape{3, 50}, DType::F32, 52, -2.0f, 2.0f);
  Tensor h = Tensor::empty(gate.shape(), DType::F32);
  swiglu_forward(h, gate, up);
  const std::vector<double> g = to_doubles(gate), u = to_doubles(up), got = to_doubles(h);
  for (size_t i = 0; i < g.size(); ++i) {
    const double want = g[i] / (1.0 + std::exp(-g[i])) * u[i];
    EXPECT_NEAR(got[i], want, 1e-6 * (1.0 + std::abs(want))) << i;
  }
}

TEST(OpsSwiglu, Bf16IsTheFp32ResultRoundedOnce) {
  Tensor gate = random_tensor(Shape{4, 33}, DType::BF16, 53, -4.0f, 4.0f);
  Tensor up = random_tensor(Shape{4, 33}, DType::BF16, 54);
  Tensor h16 = Tensor::empty(gate.shape(), DType::BF16), h32 = Tensor::empty(gate.shape(), DType::F32);
  swiglu_forward(h16, gate, up);
  swiglu_forward(h32, gate, up);  // same bf16 inputs, fp32 output
  for (int64_t i = 0; i < gate.numel(); ++i) EXPECT_EQ(load_f32(h16.view(), i), round_bf16(h32.data<float>()[i]));
}

TEST(OpsSwiglu, BackwardMatchesFiniteDifferences) {
  Tensor gate = random_tensor(Shape{2, 24}, DType::F32, 55, -4.0f, 4.0f);
  Tensor up = random_tensor(Shape{2, 24}, DType::F32, 56);
  Tensor h = Tensor::empty(gate.shape(), DType::F32);
  const std::vector<double> w = test::random_weights(h.numel(), 57);
  auto loss = [&] {
    swiglu_forward(h, gate, up);
    return test::weighted_sum(h, w);
  };
  const std::vector<double> numeric_gate = test::numerical_gradient(gate, loss, 1e-2f);
  const std::vector<double> numeric_up = test::numerical_gradient(up, loss, 1e-2f);
  Tensor dh = Tensor::empty(h.shape(), DType::F32);
  for (int64_t i = 0; i < h.numel(); ++i) dh.data<float>()[i] = static_cast<float>(w[static_cast<size_t>(i)]);
  Tensor dgate = Tensor::empty(h.shape(), DType::F32), dup = Tensor::empty(h.shape(), DType::F32);
  swiglu_backward(dgate, dup, dh, gate, up);
  EXPECT_LE(test::relative_error(to_doubles(dgate), numeric_gate), 1e-3);
  EXPECT_LE(test::relative_error(to_doubles(dup), numeric_up), 1e-4);

  // In place: the gradients may overwrite the activations they are computed from.
  Tensor dgate2 = Tensor::empty(h.shape(), DType::F32), dup2 = Tensor::empty(h.shape(), DType::F32);
  std::copy(gate.data<float>(), gate.data<float>() + gate.numel(), dgate2.data<float>());
  std::copy(up.data<float>(), up.data<float>() + up.numel(), dup2.data<float>());
  swiglu_backward(dgate2, dup2, dh, dgate2, dup2);
  EXPECT_EQ(to_doubles(dgate2), to_doubles(dgate));
  EXPECT_EQ(to_doubles(dup2), to_doubles(dup));
}

}  // namespace
}  // namespace fsdpq
