// Causal grouped-query attention of new tokens over a KV cache (generation, batch size 1).
// Private to LlamaModel::forward_cached; the training path uses ops/attention.h.
#pragma once
#include <cstdint>

#include "backend/tensor.h"

namespace fsdpq {

// q, out: [n, H, D] (F32 or BF16); keys, values: the cache [max_tokens, KV, D] with the new
// tokens already appended at rows start .. start + n - 1. Query t sits at position start + t and
// attends keys 0 .. start + t; query head h reads kv head h / (H / KV); scale 1/sqrt(D); fp32
// math, out rounded once.
void cached_attention_forward(TensorView out, const TensorView& q, const TensorView& keys, const TensorView& values,
                              int64_t start);

}  // namespace fsdpq
