// Causal grouped-query attention forward on Hopper's own instructions (sm_90a), FlashAttention-3's
// design: bulk tensor copies (TMA) bring Q once and K, V tiles through a shared-memory pipeline,
// and two warpgroups multiply with wgmma while their softmax overlaps the tensor cores. The same
// contract as attention_mma_forward (kernels/attention_mma.cuh) for q, k, v and out of one 16-bit
// type, so that backward (and the CPU op) reads what it writes: q [B, T, H, D]; k, v [B, T, KV, D];
// out [B, T, H, D]; lse fp32 [B, H, T], the natural-log logsumexp of each row's scores; query head
// h reads kv head h / (H / KV); scale 1 / sqrt(D); P rounded to the 16-bit type before P V.
// Opt-in: FSDPQ_ATTENTION=wgmma (src/ops/cuda/attention_wgmma.h); docs/cuda.md has the design.
//
// Built for sm_90a alone (CMakeLists.txt, *_sm90a.cu): that machine code runs on compute
// capability 9.0 only, so callers ask attention_sm90a_unavailable() first.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// q, k, v and out all BF16 or all F16; head dim 64 or 128.
bool attention_sm90a_supported(KType q, KType k, KType v, KType out, int64_t D);

// The copy engine reads and writes through 16-byte aligned base addresses.
inline bool attention_sm90a_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// "" when the current GPU runs the kernel (compute capability 9.0 and its sm_90a image loads),
// else why not. Asked once per process.
const std::string& attention_sm90a_unavailable();

// `type` is the KType of q, k, v and out (all the same); pointers 16-byte aligned. segment_start:
// packed rows as attention_mma_forward takes them (kernels/attention_mma.cuh), nullptr for plain
// causal attention.
void attention_sm90a_forward(void* out, float* lse, const void* q, const void* k, const void* v, KType type,
                             const int32_t* segment_start, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                             cudaStream_t stream);

// The backward (kernels/attention_backward_sm90a.cu): deterministic, every gradient written once.
// dq, dk, dv of any KType; dout of any KType, rounded to `type` (what autocast does; drow uses the
// rounded dout too). The workspace holds drow (B·H·T floats) and, when dout_type != type, dout
// rounded to `type`, and with segments each 64-query tile's smallest start:
// attention_sm90a_backward_workspace_bytes of it, 16-byte aligned. segment_start as the forward
// takes it (nullptr: plain causal), for T where attention_sm90a_backward_takes_segments.
int64_t attention_sm90a_backward_workspace_bytes(KType type, KType dout_type, int64_t B, int64_t T, int64_t H,
                                                 int64_t D, bool segmented);
bool attention_sm90a_backward_takes_segments(int64_t T);

// RoPE's backward (ops/rope.h: the rotation by the opposite angle) applied where the backward
// stores dq and dk, in fp32 before their one rounding: cos, sin F32 [positions, D] on the device
// (cos[p, i] = cos[p, i + D/2]), token (b, t) at position offset + (positions ? positions[b, t] : t)
// (positions I32 [B, T]; every position within the tables: the caller's to check). cos null: dq
// and dk are stored unrotated.
struct AttentionRopeBackward {
  const float* cos = nullptr;
  const float* sin = nullptr;
  const int32_t* positions = nullptr;
  int64_t offset = 0;
};

void attention_sm90a_backward(void* dq, KType dq_type, void* dk, KType dk_type, void* dv, KType dv_type,
                              const void* dout, KType dout_type, const void* q, const void* k, const void* v,
                              KType type, const void* out, KType out_type, const float* lse,
                              const int32_t* segment_start, void* workspace, int64_t B, int64_t T, int64_t H,
                              int64_t KV, int64_t D, cudaStream_t stream, const AttentionRopeBackward& rope = {});

}  // namespace fsdpq::cuda
