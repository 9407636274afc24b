// One Llama decoder layer (HF LlamaDecoderLayer) over the ops of src/ops: its forward, which
// keeps what the backward needs in a LayerActivations, and its explicit backward. The same
// forward code runs in training, in the checkpointed recompute and in evaluation, so a recompute
// reproduces the saved activations bit for bit.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <utility>

#include "backend/matrix_view.h"
#include "backend/side_stream.h"
#include "backend/tensor.h"
#include "model/llama_weights.h"
#include "ops/lora.h"
#include "ops/rope.h"

namespace fsdpq {

struct LayerDims {
  int64_t B = 0, T = 0;  // batch, sequence
  int64_t C = 0;         // hidden
  int64_t H = 0, KV = 0, D = 0;
  int64_t I = 0;         // intermediate
  float eps = 1e-5f;
  int64_t N() const { return B * T; }
};
LayerDims layer_dims(const LlamaConfig& config, int64_t batch, int64_t seq_len);

// Packed rows (docs/packing.md): per token, where its example begins in its row and its position
// within that example, both I32 [B, T] on the activations' device. Empty views: each row is one
// sequence (plain causal attention, positions 0..T-1).
struct RowSegments {
  TensorView segment_start;  // ops/attention.h
  TensorView positions;      // ops/rope.h
};

// The linear modules that read one input: q/k/v read input_layernorm's output, gate/up read
// post_attention_layernorm's. A group's adapters run as one LoRA group (ops/lora.h), which reads
// the shared input once.
enum LinearGroup : int { kQkvGroup, kOGroup, kGateUpGroup, kDownGroup };
inline constexpr int kLinearGroups = 4;
std::span<const int> group_modules(int group);

// The output width of linear module m.
int64_t module_out(const LayerDims& d, int module);

// What a layer computes with: dense weights (NF4 already dequantised), adapters with their
// dropout settings, and the fp32 gradients of trainable weights (empty views when frozen).
// An adapter with a magnitude makes its linear a DoRA linear (ops/dora.h).
//
// A folded group (FSDPQ_LORA_FOLD=1, docs/model.md): its modules' adapters are plain LoRA on
// quantised bases, and module j's dense buffer is W_cat_j = [W_j | 0 | s_j·B_j], [out_j, C + K_j]
// with K_j = r_0 + … + r_j (the zeros under the adapters before j). With X = [x | xa] (xa the
// group's stacked dropout(x)·Aᵀ), y_j = X[:, :C + K_j] · W_cat_jᵀ is the base product plus the
// adapter's in one GEMM: the B product's own GEMM, its write of y_j and the base GEMM's read of
// it go. weight(m) is W_j's block; the layer writes s_j·B_j's block before each use (B changes
// at every optimizer step); the zeros are written once, with the buffer.
struct LayerCompute {
  TensorView input_norm, post_norm;
  // Module m's dense base weight (a block of W_cat_m's columns in a folded group). Its
  // dequantisation may still be running on a side stream (model/llama_model.cpp): the compute
  // stream waits for it here, so no op can read it early.
  MatrixView weight(int m) const {
    weight_ready_[m].compute_waits();
    return weight_[m];
  }
  std::array<bool, kLinearGroups> folded{};  // per group: its weights are W_cat (above)
  // The compute stream waits for every module's weight: a caller about to let the layer's
  // quantised weights go (its unit's forward_end or backward_end) calls this first.
  void wait_for_weights() const {
    for (const StreamMark& ready : weight_ready_) ready.compute_waits();
  }
  void set_weight(int m, const MatrixView& dense, StreamMark ready = {}) {
    weight_[m] = dense;
    weight_ready_[m] = std::move(ready);
  }
  // Where the model tracks, per module, the compute stream's last read of its dense buffer (null:
  // not tracked). The layer calls release_group once a group's products are queued: the next
  // layer's dequantisation (on its side stream) may refill those buffers once the compute stream
  // is past that point, while the rest of this layer still runs.
  std::array<StreamMark, kLinearModules>* buffer_free = nullptr;
  void release_group(int group) const;
  // Where a group of several adapted modules (q/k/v, gate/up) runs its adapters' dB and d(xa)
  // products in backward, beside the base input-gradient GEMMs on the compute stream (null: on the
  // compute stream, after each GEMM). Those products read only dy, xa and B; what follows them
  // (dA and the adapters' part of dx) waits for them.
  SideStream* adapter_stream = nullptr;
  std::array<const LoraAdapter*, kLinearModules> lora{};
  std::array<LoraParams, kLinearModules> lora_params{};
  // DoRA's weight norms when the caller already has them (generation, where the weights do not
  // change between tokens); empty: the forward computes them.
  std::array<TensorView, kLinearModules> dora_norm{};
  TensorView d_input_norm, d_post_norm;
  std::array<TensorView, kLinearModules> d_weight;

