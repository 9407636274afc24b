// The CUDA backend's implementation of each op: the op's own arguments, already checked by the op
// in src/ops, with every operand on the GPU (ggml's backend interface, as declarations). Each op
// calls its implementation through ops/dispatch.h; the definitions (src/ops/cuda/, one file per op
// family, over the launchers in kernels/) exist only in builds with CUDA. Work is queued on the
// compute stream; a result the host needs (a sum, a loss) is copied back.
#pragma once
#include <cstdint>
#include <span>

#include "backend/matrix_view.h"
#include "backend/tensor.h"
#include "ops/cross_entropy.h"
#include "ops/gemm.h"
#include "ops/lora.h"
#include "ops/rope.h"

namespace fsdpq {
struct BlockCopy;  // ops/elementwise.h
}  // namespace fsdpq

namespace fsdpq::cuda_ops {

// elementwise.h
void residual_add(TensorView out, const TensorView& a, const TensorView& b);
void scale_in_place(TensorView x, float factor);
void accumulate(TensorView dst, const TensorView& src);
void add_scaled(TensorView y, const TensorView& x, float factor);
void copy_convert(TensorView dst, const TensorView& src);
void copy_block(const MatrixView& dst, const MatrixView& src, float scale);
void copy_blocks(std::span<const BlockCopy> copies);
void fill_zero(TensorView x);
double sum_of_squares(const TensorView& x);

// embedding.h (ids checked against the vocabulary on the GPU: the CPU's UserError)
void embedding_forward(TensorView out, const TensorView& ids, const TensorView& table);
void embedding_backward(TensorView dtable, const TensorView& ids, const TensorView& dout);

// rmsnorm.h
void rmsnorm_forward(TensorView y, TensorView rstd, const TensorView& x, const TensorView& weight, float eps);
void rmsnorm_backward(TensorView dx, TensorView dweight, const TensorView& dy, const TensorView& x,
                      const TensorView& weight, const TensorView& rstd);
// rmsnorm.h's fused pairs (frozen weight only, for the backward); false, with nothing queued, where
// the rows do not fit the fused kernels (the op then runs the pair).
bool residual_rmsnorm_forward(TensorView x2, TensorView y, TensorView rstd, const TensorView& residual,
                              const TensorView& weight, float eps);
bool rmsnorm_backward_add(TensorView d_acc, const TensorView& dy, const TensorView& x, const TensorView& weight,
                          const TensorView& rstd);

// rope.h: rotates x in place by the table's angles (sign -1: the backward).
// The table's cos and sin on the GPU (RopeTable::cos_device, sin_device), uploaded at the first call.
void upload_rope_tables(const RopeTable& table);
void rope_rotate(const char* op, TensorView x, const RopeTable& table, int64_t position_offset,
                 const TensorView& positions, float sign);

// attention.h (the tensor-core kernels where gpu_attention_kernels() and the operands allow)
void attention_forward(TensorView out, TensorView lse, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& segment_start);
void attention_backward(TensorView dq, TensorView dk, TensorView dv, const TensorView& dout, const TensorView& q,
                        const TensorView& k, const TensorView& v, const TensorView& out, const TensorView& lse,
                        const TensorView& segment_start);
// attention_backward that also applies RoPE's backward to dq and dk where the route can as it
// stores them (the wgmma kernels): true then; false when the pass ran unrotated and the caller
// rotates (ops/attention.h, attention_rope_backward).
bool attention_rope_backward(TensorView dq, TensorView dk, TensorView dv, const TensorView& dout, const TensorView& q,
                             const TensorView& k, const TensorView& v, const TensorView& out, const TensorView& lse,
                             const TensorView& segment_start, const RopeTable& table, int64_t position_offset,
                             const TensorView& positions);

// swiglu.h
void swiglu_forward(TensorView h, const TensorView& gate, const TensorView& up);
void swiglu_backward(TensorView dgate, TensorView dup, const TensorView& dh, const TensorView& gate,
                     const TensorView& up);

// cross_entropy.h
CrossEntropyResult cross_entropy_forward_backward(const TensorView& logits, const TensorView& labels, int64_t B,
                                                  int64_t T, TensorView dlogits, float grad_scale);
// cross_entropy.h's row op: the kernel alone (the labels checked on the host by the caller).
void cross_entropy_rows_forward_backward(const TensorView& logits, const TensorView& labels, int64_t B, int64_t T,
                                         TensorView dlogits, float grad_scale, TensorView row_loss);

// lora.h's dropout (the mask of kernels/lora_dropout_mask.h): outs[i] = x · keep_i / (1 - p) for
// the mixed key mixed_keys[i], in x's dtype; and dx += keep_j / (1 - p) ⊙ g_j for each j in turn
// (every g_j of dx's shape and of one float dtype, rounded to dx's after each j; `overwrite`: dx
// starts at 0, unread).
void lora_dropout_apply(std::span<const TensorView> outs, const TensorView& x, std::span<const uint64_t> mixed_keys,
                        uint32_t threshold, float keep_scale);
void lora_dropout_accumulate(TensorView dx, bool overwrite, std::span<const TensorView> gs,
                             std::span<const uint64_t> mixed_keys, uint32_t threshold, float keep_scale);

// lora.h's fused group products (kernels/lora_fused.cuh) for a group whose dropout is active, with
// the group's mask: xa = [dropout_i(x) · A_iᵀ]_i; and dA_i += dxa_iᵀ · dropout_i(x), dx += (or with
// accumulate_dx false, =) the adapters' masked dxa_i · A_i (dx skipped when dx.data is null; dxa in
// A's dtype). Each returns
// false and queues nothing where the kernels do not take the group (lora.h, GpuLoraKernels).
struct LoraGroupMask {
  std::span<const uint64_t> mixed_keys;
  uint32_t threshold = 0;
  float keep_scale = 1.0f;
};
// x_copy (may be null; then copied may be too): where the caller wants x copied, x's shape and
// dtype; *copied says whether the kernel did it (the Hopper down kernel stores the x tiles it
// loads) or left it to the caller.
bool lora_fused_forward(TensorView xa, const TensorView& x, std::span<const LoraSite> sites, const LoraGroupMask& mask,
                        const MatrixView* x_copy = nullptr, bool* copied = nullptr);
bool lora_fused_backward_input(TensorView dx, bool accumulate_dx, std::span<const TensorView> dAs,
                               const TensorView& dxa, const TensorView& x, std::span<const LoraSite> sites,
                               const LoraGroupMask& mask);
// Whether groups with ranks other than 64 run the Hopper kernels as rank-64 slots where those run
// (FSDPQ_LORA_RANK_SLOTS, 1 by default; ops/cuda/lora_fused.cpp); else the mma kernels or the
// separate products take them. Tests set it directly.
bool lora_rank_slots();
void set_lora_rank_slots(bool on);
// How many group products the fused kernels ran since the process started, and how many of their
// down products, input and weight gradients the Hopper kernels took (kernels/lora_fused_sm90a.cuh;
// the tests check them).
int64_t lora_fused_runs();
int64_t lora_down_sm90a_runs();
int64_t lora_input_grad_sm90a_runs();
int64_t lora_weight_grad_sm90a_runs();
// Whether this GPU runs the Hopper fused LoRA kernels (kernels/lora_fused_sm90a.cuh): an H100 or
// H200 whose driver loads their sm_90a image. Needs cuda_init().
bool hopper_lora_kernels_run();

// dora.h's elementwise pieces (kernels/dora.cuh).
void dora_row_norms(TensorView norm, const TensorView& P);
void dora_norm_from_parts(TensorView norm, const TensorView& W, const TensorView& B, const TensorView& G,
                          const TensorView& H, float scaling);
void dora_magnitude_scale(TensorView g, const TensorView& magnitude, const TensorView& norm);
void dora_scale_columns(TensorView out, const TensorView& in, const TensorView& g, float offset, bool accumulate);
void dora_magnitude_backward(TensorView dm, const TensorView& dy, const TensorView& z, const TensorView& norm);

// How an accumulating product (beta 1) into a 16-bit output adds: OutputType, cuBLAS's fast path,
// rounds the product before adding C (an addend below half C's spacing is lost, as in PEFT);
// Pedantic (COMPUTE_32F_PEDANTIC) rounds the sum once, as the CPU does, ~24x slower. The
// environment's FSDPQ_GEMM_ACCUMULATE (output-type, pedantic) sets it; tests set it directly.
enum class GemmAccumulate { OutputType, Pedantic };
GemmAccumulate gemm_accumulate();
void set_gemm_accumulate(GemmAccumulate accumulate);

// matmul.h's product on cuBLAS (src/ops/cuda/cublas_gemm.cpp has the operand rules).
void gemm(const MatrixOutput& c, const MatrixOperand& a, const MatrixOperand& b, bool accumulate, float scale);

}  // namespace fsdpq::cuda_ops
