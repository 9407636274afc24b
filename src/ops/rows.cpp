#include "ops/rows.h"

#include <cstring>
#include <vector>

#include "ops/checks.h"
#include "ops/cuda_ops.h"
#include "ops/dispatch.h"
#include "ops/parallel.h"

namespace fsdpq {

namespace {

// The shapes both directions share: `whole` [N, C], `compact` [R, C] of whole's dtype, I32 rows [R].
void check_rows_op(const char* op, const char* whole_name, const TensorView& whole, const char* compact_name,
                   const TensorView& compact, const TensorView& rows) {
  check_float(op, whole_name, whole);
  check_dtype(op, "rows", rows, DType::I32);
  check_that(whole.shape.rank == 2, "{}: {} must be [N, C], got {}", op, whole_name, whole.shape.to_string());
  check_shape(op, compact_name, compact, Shape{rows.numel(), whole.shape[1]});
  check_that(compact.dtype == whole.dtype, "{}: {} and {} must share a dtype (a copy, no conversion)", op,
             compact.describe(), whole.describe());
}

// Every row in [0, N) (and, for a scatter, none twice).
void check_row_indices(const char* op, const TensorView& rows, int64_t N, bool distinct) {
  const int32_t* row = rows.as<const int32_t>();
  std::vector<bool> seen(distinct ? static_cast<size_t>(N) : 0, false);
  for (int64_t j = 0; j < rows.numel(); ++j) {
    check_that(row[j] >= 0 && row[j] < N, "{}: row {} at index {} is outside [0, {})", op, row[j], j, N);
    if (!distinct) continue;
    check_that(!seen[static_cast<size_t>(row[j])], "{}: row {} appears twice", op, row[j]);
    seen[static_cast<size_t>(row[j])] = true;
  }
}

// Copies R rows of `bytes` each: dst row dst_row(j) = src row src_row(j).
template <class DstRow, class SrcRow>
void copy_rows_cpu(char* dst, const char* src, int64_t R, size_t bytes, DstRow dst_row, SrcRow src_row) {
#pragma omp parallel for if (worth_parallel(R * static_cast<int64_t>(bytes))) schedule(static)
  for (int64_t j = 0; j < R; ++j)
    std::memcpy(dst + static_cast<size_t>(dst_row(j)) * bytes, src + static_cast<size_t>(src_row(j)) * bytes, bytes);
}

}  // namespace

void gather_rows(TensorView out, const TensorView& src, const TensorView& rows) {
  constexpr const char* op = "gather_rows";
  check_rows_op(op, "src", src, "out", out, rows);
  if (runs_on_cuda(op, {out, src, rows}))
    if constexpr (kWithCuda) return cuda_ops::gather_rows(out, src, rows);
  check_row_indices(op, rows, src.shape[0], /*distinct=*/false);
  const int32_t* row = rows.as<const int32_t>();
  const size_t bytes = static_cast<size_t>(src.shape[1]) * dtype_size(src.dtype);
  copy_rows_cpu(static_cast<char*>(out.data), static_cast<const char*>(src.data), rows.numel(), bytes,
                [](int64_t j) { return j; }, [&](int64_t j) { return row[j]; });
}

void scatter_rows(TensorView dst, const TensorView& rows, const TensorView& src) {
  constexpr const char* op = "scatter_rows";
  check_rows_op(op, "dst", dst, "src", src, rows);
  if (runs_on_cuda(op, {dst, src, rows}))
    if constexpr (kWithCuda) return cuda_ops::scatter_rows(dst, rows, src);
  check_row_indices(op, rows, dst.shape[0], /*distinct=*/true);
  const int32_t* row = rows.as<const int32_t>();
  const size_t bytes = static_cast<size_t>(dst.shape[1]) * dtype_size(dst.dtype);
  copy_rows_cpu(static_cast<char*>(dst.data), static_cast<const char*>(src.data), rows.numel(), bytes,
                [&](int64_t j) { return row[j]; }, [](int64_t j) { return j; });
}

}  // namespace fsdpq
