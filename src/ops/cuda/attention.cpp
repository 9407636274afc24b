// Causal attention on the GPU: cuDNN's fused attention where it is chosen and accepts the pass
// (ops/attention_cudnn.h), then the Hopper wgmma kernels where they are chosen (every route but
// mma and simt) and fit (ops/cuda/attention_wgmma.h), the tensor-core kernels (kernels/attention_mma.cuh) where they are
// chosen and fit, else the SIMT ones (kernels/attention.cuh). ops/attention.cpp checks the
// arguments and holds the CPU reference.
//
// Packed rows (segment_start, ops/attention.h): the SIMT, mma and wgmma kernels take them in both
// passes. A route without them declines a segmented pass through its constant below and the pass
// falls through to the next: on Hopper a packed step runs on wgmma; cuDNN takes none yet.
#include "kernels/attention.cuh"
#include "kernels/attention_mma.cuh"
#include "ops/attention.h"
#include "ops/attention_cudnn.h"
#include "ops/checks.h"
#include "ops/cuda/attention_wgmma.h"
#include "ops/cuda/kernel_args.h"
#include "ops/cuda_ops.h"

namespace fsdpq::cuda_ops {
namespace {

// q [B, T, H, D] and k [B, T, KV, D], checked by the op; D must fit the kernels.
struct Dims {
  int64_t B, T, H, KV, D;
};

Dims dims_of(const char* op, const TensorView& q, const TensorView& k) {
  const Dims d{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3]};
  check_that(d.D >= 1 && d.D <= cuda::kAttentionMaxHeadDim, "{}: head dim {} is not in [1, {}] on CUDA", op, d.D,
             cuda::kAttentionMaxHeadDim);
  return d;
}

// Which routes run packed rows (segment_start given); the rest decline and the pass falls through.
constexpr bool kCudnnAcceptsSegments = false;
constexpr bool kWgmmaForwardAcceptsSegments = true;
constexpr bool kWgmmaBackwardAcceptsSegments = true;
constexpr bool kMmaAcceptsSegments = true;

bool segmented(const TensorView& segment_start) { return segment_start.data != nullptr; }

// The tensor-core kernels take a pass unless the SIMT ones are chosen (gpu_attention_kernels) and when
// its types, head dim and pointer alignment (16-byte vector loads) suit them; `dout` is null in the forward.
bool use_mma_attention(const char* op, const Dims& d, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const void* dout) {
  return gpu_attention_kernels() != GpuAttentionKernels::Simt &&
         cuda::attention_mma_supported(ktype(op, q), ktype(op, k), ktype(op, v), ktype(op, out), d.D) &&
         cuda::attention_mma_aligned(q.data) && cuda::attention_mma_aligned(k.data) &&
         cuda::attention_mma_aligned(v.data) && (dout == nullptr || cuda::attention_mma_aligned(dout));
}

}  // namespace

void attention_forward(TensorView out, TensorView lse, const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& segment_start) {
  constexpr const char* op = "attention_forward";
  const Dims d = dims_of(op, q, k);
  const bool packed = segmented(segment_start);
  if ((!packed || kCudnnAcceptsSegments) && cudnn_attention_chosen() && cudnn_attention_forward(out, lse, q, k, v))
    return;
  if ((!packed || kWgmmaForwardAcceptsSegments) && wgmma_attention_chosen() &&
      wgmma_attention_forward(out, lse, q, k, v, segment_start))
    return;
  if ((!packed || kMmaAcceptsSegments) && use_mma_attention(op, d, q, k, v, out, nullptr)) {
    cuda::attention_mma_forward(out.data, ktype(op, out), lse.as<float>(), q.data, ktype(op, q), k.data, ktype(op, k),
                                v.data, ktype(op, v), segment_start.as<const int32_t>(), d.B, d.T, d.H, d.KV, d.D,
                                cuda::stream());
    return;
  }
  cuda::attention_forward(out.data, ktype(op, out), lse.as<float>(), q.data, ktype(op, q), k.data, ktype(op, k),
                          v.data, ktype(op, v), segment_start.as<const int32_t>(), d.B, d.T, d.H, d.KV, d.D,
                          cuda::stream());
}

namespace {

// The backward's routes in order; rope (may be null) goes to the one route that applies it as it
// stores dq and dk, the wgmma kernels. True when it was applied.
bool backward(TensorView dq, TensorView dk, TensorView dv, const TensorView& dout, const TensorView& q,
              const TensorView& k, const TensorView& v, const TensorView& out, const TensorView& lse,
              const TensorView& segment_start, const cuda::AttentionRopeBackward* rope) {
  constexpr const char* op = "attention_backward";
  const Dims d = dims_of(op, q, k);
  const bool packed = segmented(segment_start);
  if ((!packed || kCudnnAcceptsSegments) && cudnn_attention_chosen() &&
      cudnn_attention_backward(dq, dk, dv, dout, q, k, v, out, lse))
    return false;
  if ((!packed || kWgmmaBackwardAcceptsSegments) && wgmma_attention_chosen() &&
      wgmma_attention_backward(dq, dk, dv, dout, q, k, v, out, lse, segment_start,
                               rope != nullptr ? *rope : cuda::AttentionRopeBackward{}))
    return rope != nullptr;
  // rowsum(dout * out) per query row, the one temporary (B * H * T floats).
  Tensor drow = Tensor::empty(Shape{d.B, d.H, d.T}, DType::F32, Device::CUDA);
  if ((!packed || kMmaAcceptsSegments) && use_mma_attention(op, d, q, k, v, out, dout.data)) {
    // drow (B * H * T floats) is the mma backward's workspace too (attention_mma_workspace_floats).
    cuda::attention_mma_backward(dq.data, ktype(op, dq), dk.data, ktype(op, dk), dv.data, ktype(op, dv), dout.data,
                                 ktype(op, dout), q.data, ktype(op, q), k.data, ktype(op, k), v.data, ktype(op, v),
                                 out.data, ktype(op, out), lse.as<const float>(), segment_start.as<const int32_t>(),
                                 drow.data<float>(), d.B, d.T, d.H, d.KV, d.D, cuda::stream());
    return false;
  }
  cuda::attention_backward(dq.data, ktype(op, dq), dk.data, ktype(op, dk), dv.data, ktype(op, dv), dout.data,
                           ktype(op, dout), q.data, ktype(op, q), k.data, ktype(op, k), v.data, ktype(op, v),
                           out.data, ktype(op, out), lse.as<const float>(), segment_start.as<const int32_t>(),
                           drow.data<float>(), d.B, d.T, d.H, d.KV, d.D, cuda::stream());
  return false;
}

}  // namespace

void attention_backward(TensorView dq, TensorView dk, TensorView dv, const TensorView& dout, const TensorView& q,
                        const TensorView& k, const TensorView& v, const TensorView& out, const TensorView& lse,
                        const TensorView& segment_start) {
  backward(dq, dk, dv, dout, q, k, v, out, lse, segment_start, nullptr);
}

bool attention_rope_backward(TensorView dq, TensorView dk, TensorView dv, const TensorView& dout, const TensorView& q,
                             const TensorView& k, const TensorView& v, const TensorView& out, const TensorView& lse,
                             const TensorView& segment_start, const RopeTable& table, int64_t position_offset,
                             const TensorView& positions) {
  upload_rope_tables(table);
  const cuda::AttentionRopeBackward rope{table.cos_device.data<float>(), table.sin_device.data<float>(),
                                         positions.as<const int32_t>(), position_offset};
  return backward(dq, dk, dv, dout, q, k, v, out, lse, segment_start, &rope);
}

}  // namespace fsdpq::cuda_ops
