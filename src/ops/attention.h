// Causal grouped-query scaled-dot-product attention (no padding mask: fsdp_qlora passes none).
// Query head h reads kv head h / (H / KV); scores are scaled by 1/sqrt(D).
//
// Packed rows (docs/packing.md): a row may hold several examples side by side. segment_start, an
// optional I32 [B, T] tensor on the operands' device, gives for each token the position in its row
// where its example begins; key j is visible to query i of row b iff
//   segment_start[b, i] <= j <= i,
// so no token attends across an example boundary. Contract (the CPU op checks it, the GPU kernels
// trust it: the collator builds it): 0 <= segment_start[b, i] <= i. Padding slots are best given
// their own one-token segments (segment_start[b, i] = i). An empty view (data == nullptr) is plain
// causal attention, bit for bit what it was before segments existed. The work skipped is the masked
// part: the CPU reference costs Σ segment_len², the GPU kernels skip key tiles no query of a tile
// can see.
#pragma once
#include "backend/tensor.h"
#include "ops/rope.h"

namespace fsdpq {

// q: [B, T, H, D]; k, v: [B, T, KV, D]; out: [B, T, H, D] (F32, BF16 or F16, each independently).
// lse: F32 [B, H, T], the logsumexp of each query row's scaled scores, saved for the backward.
// Math in fp32; out is rounded once on store.
void attention_forward(TensorView out, TensorView lse, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& segment_start = {});

// Recomputes the probabilities from q, k and lse (flash-attention style: one query row of one
// (b, h) at a time, never a whole score matrix) and writes dq, dk, dv (dk, dv summed over the
// query heads that share a kv head). Needs the forward's out (for rowsum(dout * out)).
void attention_backward(TensorView dq, TensorView dk, TensorView dv, const TensorView& dout, const TensorView& q,
                        const TensorView& k, const TensorView& v, const TensorView& out, const TensorView& lse,
                        const TensorView& segment_start = {});

// attention_backward, then RoPE's backward on dq and dk (ops/rope.h), as a Llama layer runs them.
// Where the wgmma kernels take the backward they rotate dq and dk as they store them, in fp32
// before their one rounding (no pass over dq and dk of its own); elsewhere rope_backward follows.
// The values agree to that rounding.
void attention_rope_backward(TensorView dq, TensorView dk, TensorView dv, const TensorView& dout, const TensorView& q,
                             const TensorView& k, const TensorView& v, const TensorView& out, const TensorView& lse,
                             const RopeTable& rope, int64_t position_offset, const TensorView& positions,
                             const TensorView& segment_start = {});

// Which GPU kernels run attention. TensorCores takes kernels/attention_mma.cu wherever it applies
// (q, k, v all BF16 or all F16, head dim 64 or 128, 16-byte aligned) and the fp32 SIMT kernels
// (kernels/attention.cu) elsewhere; Simt takes the SIMT kernels everywhere. Cudnn asks cuDNN's
// fused flash attention first (ops/attention_cudnn.h) and runs fsdpq's own choice where cuDNN
// declines; its backward is deterministic, CudnnNondeterministic's is cuDNN's faster one whose bits
// vary from run to run. Auto, the default, is Cudnn that says why it declines as information, not
// as a warning: the fastest deterministic kernels this machine has (cuDNN is optional). Wgmma runs
// both passes on fsdpq's Hopper (sm_90a) kernels (kernels/attention_sm90a.cuh,
// ops/cuda/attention_wgmma.h) where they apply and TensorCores' choice elsewhere; the cuDNN routes
// (Auto among them) also take the Hopper kernels for what cuDNN declines — on Hopper that is the
// deterministic backward (docs/cuda.md).
// The environment's FSDPQ_ATTENTION (auto, mma, simt, cudnn, cudnn-nondeterministic, wgmma) sets
// the choice at start-up; tests set it with set_gpu_attention_kernels.
// With segment_start the SIMT, mma and wgmma kernels run both passes; cuDNN declines it and the
// pass falls through (ops/cuda/attention.cpp, one condition per route; docs/packing.md).
enum class GpuAttentionKernels { Auto, TensorCores, Simt, Cudnn, CudnnNondeterministic, Wgmma };
GpuAttentionKernels gpu_attention_kernels();
void set_gpu_attention_kernels(GpuAttentionKernels kernels);

}  // namespace fsdpq
