// The fused LoRA down product on Hopper's own instructions (sm_90a): xa[:, first_i : first_i + 64]
// = dropout_i(x) · A_iᵀ for a group of up to 3 adapters of rank 64 (kernels/lora_fused.cuh states
// the contract, the mask and the rounding; this is its down product for the groups it takes).
// Bulk tensor copies (TMA) bring x and every A_i tile through a shared-memory ring; two consumer
// warpgroups load their x rows into registers once per k step, mask them there per adapter (no
// masked copy anywhere) and multiply with wgmma, the masked registers as the A operand. The
// k range is split as lora_fused::down_splits says, partial sums summed in split order: the same
// scratch as the mma kernel, and bits that do not depend on the GPU's size.
//
// Built for sm_90a alone (CMakeLists.txt, *_sm90a.cu): callers ask lora_down_sm90a_unavailable()
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

// "" when the current GPU runs the kernel (compute capability 9.0 and its sm_90a image loads),
// else why not. Asked once per process.
const std::string& lora_down_sm90a_unavailable();

// As lora_fused_down (kernels/lora_fused.cuh), xa of x's type: workspace holds
// lora_fused::down_workspace_floats floats (none with one split).
void lora_down_sm90a(void* xa, KType xa_type, const void* x, KType type, const LoraFusedGroup& group, int64_t M,
                     int64_t in, float* workspace, cudaStream_t stream);

}  // namespace fsdpq::cuda
