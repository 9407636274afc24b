// The wgmma route of attention_forward (ops/attention.h), chosen with FSDPQ_ATTENTION=wgmma: the
// forward on the Hopper kernel of kernels/attention_sm90a.cuh. It takes a call when the GPU is
// compute capability 9.0 (the kernel is sm_90a machine code), q, k, v and out share one 16-bit
// type (BF16 or F16), the head dim is 64 or 128 and every operand is 16-byte aligned (the copy
// engine's rule). Otherwise it declines, logging the reason once as a warning, and the op runs
// the tensor-core kernels' choice. The backward always runs on those (the lse it reads is the
// same quantity).
#pragma once
#include <cstdint>

#include "backend/tensor.h"

namespace fsdpq::cuda_ops {

// True when the wgmma kernel ran the forward; false when it declined and queued nothing. The
// caller has checked the op's shapes and devices.
bool wgmma_attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                             const TensorView& v);

// How often the route ran or declined since the process started (the tests check which kernel ran).
struct WgmmaAttentionCounts {
  int64_t forward_ran = 0, forward_declined = 0;
};
WgmmaAttentionCounts wgmma_attention_counts();

}  // namespace fsdpq::cuda_ops
