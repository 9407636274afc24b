// DoRA, weight-decomposed LoRA (Liu et al. 2024), on one frozen linear W [out, in] as HF PEFT's
// DoraLinearLayer computes it (use_dora=True):
//   n = ‖W + s·B·A‖ per output row (detached: a constant of the backward, DoRA §4.3)
//   g = m / n                                  (m: the trainable magnitude vector [out])
//   y = x·Wᵀ + (g − 1) ⊙ (x'·Wᵀ) + g ⊙ s·(x'·Aᵀ)·Bᵀ,   x' = dropout(x)
// g scales output columns. Without dropout (or in eval) x' = x and PEFT reuses the base output:
// y = g ⊙ (x·Wᵀ + s·x·Aᵀ·Bᵀ), computed so. With dropout PEFT runs the base linear again on x',
// and so does this. s = alpha / r (ops/lora.h); A, B, the dropout masks are LoRA's.
#pragma once
#include "backend/tensor.h"
#include "ops/lora.h"

namespace fsdpq {

// One DoRA linear: the frozen weight made dense (dequantised), the adapter and its magnitude.
struct DoraSite {
  TensorView W;          // [out, in]
  TensorView A, B;       // [r, in], [out, r]
  TensorView magnitude;  // m [out]
  LoraParams params;
};

// What the forward keeps for the backward.
struct DoraSaved {
  TensorView xa;    // [M, r]: x'·Aᵀ (as lora_forward keeps it)
  TensorView z;     // [M, out]: x'·Wᵀ + s·x'·Aᵀ·Bᵀ, the output before g scales it
  TensorView norm;  // F32 [out]: n, from dora_weight_norm
};

// norm (F32 [out]) = ‖W + scaling·B·A‖ of every row, summed in fp32 from W's values and the fp32
// product B·A, a block of rows at a time (never more than kDoraNormChunkBytes of fp32 scratch).
// B = 0 gives the rows' own norms: the magnitude's initial value.
inline constexpr int64_t kDoraNormChunkBytes = int64_t{32} << 20;
void dora_weight_norm(TensorView norm, const TensorView& W, const TensorView& A, const TensorView& B, float scaling);
// The rows of a scratch block [rows, in] to use for a weight with `in` columns.
int64_t dora_norm_chunk_rows(int64_t out, int64_t in);

// The same norms without W + s·B·A ever made: ‖w_o + s·b_o·A‖² = ‖w_o‖² + 2s·b_o·g_o + s²·b_o·h_o
// with G = W·Aᵀ and H = B·(A·Aᵀ) ([out, r] each, fp32), so W is read twice (its squares, and the
// G product) instead of being widened to fp32 scratch, multiplied into and read again: ~4 bytes of
// traffic an element instead of ~18. Equal to dora_weight_norm up to fp32 rounding (the sums run in
// another order). The GPU takes it where FSDPQ_DORA_NORM=expanded (the default, direct, until it is
// measured faster); tests call it on either device.
void dora_weight_norm_expanded(TensorView norm, const TensorView& W, const TensorView& A, const TensorView& B,
                               float scaling);
// Which dora_weight_norm the GPU runs (FSDPQ_DORA_NORM at start-up); tests set it here.
enum class GpuDoraNorm { Direct, Expanded };
GpuDoraNorm gpu_dora_norm();
void set_gpu_dora_norm(GpuDoraNorm norm);

// y ([..., out], any float dtype) = the DoRA linear's output for x [..., in], given n (from
// dora_weight_norm, computed with the site's A and B). saved.xa and saved.z are written.
void dora_forward(TensorView y, const DoraSaved& saved, const TensorView& x, const DoraSite& site);

// Gradients with n held constant: dx (+)= dL/dx (+ when accumulate_dx; skipped when dx.data is
// null), dA, dB, dm (F32) += theirs. x, saved and site must be the forward's.
void dora_backward(TensorView dx, bool accumulate_dx, TensorView dA, TensorView dB, TensorView dm,
                   const TensorView& dy, const TensorView& x, const DoraSaved& saved, const DoraSite& site);

// The elementwise pieces, each with a CPU reference here and a CUDA kernel (kernels/dora.cu):
// norm[i] = sqrt(Σ_k P[i, k]²) for F32 P [rows, in].
void dora_row_norms(TensorView norm, const TensorView& P);
// norm[o] = sqrt(max(0, Σ_j W[o, j]² + Σ_k B[o, k] · (2s·G[o, k] + s²·H[o, k]))): W [out, in] and
// B [out, r] any float dtype, G and H F32 [out, r] (dora_weight_norm_expanded's last step).
void dora_norm_from_parts(TensorView norm, const TensorView& W, const TensorView& B, const TensorView& G,
                          const TensorView& H, float scaling);
// g (F32 [out]) = m / n.
void dora_magnitude_scale(TensorView g, const TensorView& magnitude, const TensorView& norm);
// out[t, j] = (accumulate ? out[t, j] : 0) + in[t, j] · (g[j] + offset); out and in [M, out] of
// any float dtype (out may be in), g F32 [out].
void dora_scale_columns(TensorView out, const TensorView& in, const TensorView& g, float offset, bool accumulate);
// dm[j] += Σ_t dy[t, j] · z[t, j] / n[j]   (dm, n F32 [out]; dy, z [M, out] any float dtype).
void dora_magnitude_backward(TensorView dm, const TensorView& dy, const TensorView& z, const TensorView& norm);

}  // namespace fsdpq
