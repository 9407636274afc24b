// The LoRA adapter path added onto a frozen base linear's output (PEFT's Linear.forward):
//   y += scaling * (dropout(x) · Aᵀ) · Bᵀ,   A [r, in], B [out, r], scaling = alpha / r.
// Dropout touches the adapter's input only, in training only. Its mask is a pure function of a
// 64-bit key and the element index, so every device draws the same mask and the backward can
// regenerate it instead of storing it.
#pragma once
#include "backend/matrix_view.h"
#include "backend/tensor.h"

#include <cstdint>
#include <span>

namespace fsdpq {

struct LoraParams {
  float alpha = 16.0f;        // scaling = alpha / r (r = A's first dimension)
  float dropout = 0.0f;       // probability of zeroing an input element, in [0, 1)
  bool training = false;      // dropout only applies while training
  uint64_t dropout_key = 0;   // the caller derives one per (seed, step, micro-batch, layer, module, rank)
};

float lora_scaling(const LoraParams& params, int64_t rank);

// Whether element `index` (flattened over the adapter input x) survives dropout with probability p:
// with w = mix64(mix64(key) + (index / 4 + 1) · golden) (splitmix64's mixer, golden 0x9E3779B97F4A7C15),
// keep ⇔ 16-bit field index % 4 of w, (w >> 16 · (index % 4)) & 0xFFFF, is ≥ round(p · 2^16).
bool lora_dropout_keeps(uint64_t key, uint64_t index, float probability);

// The one rule for a dropout probability (the model's options, a PEFT adapter's config): [0, 1).
// NaN fails it too.
inline bool valid_lora_dropout(double probability) { return probability >= 0.0 && probability < 1.0; }

// The adapter's dropout on its own, for a caller that needs the dropped input elsewhere (DoRA
// runs the base weight over it, ops/dora.h): out = dropout(x) with params' mask (x's shape and
// dtype; x itself when dropout is off), and its backward dx += keep / (1 - p) ⊙ g (g F32, dx's
// shape; dx += g when dropout is off).
void lora_dropout_forward(TensorView out, const TensorView& x, const LoraParams& params);
void lora_dropout_backward(TensorView dx, const TensorView& g, const LoraParams& params);

// x: [..., in] (rows M = x.numel() / in); A: [r, in]; B: [out, r]; y: [..., out] with M rows,
// accumulated (y += adapter output). xa: [M, r] (F32, BF16 or F16), written with dropout(x) · Aᵀ and
// kept for the backward. All of x, A, B, y: F32, BF16 or F16. Dropout 0 (or not training) reads x as is.
void lora_forward(TensorView y, TensorView xa, const TensorView& x, const TensorView& A, const TensorView& B,
                  const LoraParams& params);

// dA (F32 [r, in]) and dB (F32 [out, r]) are accumulated; the adapter's part of the input gradient
// is added to dx ([..., in], F32, BF16 or F16), or skipped when dx.data is null. x, xa, A, B and params
// (including the dropout key) must be the forward's.
void lora_backward(TensorView dx, TensorView dA, TensorView dB, const TensorView& dy, const TensorView& x,
                   const TensorView& xa, const TensorView& A, const TensorView& B, const LoraParams& params);

// Adapters on modules that read one input (q/k/v read input_layernorm's output, gate/up read
// post_attention_layernorm's) run as a group that reads x once. Without dropout their A matrices
// are stacked and one GEMM gives every adapter's x·Aᵀ (in the backward one GEMM each gives the
// stacked dA and the adapters' part of dx). With dropout every adapter keeps a mask of its own, as
// PEFT draws one per module, and one pass over x writes each adapter's dropped input.
// xa: [M, Σr], adapter i's columns right after adapter i-1's. lora_forward is a group of one.
inline constexpr size_t kMaxLoraGroup = 4;  // q, k, v is the largest group a Llama layer has
struct LoraSite {
  TensorView A, B;    // [r, in], [out, r]
  LoraParams params;  // each adapter's own dropout key; probability and training alike in a group
};
struct LoraSiteGrads {
  TensorView dA, dB;  // F32, accumulated
};

// How the GPU runs a group whose dropout is active: Separate, a dropped copy of x per
// adapter and cuBLAS products; Fused, kernels that apply each adapter's mask inside its products and
// never write a dropped copy of x (kernels/lora_fused.cuh), where they take the group (16-bit x and
// A, ranks multiples of 16 summing to at most 256, an input width that is a multiple of 128). Fused
// is the default where the Hopper kernels run (an H100 or H200: 3.4% faster on the 7B step, docs/ops.md),
// Separate elsewhere (the mma fused kernels were not faster there). The environment's
// FSDPQ_LORA_KERNELS (auto, fused, separate) sets it at start-up; tests set it here. Auto resolves
// once CUDA is initialised (before that gpu_lora_kernels() answers Separate: `fsdpq plan` without
// a GPU counts the separate path's temporaries, the larger).
enum class GpuLoraKernels { Fused, Separate };
GpuLoraKernels gpu_lora_kernels();
void set_gpu_lora_kernels(GpuLoraKernels kernels);
void use_automatic_gpu_lora_kernels();  // back to auto, whatever the environment said

// ys[i] += adapter i's output; with accumulate_ys false ys[i] = adapter i's output, its old values
// unread (a caller that adds the base weight's product after it, through the GEMM's beta, saves
// the adapter's read of y).
void lora_forward_group(std::span<const TensorView> ys, TensorView xa, const TensorView& x,
                        std::span<const LoraSite> sites, bool accumulate_ys = true);
// The second half of lora_forward_group: ys[i] (+)= adapter i's output from an xa that a
// lora_forward_group or lora_down_group over the same x and sites wrote (a checkpointed layer's
// recompute keeps its xa from the forward instead of redrawing the dropout masks,
// model/llama_model.cpp). x is checked, not read.
void lora_up_group(std::span<const TensorView> ys, const TensorView& xa, const TensorView& x,
                   std::span<const LoraSite> sites, bool accumulate_ys = true);
// The first half of lora_forward_group: xa = [dropout_i(x) · A_iᵀ]_i only, for a caller that applies
// the B products its own way (folded into the base GEMM, model/llama_layer.cpp).
void lora_down_group(TensorView xa, const TensorView& x, std::span<const LoraSite> sites);
// The same, with x also copied into x_copy (a block of a wider matrix's columns, x's shape and
// dtype): the folded GEMM's [x | xa]. Where the Hopper down kernel runs it stores the x tiles it
// loads (x read once for both); elsewhere copy_block copies it after.
void lora_down_group(TensorView xa, const TensorView& x, std::span<const LoraSite> sites, const MatrixView& x_copy);
// dys[i]: the gradient at ys[i]. dx (+)= every adapter's part (skipped when dx.data is null).
void lora_backward_group(TensorView dx, std::span<const LoraSiteGrads> grads, std::span<const TensorView> dys,
                         const TensorView& x, const TensorView& xa, std::span<const LoraSite> sites);

// lora_backward_group in two steps, so a caller can let go of each dy after its step: for each
// adapter i, lora_backward_output (dB_i += …, and adapter i's columns of dxa, F32 [M, Σr]); then
// lora_backward_input once (every dA += …, and dx += the adapters' part; with accumulate_dx false
// dx = the adapters' part, its old values unread: a caller that adds the base weight's part after
// it saves a pass over dx). Either part of each step may be left out (a null dB or dxa, an empty
// dAs, a null dx), so a caller may run the parts nothing waits for (dB, dA) on another stream.
void lora_backward_output(TensorView dxa, size_t i, TensorView dB, const TensorView& dy, const TensorView& x,
                          const TensorView& xa, std::span<const LoraSite> sites);
void lora_backward_input(TensorView dx, std::span<const TensorView> dAs, const TensorView& dxa, const TensorView& x,
                         const TensorView& xa, std::span<const LoraSite> sites, bool accumulate_dx = true);

}  // namespace fsdpq
