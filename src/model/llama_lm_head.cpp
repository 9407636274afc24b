#include "model/llama_lm_head.h"

#include <algorithm>
#include <vector>

#include "backend/caching_allocator.h"
#include "backend/cuda_backend.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/rows.h"
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

namespace {

int64_t allocator_bytes(int64_t count, DType dtype) {  // as the caching allocator rounds a block
  return static_cast<int64_t>(CachingAllocator::rounded_size(static_cast<size_t>(count) * dtype_size(dtype)));
}

// What the head holds beside normed and d_normed with chunks of `chunk` rows over `rows` rows: one
// chunk of logits (+1 spare row), every chunk's labels and row losses, and where it gathers, the
// scoring rows' indices, one chunk of their normed rows and one of their gradient.
int64_t head_bytes(int64_t rows, int64_t chunk, int64_t C, int64_t V, const LmHeadDtypes& t, bool gathers) {
  const int64_t chunks = (rows + chunk - 1) / std::max<int64_t>(chunk, 1);
  int64_t bytes = allocator_bytes((chunk + 1) * V, t.logits) + 2 * allocator_bytes(chunks * (chunk + 1), DType::F32);
  if (gathers)
    bytes += allocator_bytes(rows, DType::I32) + allocator_bytes(chunk * C, t.x) + allocator_bytes(chunk * C, t.grad);
  return bytes;
}

}  // namespace

int64_t lm_head_gather_chunk_rows(int64_t N, int64_t scoring, int64_t C, int64_t V, int64_t chunk_rows,
                                  const LmHeadDtypes& dtypes) {
  constexpr int64_t kRowTile = 128;
  if (scoring <= 0 || scoring >= N) return 0;
  chunk_rows = std::clamp<int64_t>(chunk_rows, 1, N);
  const int64_t budget = head_bytes(N, chunk_rows, C, V, dtypes, false);
  if (N - scoring < chunk_rows) return 0;  // fewer ignored rows than a chunk: not worth the gathers
  // The largest chunk that fits: whole row tiles down to one, then single rows.
  for (int64_t chunk = std::min(chunk_rows, scoring); chunk >= 1;
       chunk = chunk > kRowTile ? (chunk - 1) / kRowTile * kRowTile : chunk - 1)
    if (head_bytes(scoring, chunk, C, V, dtypes, true) <= budget) return chunk;
  return 0;
}

