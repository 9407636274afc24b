// The language-model head and its loss, chunked over token rows: a chunk's logits are computed,
// turned into dlogits in place by the cross entropy, and sent straight into the head's backward,
// so fp32 logits for the whole batch (N × vocab) never exist.
#pragma once
#include <cstdint>

#include "backend/tensor.h"
#include "ops/cross_entropy.h"

namespace fsdpq {

// Rows per chunk: about 16 Mi logits at a time in whole 128-row tiles where the vocabulary allows
// (512 rows at 32000, 128 at Llama-3's 128256), at least one row, at most `rows`.
int64_t lm_head_chunk_rows(int64_t vocab, int64_t rows);

// normed: final-norm output [N = B*T, C]; head: [V, C]; labels: I32 [N] (row t of a sequence is
// scored against label t + 1, -100 ignored). Logits are stored in `logits_dtype` (the activation
// dtype, as HF's lm_head output) and upcast row by row for the loss. When d_normed (F32 [N, C]) has
// data it receives grad_scale · dloss/dnormed; when d_head (F32 [V, C]) has data the head's
// gradient is added to it. A label outside the vocabulary is a UserError naming batch and position.
CrossEntropyResult lm_head_loss(const TensorView& normed, const TensorView& head, const TensorView& labels,
                                int64_t B, int64_t T, float grad_scale, TensorView d_normed, TensorView d_head,
                                DType logits_dtype, int64_t chunk_rows);

// out: F32 [N, V] = (normed · headᵀ rounded to logits_dtype), converted to fp32.
void lm_head_logits(TensorView out, const TensorView& normed, const TensorView& head, DType logits_dtype);

}  // namespace fsdpq
