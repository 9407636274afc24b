#include "ops/embedding.h"
#include "ops_test_support.h"
#include "util/error.h"

#include <gtest/gtest.h>

#include <string>

namespace fsdpq {
namespace {

using test::random_tensor;
using test::to_doubles;

Tensor make_ids(std::vector<int32_t> values, Shape shape) {
  Tensor ids = Tensor::empty(shape, DType::I32);
  std::copy(values.begin(), values.end(), ids.data<int32_t>());
  return ids;
}

TEST(OpsEmbedding, ForwardGathersRowsExactly) {
  const int64_t V = 10, C = 7;
  Tensor ids = make_ids({3, 0, 9, 3, 5, 1}, Shape{2, 3});
  for (DType table_dtype : {DType::F32, DType::BF16}) {
    Tensor table = random_tensor(Shape{V, C}, table_dtype, 1);
    for (DType out_dtype : {DType::F32, DType::BF16}) {
      Tensor out = Tensor::empty(Shape{6, C}, out_dtype);
      embedding_forward(out, ids, table);
      for (int64_t n = 0; n < 6; ++n)
        for (int64_t c = 0; c < C; ++c) {
          const float want = load_f32(table.view(), ids.data<int32_t>()[n] * C + c);
          // Exact, except that an F32 table read into a BF16 output is rounded once.
          const float expected = out_dtype == DType::BF16 ? round_bf16(want) : want;
          EXPECT_EQ(load_f32(out.view(), n * C + c), expected);
        }
    }
  }
}

TEST(OpsEmbedding, OutOfRangeIdNamesTheIdAndVocabulary) {
  Tensor table = random_tensor(Shape{10, 4}, DType::F32, 2);
  Tensor out = Tensor::empty(Shape{3, 4}, DType::F32);
  for (int32_t bad : {10, -1}) {
    Tensor ids = make_ids({1, 2, bad}, Shape{3});
    try {
      embedding_forward(out, ids, table);
      FAIL() << "expected a UserError for id " << bad;
    } catch (const UserError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("token id " + std::to_string(bad)), std::string::npos) << message;
      EXPECT_NE(message.find("10 tokens"), std::string::npos) << message;
      EXPECT_NE(message.find("position 2"), std::string::npos) << message;
    }
  }
}

TEST(OpsEmbedding, BackwardAccumulatesRepeatedIds) {
  const int64_t V = 6, C = 70;  // C spans two column blocks of the backward
  Tensor ids = make_ids({4, 1, 4, 4, 0}, Shape{5});
  Tensor dout = random_tensor(Shape{5, C}, DType::BF16, 3);
  Tensor dtable = random_tensor(Shape{V, C}, DType::F32, 4);  // accumulates onto what is there
  std::vector<double> want = to_doubles(dtable);
  for (int64_t n = 0; n < 5; ++n)
    for (int64_t c = 0; c < C; ++c)
      want[static_cast<size_t>(ids.data<int32_t>()[n] * C + c)] += load_f32(dout.view(), n * C + c);
  embedding_backward(dtable, ids, dout);
  EXPECT_LE(test::max_abs_diff(to_doubles(dtable), want), 1e-6);
}

TEST(OpsEmbedding, BackwardMatchesFiniteDifferences) {
  const int64_t V = 5, C = 3;
  Tensor ids = make_ids({2, 2, 0, 4}, Shape{4});
  Tensor table = random_tensor(Shape{V, C}, DType::F32, 5);
  Tensor out = Tensor::empty(Shape{4, C}, DType::F32);
  const std::vector<double> w = test::random_weights(4 * C, 6);
  auto loss = [&] {
    embedding_forward(out, ids, table);
    return test::weighted_sum(out, w);
  };
  const std::vector<double> numeric = test::numerical_gradient(table, loss, 1e-2f);
  Tensor dout = Tensor::empty(Shape{4, C}, DType::F32);
  for (int64_t i = 0; i < 4 * C; ++i) dout.data<float>()[i] = static_cast<float>(w[static_cast<size_t>(i)]);
  Tensor dtable = Tensor::zeros(Shape{V, C}, DType::F32);
  embedding_backward(dtable, ids, dout);
  // A linear op: only fp32 rounding of the loss remains.
  EXPECT_LE(test::relative_error(to_doubles(dtable), numeric), 1e-4);
}

TEST(OpsEmbedding, ShapeMismatchIsALogicError) {
  Tensor table = random_tensor(Shape{10, 4}, DType::F32, 7);
  Tensor ids = make_ids({1, 2}, Shape{2});
  Tensor out = Tensor::empty(Shape{2, 5}, DType::F32);
  EXPECT_THROW(embedding_forward(out, ids, table), std::logic_error);
}

}  // namespace
}  // namespace fsdpq