 private:
  std::array<MatrixView, kLinearModules> weight_;
  std::array<StreamMark, kLinearModules> weight_ready_;
};

// Which modules a layer folds when lora_fold() (model/llama_model.h) is on: the one rule the model
// and the planner (src/plan/) both apply. Per module, the columns its folded weight adds after its
// base's (K_j above), 0 where its group is not folded: a group (q/k/v, o, gate/up, down) folds when
// every module is plain LoRA (rank > 0, not DoRA) on a quantised, frozen base whose rows are whole
// 64-value blocks (NF4's blocks, HQQ's groups: what the CPU's dequantisation writes a row at a
// time; every Llama width).
struct FoldCandidate {
  bool plain_lora_on_quantized_base = false;
  int64_t in = 0, rank = 0;
};
std::array<int64_t, kLinearModules> folded_columns(const std::array<FoldCandidate, kLinearModules>& modules);

// Everything the backward reads, in the activation dtype (rstd and lse in F32). Token rows are
// [N = B*T, features]. q and k are stored after RoPE (what attention saw).
// The buffers the layers of a pass share for what they recompute in the backward instead of keeping
// (ModelOptions::recompute_elementwise): the norm outputs (n1, later n2: one [N, C] buffer, since
// each is read only by its own group's GEMMs before the next is written) and h [N, I].
struct ElementwiseScratch {
  Tensor norm, h;
  void allocate(const LayerDims& d, DType dtype, Device device = Device::CPU);
};

struct LayerActivations {
  TensorView n1;             // input_layernorm output [N, C]
  Tensor rstd1;              // 1/rms [N]
  Tensor q, k, v;            // [N, H*D], [N, KV*D], [N, KV*D]
  Tensor att, lse;           // attention output [N, H*D], logsumexp F32 [B, H, T]
  Tensor x2;                 // residual after attention [N, C]
  TensorView n2;             // post_attention_layernorm output [N, C]
  Tensor rstd2;              // 1/rms [N]
  Tensor gate, up;           // [N, I] each
  TensorView h;              // [N, I]: silu(gate) * up
  // n1, n2 and h are this layer's own (kept from the forward), or, with an ElementwiseScratch,
  // views of the pass's shared buffers that layer_backward recomputes (two RMSNorms and a SwiGLU,
  // the forward's bits) just before each is read.
  bool recomputes_elementwise = false;
  Tensor own_n1, own_n2, own_h;
  // Per group, its LoRA adapters' dropout(x)·Aᵀ side by side [N, Σr] (empty where the group has none).
  std::array<Tensor, kLinearGroups> xa;
  // xa already holds this layer's values (a checkpointed layer keeps them from its forward): the
  // forward, as the recompute, runs only the adapters' B products, not the down products and their
  // dropout masks. The bits are the same.
  bool xa_kept = false;
  // att, lse and x2 already hold this layer's values (activation offload brought them back,
  // model/activation_offload.h): its recompute skips the attention forward and o_proj.
  bool attention_output_kept = false;
  // Per module with a DoRA adapter, what its backward reads (ops/dora.h's DoraSaved): xa [N, r],
  // z [N, out] and the weight norm F32 [out]; empty elsewhere.
  struct Dora {
    Tensor xa, z, norm;
  };
  std::array<Dora, kLinearModules> dora;

