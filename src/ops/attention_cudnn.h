// The cuDNN route of attention_forward / attention_backward (ops/attention.h): the default (auto)
// and FSDPQ_ATTENTION=cudnn (the backward deterministic), or cudnn-nondeterministic (cuDNN's faster
// backward, whose dQ sums vary in order from run to run).
//
// The op asks this route first. It takes a call when q, k, v and out share one 16-bit type
// (BF16 or F16), every operand is 16-byte aligned, and cuDNN runs the shape
// (backend/cudnn_sdpa.h); dout and the gradients may be of any float type (converted through
// 16-bit buffers of q's type: dout rounded as the tensor-core kernels round it, the gradients
// rounded once more before widening). Otherwise it declines — cuDNN missing or too old, other
// types, a shape cuDNN refuses, a graph that breaks the memory rule — and the op runs its own
// kernels (the tensor-core ones where they apply). Each reason is logged once: as a warning when
// cuDNN was asked for by name, as information under the default (auto).
#pragma once
#include <cstdint>

#include "backend/tensor.h"
#include "ops/attention.h"
#include "ops/attention_route_log.h"

namespace fsdpq {

inline bool cudnn_attention_chosen() {
  const GpuAttentionKernels k = gpu_attention_kernels();
  return k == GpuAttentionKernels::Auto || k == GpuAttentionKernels::Cudnn ||
         k == GpuAttentionKernels::CudnnNondeterministic;
}

// True when cuDNN ran the pass; false when it declined and queued nothing. The caller has checked
// the op's shapes and devices.
bool cudnn_attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                             const TensorView& v);
bool cudnn_attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const TensorView& lse);

// How often the route ran or declined, since the process started (the tests check which kernels ran).
using CudnnAttentionCounts = AttentionRouteCounts;
CudnnAttentionCounts cudnn_attention_counts();

}  // namespace fsdpq
