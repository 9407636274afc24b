#include "ops/embedding.h"

#include "ops/checks.h"
#include "ops/cuda_ops.h"
#include "ops/dispatch.h"
#include "ops/parallel.h"
#include "ops/storage.h"
#include "util/error.h"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace fsdpq {

namespace {

void check_ids(const char* op, const TensorView& ids, int64_t vocab) {
  check_cpu_dtype(op, "ids", ids, DType::I32);
  const int32_t* id = ids.as<const int32_t>();
  for (int64_t n = 0; n < ids.numel(); ++n)
    if (id[n] < 0 || id[n] >= vocab)
      fail("token id {} at position {} is outside the vocabulary of {} tokens (valid ids are 0..{})", id[n], n,
           vocab, vocab - 1);
}

// What both directions check before they pick a device: a [V, C] table (or its gradient), I32
// ids, and one row of C per id (the output, or its gradient).
void check_lookup(const char* op, const char* table_name, const TensorView& table, const char* rows_name,
                  const TensorView& rows, const TensorView& ids) {
  check_that(table.shape.rank == 2, "{}: {} must be [V, C], got {}", op, table_name, table.shape.to_string());
  check_shape(op, rows_name, rows, Shape{ids.numel(), table.shape[1]});
  check_that(ids.dtype == DType::I32, "{}: ids is {}; expected I32", op, ids.describe());
}

}  // namespace

void embedding_forward(TensorView out, const TensorView& ids, const TensorView& table) {
  constexpr const char* op = "embedding_forward";
  check_float(op, "table", table);
  check_float(op, "out", out);
  check_lookup(op, "table", table, "out", out, ids);
  if (runs_on_cuda(op, {out, ids, table}))
    if constexpr (kWithCuda) return cuda_ops::embedding_forward(out, ids, table);
  check_cpu_float(op, "table", table);
  check_cpu_float(op, "out", out);
  const int64_t vocab = table.shape[0], channels = table.shape[1], tokens = ids.numel();
  check_ids(op, ids, vocab);
  const int32_t* id = ids.as<const int32_t>();

  with_storages({table.dtype, out.dtype}, op, [&](auto table_tag, auto out_tag) {
    using TableT = decltype(table_tag);
    using OutT = decltype(out_tag);
    const TableT* src = table.as<const TableT>();
    OutT* dst = out.as<OutT>();
#pragma omp parallel for if (worth_parallel(tokens * channels)) schedule(static)
    for (int64_t n = 0; n < tokens; ++n) {
      const TableT* row = src + static_cast<int64_t>(id[n]) * channels;
      OutT* out_row = dst + n * channels;
      for (int64_t c = 0; c < channels; ++c) out_row[c] = from_f32<OutT>(to_f32(row[c]));
    }
  });
}

void embedding_backward(TensorView dtable, const TensorView& ids, const TensorView& dout) {
  constexpr const char* op = "embedding_backward";
  check_that(dtable.dtype == DType::F32, "{}: dtable is {}; expected F32", op, dtable.describe());
  check_float(op, "dout", dout);
  check_lookup(op, "dtable", dtable, "dout", dout, ids);
  if (runs_on_cuda(op, {dtable, ids, dout}))
    if constexpr (kWithCuda) return cuda_ops::embedding_backward(dtable, ids, dout);
  check_cpu_dtype(op, "dtable", dtable, DType::F32);
  check_cpu_float(op, "dout", dout);
  const int64_t vocab = dtable.shape[0], channels = dtable.shape[1], tokens = ids.numel();
  check_ids(op, ids, vocab);
  const int32_t* id = ids.as<const int32_t>();
  float* grad = dtable.as<float>();

  with_storage(dout.dtype, op, [&](auto dout_tag) {
    using GradT = decltype(dout_tag);
    const GradT* dy = dout.as<const GradT>();
    // Repeated ids would race if threads split tokens; splitting columns keeps it exact and
    // deterministic (tokens are added in order).
    constexpr int64_t kColumnBlock = 64;
    const int64_t blocks = (channels + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for if (worth_parallel(tokens * channels)) schedule(static)
    for (int64_t block = 0; block < blocks; ++block) {
      const int64_t c0 = block * kColumnBlock, c1 = std::min(channels, c0 + kColumnBlock);
      for (int64_t n = 0; n < tokens; ++n) {
        float* grad_row = grad + static_cast<int64_t>(id[n]) * channels;
        const GradT* dy_row = dy + n * channels;
        for (int64_t c = c0; c < c1; ++c) grad_row[c] += to_f32(dy_row[c]);
      }
    }
  });
}

}  // namespace fsdpq