  // lora_ranks[m] = r of module m's adapter, 0 where there is none; `dora`: the adapters are DoRA's;
  // `shared`: n1, n2 and h live there (recomputed in the backward), else in this layer's own tensors.
  void allocate(const LayerDims& d, DType dtype, const std::array<int64_t, kLinearModules>& lora_ranks, bool dora,
                Device device = Device::CPU, const ElementwiseScratch* shared = nullptr);
  // att, lse and x2 alone (activation offload takes them away between a layer's forward and backward).
  void allocate_attention_output(const LayerDims& d, DType dtype, Device device = Device::CPU);
  int64_t nbytes() const;  // of the tensors it holds
};

// Per group, an xa [N, Σr] as LayerActivations holds it (empty where the group has no adapters;
// DoRA's adapters keep theirs per module instead).
std::array<Tensor, kLinearGroups> allocate_group_xa(const LayerDims& d, DType dtype,
                                                    const std::array<int64_t, kLinearModules>& lora_ranks,
                                                    Device device = Device::CPU);

// Gradient buffers one layer's backward uses (activation_grad_dtype), reused from layer to layer.
// Gradients whose lives do not overlap in layer_backward share memory: d_att (from o_proj's backward
// to attention's) lies over d_norm, whose MLP part is consumed before and attention part written
// after; dq, dk, dv (attention's) lie over dh (the MLP's, consumed by SwiGLU's backward). Where the
// gradients are in the activations' own dtype (bf16, fp32), dgate and dup have no buffers of their
// own: SwiGLU's backward writes them over the layer's gate and up, which it is the last to read,
// element for element (its kernels load an element's inputs before they store its outputs).
struct LayerGradScratch {
  Tensor d_norm;            // [N, C]: at a norm's output, then at its input
  Tensor d_att;             // [N, H*D], over d_norm
  Tensor dq, dk, dv;        // [N, H*D], [N, KV*D], [N, KV*D], over dh
  Tensor dh, dgate, dup;    // [N, I]; dgate and dup empty where they overwrite gate and up
  void allocate(const LayerDims& d, DType grad_dtype, DType activation_dtype, Device device = Device::CPU);
  // Where SwiGLU's backward writes d(gate) and d(up) in layer a's backward.
  std::pair<TensorView, TensorView> gate_up_grads(LayerActivations& a) const;

 private:
  Tensor norm_or_att_, mlp_or_qkv_;  // the memory the views above borrow
};
// LayerGradScratch's rules, which the memory plan (src/plan/) applies too: whether it writes
// d(gate) and d(up) over gate and up, and the widths of its two shared buffers.
inline bool gate_up_grads_in_place(DType grad_dtype, DType activation_dtype) { return grad_dtype == activation_dtype; }
inline int64_t layer_grad_norm_or_att_columns(const LayerDims& d) { return std::max(d.C, d.H * d.D); }
inline int64_t layer_grad_mlp_or_qkv_columns(const LayerDims& d) { return std::max(d.I, (d.H + 2 * d.KV) * d.D); }

// n1 = rmsnorm(x); q, k, v = linear(n1) (+ LoRA); RoPE on q and k for positions offset + t (or
// offset + positions[b, t] when given).
void attention_inputs_forward(LayerActivations& a, const TensorView& x, const LayerCompute& w, const LayerDims& d,
                              const RopeTable& rope, int64_t position_offset, const TensorView& positions = {});
// From a.att on: x2 = x + o_proj(att); n2 = rmsnorm(x2); out = x2 + down(silu(gate(n2)) * up(n2)).
void attention_output_mlp_forward(TensorView out, LayerActivations& a, const TensorView& x, const LayerCompute& w,
                                  const LayerDims& d);
// The whole layer with causal attention over the batch's own tokens (positions 0..T-1), or over
// each example of a packed row.
void layer_forward(TensorView out, LayerActivations& a, const TensorView& x, const LayerCompute& w,
                   const LayerDims& d, const RopeTable& rope, const RowSegments& segments = {});
// A checkpointed layer's recompute: layer_forward up to h, all its backward reads. The down
// projection (a fifth of the layer's GEMM FLOPs) and the residual add after it make the layer's
// output, which the backward does not read, so they are skipped. The down group's adapters must
// need nothing from it: plain LoRA with its xa kept (a.xa_kept), or none; not DoRA. With
// a.attention_output_kept it also skips the attention forward and o_proj (n2 = rmsnorm(x2)).
void layer_recompute(LayerActivations& a, const TensorView& x, const LayerCompute& w, const LayerDims& d,
                     const RopeTable& rope, const RowSegments& segments = {});

// d_resid: F32 [N, C], on entry the gradient of the layer's output, on return that of its input x.
// Adds the gradients of trainable weights and adapters of w. With a.recomputes_elementwise it
// first recomputes n1, n2 and h into the shared buffers (and rstd1, rstd2: the same values).
// Without input_gradient (nothing below the layer trains, nor its input norm: the first layer of a
// LoRA model) d_resid is left as it is on return, and the q/k/v input-gradient GEMMs, their
// adapters' part and the input norm's backward are skipped: every trainable gradient is the same.
void layer_backward(TensorView d_resid, LayerGradScratch& s, LayerActivations& a, const TensorView& x,
                    const LayerCompute& w, const LayerDims& d, const RopeTable& rope, const RowSegments& segments = {},
                    bool input_gradient = true);

}  // namespace fsdpq
