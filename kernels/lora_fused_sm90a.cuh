// The fused LoRA path's products on Hopper's own instructions (sm_90a), for groups of up to 3
// adapters of rank 64 (kernels/lora_fused.cuh states the contract, the mask and the rounding; the
// mma kernels there keep the other groups):
//   down:        xa[:, first_i : first_i + 64] = dropout_i(x) · A_iᵀ
//   input grad:  dx += Σ_i keep_i ⊙ (1 / (1 - p)) ⊙ (dxa_i · A_i)
//   weight grad: dA_i += dxa_iᵀ · dropout_i(x)
// Bulk tensor copies (TMA) bring the operands through shared-memory rings; two consumer warpgroups
// apply each adapter's dropout where wgmma reads or writes: to x's rows in registers (the down
// product's A operand), to the products' accumulators (the input gradient), to a block of x in
// shared memory (the weight gradient's B operand) — so no masked copy of x reaches global memory. The down product splits the input width as
// lora_fused::down_splits says, partial sums added in split order: the mma kernel's scratch, and
// bits that do not depend on the GPU's size. docs/cuda.md has the design.
//
// Built for sm_90a alone (CMakeLists.txt, *_sm90a.cu): callers ask lora_fused_sm90a_unavailable()
// first.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/kernel_types.cuh"
#include "kernels/lora_fused.cuh"

namespace fsdpq::cuda {

// Whether the kernel takes the group: x and A of one 16-bit type, 1 to 3 adapters of rank 64 each
// (consecutive columns of xa), an input width that is a multiple of 64. The 16-byte alignment of
// x and every A, and xa of x's type, are the caller's to check (the copy engine needs the first).
bool lora_down_sm90a_takes(KType type, int64_t in, const LoraFusedGroup& group);

// "" when the current GPU runs these kernels (compute capability 9.0 and their sm_90a image loads),
// else why not. Asked once per process.
const std::string& lora_fused_sm90a_unavailable();

// As lora_fused_down (kernels/lora_fused.cuh), xa of x's type: workspace holds
// lora_fused::down_workspace_floats floats (none with one split). With x_copy, x is also copied
// there ([M, in] at row stride x_copy_stride, as lora_down_sm90a_copies_to says): each tile the
// kernel loads is stored back from shared memory, so x is read once for both.
void lora_down_sm90a(void* xa, KType xa_type, const void* x, KType type, const LoraFusedGroup& group, int64_t M,
                     int64_t in, float* workspace, cudaStream_t stream, void* x_copy = nullptr,
                     int64_t x_copy_stride = 0);

// Whether the down kernel can copy x to x_copy: 16-byte aligned, a row stride of at least `in`
// elements and a multiple of 8 (the copy engine's 16-byte strides).
bool lora_down_sm90a_copies_to(const void* x_copy, int64_t stride, int64_t in);

// Whether the input-gradient kernel takes the group: as lora_down_sm90a_takes, and in % 128 == 0.
bool lora_input_grad_sm90a_takes(KType type, int64_t in, const LoraFusedGroup& group);

// As lora_fused_input_grad (kernels/lora_fused.cuh): dx += Σ_i keep_i ⊙ (1 / (1 - p)) ⊙
// (dxa_i · A_i), or with accumulate false dx = that sum (dx's old values unread), one rounding of
// dx (of x's 16-bit type or F32); dxa of x's type.
void lora_input_grad_sm90a(void* dx, KType dx_type, bool accumulate, const void* dxa, KType type,
                           const LoraFusedGroup& group, int64_t M, int64_t in, cudaStream_t stream);

// Whether the weight-gradient kernel takes the group: as lora_down_sm90a_takes, and in % 128 == 0.
bool lora_weight_grad_sm90a_takes(KType type, int64_t in, const LoraFusedGroup& group);

// As lora_fused_weight_grad (kernels/lora_fused.cuh): dA[i] (fp32 [64, in]) += dxa_iᵀ · dropout_i(x),
// through lora_fused::weight_grad_workspace_floats floats of per-chunk partial sums (the mma
// kernel's chunks and scratch); x and dxa of one 16-bit type.
void lora_weight_grad_sm90a(float* const* dA, const void* dxa, const void* x, KType type, const LoraFusedGroup& group,
                            int64_t M, int64_t in, float* workspace, cudaStream_t stream);

}  // namespace fsdpq::cuda
