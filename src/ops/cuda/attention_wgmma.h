// The wgmma route of attention_forward and attention_backward (ops/attention.h), chosen with
// FSDPQ_ATTENTION=wgmma: both passes on the Hopper kernels of kernels/attention_sm90a.cuh (the
// backward deterministic, as the mma one is). It takes a call when the GPU is
// compute capability 9.0 (the kernel is sm_90a machine code), q, k, v and out share one 16-bit
// type (BF16 or F16), the head dim is 64 or 128 and every operand is 16-byte aligned (the copy
// engine's rule). Otherwise it declines, logging the reason once (a warning on the wgmma route,
// information on the others), and the op runs the tensor-core kernels' choice (the lse both read is the same quantity, so either backward
// follows either forward).
#pragma once
#include "kernels/attention_sm90a.cuh"
#include <cstdint>

#include "backend/tensor.h"
#include "ops/attention.h"
#include "ops/attention_route_log.h"

namespace fsdpq::cuda_ops {

// The Hopper kernels run on the wgmma route and, where cuDNN declines a pass, on the auto and
// cuDNN routes (the fastest deterministic kernels fsdpq has); mma and simt keep their own.
inline bool wgmma_attention_chosen() {
  const GpuAttentionKernels k = gpu_attention_kernels();
  return k != GpuAttentionKernels::TensorCores && k != GpuAttentionKernels::Simt;
}

// True when the wgmma kernel ran the forward; false when it declined and queued nothing. The
// caller has checked the op's shapes and devices. segment_start: packed rows (ops/attention.h), or
// an empty view.
bool wgmma_attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                             const TensorView& v, const TensorView& segment_start = {});

// True when the wgmma kernels ran the backward (their workspace allocated here); false when they
// declined and queued nothing. segment_start as the forward takes it (packed rows up to 65536
// tokens; longer ones it declines). rope: RoPE's backward applied as dq and dk are stored.
bool wgmma_attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout,
                              const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                              const TensorView& lse, const TensorView& segment_start = {},
                              const cuda::AttentionRopeBackward& rope = {});

// How often the route ran or declined since the process started (the tests check which kernel ran).
using WgmmaAttentionCounts = AttentionRouteCounts;
WgmmaAttentionCounts wgmma_attention_counts();

}  // namespace fsdpq::cuda_ops
