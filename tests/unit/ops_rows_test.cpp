// Row selection (ops/rows.h) on the CPU: gathered and scattered rows keep every bit, the other rows
// of a scatter's destination are untouched, and bad rows are refused with the op's name.
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <vector>

#include "ops/rows.h"
#include "ops_test_support.h"

namespace fsdpq {
namespace {

Tensor i32_rows(const std::vector<int32_t>& rows) {
  Tensor t = Tensor::empty(Shape{static_cast<int64_t>(rows.size())}, DType::I32);
  std::memcpy(t.data<int32_t>(), rows.data(), rows.size() * sizeof(int32_t));
  return t;
}

bool same_row(const TensorView& a, int64_t i, const TensorView& b, int64_t j) {
  const size_t bytes = static_cast<size_t>(a.shape[1]) * dtype_size(a.dtype);
  return std::memcmp(static_cast<const char*>(a.data) + i * bytes, static_cast<const char*>(b.data) + j * bytes,
                     bytes) == 0;
}

TEST(OpsRows, GatherAndScatterKeepEveryBit) {
  for (DType dtype : {DType::F32, DType::BF16, DType::F16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t N = 9, C = 5;
    const std::vector<int32_t> rows = {0, 2, 3, 7, 8};
    Tensor src = test::random_tensor(Shape{N, C}, dtype, 1);
    Tensor rows_t = i32_rows(rows);
    Tensor compact = Tensor::empty(Shape{5, C}, dtype);
    gather_rows(compact, src, rows_t);
    for (size_t j = 0; j < rows.size(); ++j) EXPECT_TRUE(same_row(compact, static_cast<int64_t>(j), src, rows[j])) << j;

    Tensor dst = test::random_tensor(Shape{N, C}, dtype, 2), before = test::random_tensor(Shape{N, C}, dtype, 2);
    Tensor values = test::random_tensor(Shape{5, C}, dtype, 3);
    scatter_rows(dst, rows_t, values);
    for (int64_t i = 0, j = 0; i < N; ++i) {
      const bool chosen = j < 5 && rows[static_cast<size_t>(j)] == i;
      if (chosen) EXPECT_TRUE(same_row(dst, i, values, j++)) << i;
      else EXPECT_TRUE(same_row(dst, i, before, i)) << i << " is not a chosen row: left as it was";
    }
  }
}

TEST(OpsRows, BadRowsAreRefusedNamingTheOp) {
  Tensor src = test::random_tensor(Shape{4, 3}, DType::F32, 4), out = Tensor::empty(Shape{2, 3}, DType::F32);
  Tensor outside = i32_rows({1, 4}), twice = i32_rows({1, 1});
  EXPECT_THROW(gather_rows(out, src, outside), std::logic_error);
  gather_rows(out, src, twice);  // a gather may repeat a row
  EXPECT_THROW(scatter_rows(src, twice, out), std::logic_error);
  EXPECT_THROW(scatter_rows(src, outside, out), std::logic_error);
  Tensor bf16 = Tensor::empty(Shape{2, 3}, DType::BF16);
  EXPECT_THROW(gather_rows(bf16, src, i32_rows({0, 1})), std::logic_error);  // a copy: no conversion
  try {
    scatter_rows(src, twice, out);
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(), "scatter_rows: row 1 appears twice");
  }
}

}  // namespace
}  // namespace fsdpq
