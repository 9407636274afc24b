#include "model/llama_lm_head.h"

#include <algorithm>
#include <vector>

#include "backend/cuda_backend.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "util/error.h"

namespace fsdpq {

int64_t lm_head_chunk_rows(int64_t vocab, int64_t rows) {
  // Each chunk costs a host wait for its loss and GEMMs whose last row tile is partly empty: big
  // chunks of whole 128-row tiles keep both small (131-row chunks at 7B ran 63 of them, each with a
  // nearly empty second tile).
  constexpr int64_t kChunkLogits = int64_t{1} << 24;
  constexpr int64_t kRowTile = 128;
  int64_t chunk = kChunkLogits / std::max<int64_t>(vocab, 1);
  if (chunk >= kRowTile) chunk = chunk / kRowTile * kRowTile;
  return std::clamp<int64_t>(chunk, 1, std::max<int64_t>(rows, 1));
}

CrossEntropyResult lm_head_loss(const TensorView& normed, const TensorView& head, const TensorView& labels,
                                int64_t B, int64_t T, float grad_scale, TensorView d_normed, TensorView d_head,
                                DType logits_dtype, int64_t chunk_rows) {
  const int64_t N = B * T, V = head.shape[0];
  const int32_t* label = labels.as<const int32_t>();
  // Row r predicts label r + 1 of its own sequence; the last position of a sequence predicts nothing.
  auto target_of = [&](int64_t row) { return row % T + 1 < T ? label[row + 1] : kIgnoreIndex; };
  for (int64_t row = 0; row < N; ++row) {
    const int32_t target = target_of(row);
    if (target != kIgnoreIndex && (target < 0 || target >= V))
      fail("label {} at batch {} position {} is outside the vocabulary of {} tokens (and is not the ignore index {})",
           target, row / T, row % T + 1, V, kIgnoreIndex);
  }

  chunk_rows = std::clamp<int64_t>(chunk_rows, 1, std::max<int64_t>(N, 1));
  // One spare row: each chunk is handed to the cross entropy as a single sequence of n + 1 rows whose
  // labels are already shifted (label t + 1 is row t's target); its last row never counts. Every
  // chunk's labels go to the device at once and every row's loss comes back at once, after the
  // last chunk: one host wait a step instead of three a chunk.
  const int64_t chunks = (N + chunk_rows - 1) / chunk_rows, span = chunk_rows + 1;
  std::vector<int32_t> all_labels(static_cast<size_t>(chunks * span), kIgnoreIndex);
  std::vector<bool> scored(static_cast<size_t>(chunks), false);  // chunks with a counted row
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t t = 0; t < std::min(chunk_rows, N - c * chunk_rows); ++t) {
      const int32_t target = target_of(c * chunk_rows + t);
      all_labels[static_cast<size_t>(c * span + t + 1)] = target;
      if (target != kIgnoreIndex) scored[static_cast<size_t>(c)] = true;
    }
  const TensorView host_labels{all_labels.data(), DType::I32, Shape{chunks * span}, Device::CPU};
  const Tensor labels_there = copy_to(host_labels, normed.device);
  Tensor row_loss = Tensor::empty(Shape{chunks * span}, DType::F32, normed.device);
  Tensor logits = Tensor::empty(Shape{span, V}, logits_dtype, normed.device);
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r0 = c * chunk_rows, n = std::min(chunk_rows, N - r0);
    if (!scored[static_cast<size_t>(c)]) {  // nothing to score: no loss, zero gradient, no matmul
      if (d_normed.data) fill_zero(d_normed.slice_rows(r0, n));
      continue;
    }
    const TensorView chunk = logits.view().slice_rows(0, n + 1);
    const TensorView rows = chunk.slice_rows(0, n);
    const TensorView x = normed.slice_rows(r0, n);
    linear_forward(rows, x, head);
    fill_zero(chunk.slice_rows(n, 1));
    cross_entropy_rows_forward_backward(chunk, host_labels.slice_rows(c * span, n + 1),
                                        labels_there.view().slice_rows(c * span, n + 1), 1, n + 1, chunk, grad_scale,
                                        row_loss.view().slice_rows(c * span, n + 1));
    if (d_normed.data) linear_backward_input(d_normed.slice_rows(r0, n), rows, head);
    if (d_head.data) linear_backward_weight(d_head, rows, x, /*accumulate=*/true);
  }
  // Each chunk's counted losses summed in row order in double, then the chunks in order: the sums
  // the per-chunk op gave.
  const Tensor losses = copy_to(row_loss.view(), Device::CPU);
  const float* loss = losses.data<float>();
  CrossEntropyResult total;
  for (int64_t c = 0; c < chunks; ++c) {
    if (!scored[static_cast<size_t>(c)]) continue;
    double part = 0.0;
    for (int64_t t = 0; t < std::min(chunk_rows, N - c * chunk_rows); ++t) {
      if (all_labels[static_cast<size_t>(c * span + t + 1)] == kIgnoreIndex) continue;
      part += static_cast<double>(loss[c * span + t]);
      ++total.count;
    }
    total.loss_sum += part;
  }
  return total;
}

void lm_head_logits(TensorView out, const TensorView& normed, const TensorView& head, DType logits_dtype) {
  if (logits_dtype == DType::F32) {
    linear_forward(out, normed, head);
    return;
  }
  const int64_t N = normed.shape.rows(), V = head.shape[0];
  const int64_t chunk_rows = lm_head_chunk_rows(V, N);
  Tensor logits = Tensor::empty(Shape{chunk_rows, V}, logits_dtype, normed.device);
  for (int64_t r0 = 0; r0 < N; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, N - r0);
    const TensorView rows = logits.view().slice_rows(0, n);
    linear_forward(rows, normed.slice_rows(r0, n), head);
    copy_convert(out.slice_rows(r0, n), rows);
  }
}

}  // namespace fsdpq
