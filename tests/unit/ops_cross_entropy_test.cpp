#include "ops/cross_entropy.h"
#include "ops_test_support.h"
#include "util/error.h"

#include <gtest/gtest.h>

#include <cmath>

namespace fsdpq {
namespace {

using test::random_tensor;
using test::to_doubles;

Tensor make_labels(std::vector<int32_t> values) {
  Tensor labels = Tensor::empty(Shape{static_cast<int64_t>(values.size())}, DType::I32);
  std::copy(values.begin(), values.end(), labels.data<int32_t>());
  return labels;
}

struct NaiveLoss {
  double sum = 0.0;
  int64_t count = 0;
  std::vector<double> grad;  // softmax - onehot (unscaled), 0 for rows that do not count
};

NaiveLoss naive_cross_entropy(const TensorView& logits, const TensorView& labels, int64_t B, int64_t T) {
  const int64_t V = logits.shape.last();
  const std::vector<double> z = to_doubles(logits);
  NaiveLoss result;
  result.grad.assign(z.size(), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t + 1 < T; ++t) {
      const int32_t target = labels.as<const int32_t>()[b * T + t + 1];
      if (target == kIgnoreIndex) continue;
      const size_t row = static_cast<size_t>((b * T + t) * V);
      double m = -1e300, s = 0.0;
      for (int64_t i = 0; i < V; ++i) m = std::max(m, z[row + i]);
      for (int64_t i = 0; i < V; ++i) s += std::exp(z[row + i] - m);
      result.sum += m + std::log(s) - z[row + static_cast<size_t>(target)];
      ++result.count;
      for (int64_t i = 0; i < V; ++i) result.grad[row + i] = std::exp(z[row + i] - m) / s - (i == target ? 1.0 : 0.0);
    }
  return result;
}

// Two sequences of 5; -100 marks the prompt and the padding.
const std::vector<int32_t> kLabels = {-100, -100, 3, 7, 10, /**/ -100, 0, 5, -100, -100};
constexpr int64_t kB = 2, kT = 5, kV = 11;

TEST(OpsCrossEntropy, ShiftedLossIgnoresMaskedLabelsAndMatchesNaive) {
  Tensor logits = random_tensor(Shape{kB * kT, kV}, DType::F32, 91, -4.0f, 4.0f);
  Tensor labels = make_labels(kLabels);
  const NaiveLoss want = naive_cross_entropy(logits, labels, kB, kT);
  ASSERT_EQ(want.count, 5);  // 3, 7, 10 in the first sequence; 0, 5 in the second
  EXPECT_EQ(cross_entropy_count_targets(labels, kB, kT), 5);

  Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
  const float grad_scale = 1.0f / 5.0f;
  const CrossEntropyResult got = cross_entropy_forward_backward(logits, labels, kB, kT, dlogits, grad_scale);
  EXPECT_EQ(got.count, 5);
  EXPECT_NEAR(got.loss_sum, want.sum, 1e-5 * want.sum);
  EXPECT_NEAR(got.mean(), want.sum / 5.0, 1e-5 * want.sum);
  const std::vector<double> grad = to_doubles(dlogits);
  for (size_t i = 0; i < grad.size(); ++i) EXPECT_NEAR(grad[i], grad_scale * want.grad[i], 1e-7) << i;
  // Rows with nothing to predict (last position, or next label ignored) have exactly zero gradient.
  for (int64_t row : {0, 4, 7, 8, 9})
    for (int64_t i = 0; i < kV; ++i) EXPECT_EQ(grad[static_cast<size_t>(row * kV + i)], 0.0) << row;
}

TEST(OpsCrossEntropy, FullyIgnoredBatchGivesZeroLossAndGradientsWithoutNaN) {
  Tensor logits = random_tensor(Shape{kB * kT, kV}, DType::BF16, 92);
  Tensor labels = make_labels(std::vector<int32_t>(kB * kT, kIgnoreIndex));
  const float grad_scale = 1.0f / static_cast<float>(cross_entropy_count_targets(labels, kB, kT));  // +inf
  const CrossEntropyResult got = cross_entropy_forward_backward(logits, labels, kB, kT, logits, grad_scale);
  EXPECT_EQ(got.count, 0);
  EXPECT_EQ(got.loss_sum, 0.0);
  EXPECT_EQ(got.mean(), 0.0);
  for (double g : to_doubles(logits)) EXPECT_EQ(g, 0.0);
}

TEST(OpsCrossEntropy, InPlaceGradientsAndBf16Logits) {
  Tensor logits = random_tensor(Shape{kB, kT, kV}, DType::BF16, 93, -4.0f, 4.0f);
  Tensor labels = make_labels(kLabels);
  const NaiveLoss want = naive_cross_entropy(logits, labels, kB, kT);  // from the bf16 values
  Tensor separate = Tensor::empty(logits.shape(), DType::BF16);
  const CrossEntropyResult a = cross_entropy_forward_backward(logits, labels, kB, kT, separate, 1.0f);
  const CrossEntropyResult b = cross_entropy_forward_backward(logits, labels, kB, kT, logits, 1.0f);
  EXPECT_NEAR(a.loss_sum, want.sum, 1e-5 * want.sum);
  EXPECT_EQ(a.loss_sum, b.loss_sum);
  EXPECT_EQ(to_doubles(separate), to_doubles(logits));  // overwritten in place, same values
  const std::vector<double> grad = to_doubles(logits);
  for (size_t i = 0; i < grad.size(); ++i)
    EXPECT_TRUE(test::within_bf16_ulps(grad[i], want.grad[i], 1.0) || std::abs(grad[i] - want.grad[i]) < 1e-7)
        << i << ": " << grad[i] << " vs " << want.grad[i];
}

TEST(OpsCrossEntropy, GradientMatchesFiniteDifferences) {
  Tensor logits = random_tensor(Shape{kB * kT, kV}, DType::F32, 94, -3.0f, 3.0f);
  Tensor labels = make_labels(kLabels);
  Tensor scratch = Tensor::empty(logits.shape(), DType::F32);
  auto loss = [&] { return cross_entropy_forward_backward(logits, labels, kB, kT, scratch, 1.0f).loss_sum; };
  const std::vector<double> numeric = test::numerical_gradient(logits, loss, 1e-2f);
  Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
  cross_entropy_forward_backward(logits, labels, kB, kT, dlogits, 1.0f);
  EXPECT_LE(test::relative_error(to_doubles(dlogits), numeric), 1e-3);
}

TEST(OpsCrossEntropy, LabelOutsideTheVocabularyIsAUserError) {
  Tensor logits = random_tensor(Shape{kB * kT, kV}, DType::F32, 95);
  std::vector<int32_t> bad = kLabels;
  bad[3] = 11;
  Tensor labels = make_labels(bad);
  Tensor dlogits = Tensor::empty(logits.shape(), DType::F32);
  EXPECT_THROW(cross_entropy_forward_backward(logits, labels, kB, kT, dlogits, 1.0f), UserError);
}

// The row op (no host round trip): each row's loss, 0 where a row does not count, whose counted
// sum in row order is the summing op's loss_sum bit for bit, and the same gradients; a label
// outside the vocabulary in the host labels is the same UserError, before anything is written.
TEST(OpsCrossEntropy, RowLossesSumToTheOpsLoss) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    const Tensor logits = random_tensor(Shape{kB * kT, kV}, dtype, 96);
    const Tensor labels = make_labels(kLabels);
    Tensor dlogits = Tensor::empty(logits.shape(), dtype), dlogits_rows = Tensor::empty(logits.shape(), dtype);
    const CrossEntropyResult want = cross_entropy_forward_backward(logits, labels, kB, kT, dlogits, 0.25f);
    Tensor row_loss = Tensor::empty(Shape{kB * kT}, DType::F32);
    cross_entropy_rows_forward_backward(logits, labels, labels, kB, kT, dlogits_rows, 0.25f, row_loss);
    double sum = 0.0;
    for (int64_t row = 0; row < kB * kT; ++row) {
      const bool counted = row % kT + 1 < kT && kLabels[static_cast<size_t>(row + 1)] != kIgnoreIndex;
      if (counted)
        sum += static_cast<double>(row_loss.data<float>()[row]);
      else
        EXPECT_EQ(row_loss.data<float>()[row], 0.0f) << "row " << row;
    }
    EXPECT_EQ(sum, want.loss_sum);
    EXPECT_EQ(to_doubles(dlogits_rows), to_doubles(dlogits));
  }
  std::vector<int32_t> bad = kLabels;
  bad[3] = kV;
  const Tensor logits = random_tensor(Shape{kB * kT, kV}, DType::F32, 97), labels = make_labels(bad);
  Tensor dlogits = Tensor::empty(logits.shape(), DType::F32), row_loss = Tensor::empty(Shape{kB * kT}, DType::F32);
  EXPECT_THROW(cross_entropy_rows_forward_backward(logits, labels, labels, kB, kT, dlogits, 1.0f, row_loss), UserError);
}

}  // namespace
}  // namespace fsdpq