CrossEntropyResult lm_head_loss(const TensorView& normed, const TensorView& head, const TensorView& labels,
                                int64_t B, int64_t T, float grad_scale, TensorView d_normed, TensorView d_head,
                                DType logits_dtype, int64_t chunk_rows) {
  const int64_t N = B * T, V = head.shape[0], C = normed.shape.last();
  const int32_t* label = labels.as<const int32_t>();
  // Row r predicts label r + 1 of its own sequence; the last position of a sequence predicts nothing.
  auto target_of = [&](int64_t row) { return row % T + 1 < T ? label[row + 1] : kIgnoreIndex; };
  std::vector<int32_t> scoring;  // the rows with a target, ascending
  for (int64_t row = 0; row < N; ++row) {
    const int32_t target = target_of(row);
    if (target == kIgnoreIndex) continue;
    if (target < 0 || target >= V)
      fail("label {} at batch {} position {} is outside the vocabulary of {} tokens (and is not the ignore index {})",
           target, row / T, row % T + 1, V, kIgnoreIndex);
    scoring.push_back(static_cast<int32_t>(row));
  }

  // The rows the chunks run over: normed's N, or in a training pass where enough are ignored, the
  // scoring ones, each chunk's gathered before its GEMMs (row m is then scoring[m]).
  chunk_rows = std::clamp<int64_t>(chunk_rows, 1, std::max<int64_t>(N, 1));
  const int64_t gather_chunk =
      d_normed.data == nullptr ? 0
                               : lm_head_gather_chunk_rows(N, static_cast<int64_t>(scoring.size()), C, V, chunk_rows,
                                                           {normed.dtype, d_normed.dtype, logits_dtype});
  const bool gathers = gather_chunk > 0;
  const int64_t M = gathers ? static_cast<int64_t>(scoring.size()) : N;
  if (gathers) chunk_rows = gather_chunk;
  auto target_at = [&](int64_t m) { return gathers ? target_of(scoring[static_cast<size_t>(m)]) : target_of(m); };
  Tensor rows_there, x_gathered, d_gathered;
  if (gathers) {
    rows_there = copy_to(TensorView{scoring.data(), DType::I32, Shape{M}, Device::CPU}, normed.device);
    x_gathered = Tensor::empty(Shape{chunk_rows, C}, normed.dtype, normed.device);
    d_gathered = Tensor::empty(Shape{chunk_rows, C}, d_normed.dtype, normed.device);
    fill_zero(d_normed);  // the ignored rows' gradient
  }

  // One spare row: each chunk is handed to the cross entropy as a single sequence of n + 1 rows whose
  // labels are already shifted (label t + 1 is row t's target); its last row never counts. Every
  // chunk's labels go to the device at once and every row's loss comes back at once, after the
  // last chunk: one host wait a step instead of three a chunk.
  const int64_t chunks = (M + chunk_rows - 1) / chunk_rows, span = chunk_rows + 1;
  std::vector<int32_t> all_labels(static_cast<size_t>(chunks * span), kIgnoreIndex);
  std::vector<bool> scored(static_cast<size_t>(chunks), false);  // chunks with a counted row
  for (int64_t c = 0; c < chunks; ++c)
    for (int64_t t = 0; t < std::min(chunk_rows, M - c * chunk_rows); ++t) {
      const int32_t target = target_at(c * chunk_rows + t);
      all_labels[static_cast<size_t>(c * span + t + 1)] = target;
      if (target != kIgnoreIndex) scored[static_cast<size_t>(c)] = true;
    }
  const TensorView host_labels{all_labels.data(), DType::I32, Shape{chunks * span}, Device::CPU};
  const Tensor labels_there = copy_to(host_labels, normed.device);
  Tensor row_loss = Tensor::empty(Shape{chunks * span}, DType::F32, normed.device);
  Tensor logits = Tensor::empty(Shape{span, V}, logits_dtype, normed.device);
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t r0 = c * chunk_rows, n = std::min(chunk_rows, M - r0);
    if (!scored[static_cast<size_t>(c)]) {  // nothing to score: no loss, zero gradient, no matmul
      if (d_normed.data) fill_zero(d_normed.slice_rows(r0, n));
      continue;
    }
    const TensorView chunk = logits.view().slice_rows(0, n + 1);
    const TensorView rows = chunk.slice_rows(0, n);
    const TensorView chunk_rows_of = gathers ? rows_there.view().slice_rows(r0, n) : TensorView{};
    if (gathers) gather_rows(x_gathered.view().slice_rows(0, n), normed, chunk_rows_of);
    const TensorView x = gathers ? x_gathered.view().slice_rows(0, n) : normed.slice_rows(r0, n);
    linear_forward(rows, x, head);
    fill_zero(chunk.slice_rows(n, 1));
    cross_entropy_rows_forward_backward(chunk, host_labels.slice_rows(c * span, n + 1),
                                        labels_there.view().slice_rows(c * span, n + 1), 1, n + 1, chunk, grad_scale,
                                        row_loss.view().slice_rows(c * span, n + 1));
    if (gathers) {
      const TensorView d = d_gathered.view().slice_rows(0, n);
      linear_backward_input(d, rows, head);
      scatter_rows(d_normed, chunk_rows_of, d);
    } else if (d_normed.data) {
      linear_backward_input(d_normed.slice_rows(r0, n), rows, head);
    }
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
    for (int64_t t = 0; t < std::min(chunk_rows, M - c * chunk_rows); ++t) {
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
