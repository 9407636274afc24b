// The Llama MLP's gate: h = silu(gate) * up, silu(g) = g * sigmoid(g).
#pragma once
#include "backend/tensor.h"

namespace fsdpq {

// gate, up, h: the same shape (e.g. [B*T, I]), F32, BF16 or F16 each. fp32 math, one rounding on store
// (HF in bf16 also rounds silu(gate) before the product; see docs/ops.md). h may alias gate or up.
void swiglu_forward(TensorView h, const TensorView& gate, const TensorView& up);

// dgate = dh * up * silu'(gate), dup = dh * silu(gate). dgate may alias gate or dh, dup may alias up
// (each element is read before it is written).
void swiglu_backward(TensorView dgate, TensorView dup, const TensorView& dh, const TensorView& gate,
                     const TensorView& up);

}  // namespace fsdpq
