// Token embedding: a row gather from the table, and its scatter-add gradient.
#pragma once
#include "backend/tensor.h"

namespace fsdpq {

// out[n, :] = table[ids[n], :] for the N = ids.numel() tokens.
// ids: I32 of any shape (e.g. [B, T]); table: [V, C]; out: [N, C]; table and out F32, BF16 or F16.
// An id outside [0, V) is a UserError naming the id, its position and V.
void embedding_forward(TensorView out, const TensorView& ids, const TensorView& table);

// dtable[ids[n], :] += dout[n, :] (accumulated in fp32; rows of unused ids are left as they are).
// dtable: F32 [V, C]; dout: [N, C] F32, BF16 or F16. Deterministic (each thread owns a column range).
void embedding_backward(TensorView dtable, const TensorView& ids, const TensorView& dout);

}  // namespace fsdpq
