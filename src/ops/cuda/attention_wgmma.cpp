#include "ops/cuda/attention_wgmma.h"

#include <fmt/format.h>

#include <string>

#include "kernels/attention_sm90a.cuh"
#include "ops/cuda/kernel_args.h"
#include "runtime/log.h"

namespace fsdpq::cuda_ops {
namespace {

AttentionRouteLog& route_log() {
  static AttentionRouteLog log;
  return log;
}

enum class Pass { Forward, Backward };

void count_ran(Pass pass) { route_log().ran(pass == Pass::Backward); }

// Counts a declined call and logs its reason the first time it comes up for its pass.
bool decline(Pass pass, const std::string& why) {
  const char* name = pass == Pass::Forward ? "forward" : "backward";
  if (!route_log().declined(pass == Pass::Backward, std::string(name) + why)) return false;
  if (gpu_attention_kernels() == GpuAttentionKernels::Wgmma)
    log::warn("attention {} runs on the mma kernels, not the wgmma ones: {}", name, why);
  else
    log::info("attention {} runs on the mma kernels, not the Hopper (wgmma) ones: {}", name, why);
  return false;
}

// Why these operands are not for the kernel ("" when they are).
std::string why_not(const char* op, const TensorView& out, const TensorView& lse, const TensorView& q,
                    const TensorView& k, const TensorView& v) {
  if (const std::string& why = cuda::attention_sm90a_unavailable(); !why.empty()) return why;
  if (!cuda::attention_sm90a_supported(ktype(op, q), ktype(op, k), ktype(op, v), ktype(op, out), q.shape[3]))
    return fmt::format("q, k, v, out are {}, {}, {}, {} with head dim {}; it takes them all BF16 or all F16, head "
                       "dim 64 or 128",
                       dtype_name(q.dtype), dtype_name(k.dtype), dtype_name(v.dtype), dtype_name(out.dtype),
                       q.shape[3]);
  for (const TensorView* x : {&out, &lse, &q, &k, &v})
    if (!cuda::attention_sm90a_aligned(x->data)) return "an operand is not 16-byte aligned";
  return "";
}

}  // namespace

bool wgmma_attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                             const TensorView& v, const TensorView& segment_start) {
  constexpr const char* op = "attention_forward";
  if (const std::string why = why_not(op, out, lse, q, k, v); !why.empty()) return decline(Pass::Forward, why);
  cuda::attention_sm90a_forward(out.data, lse.as<float>(), q.data, k.data, v.data, ktype(op, q),
                                segment_start.as<const int32_t>(), q.shape[0],
                                q.shape[1], q.shape[2], k.shape[2], q.shape[3], cuda::stream());
  count_ran(Pass::Forward);
  return true;
}

bool wgmma_attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv, const TensorView& dout,
                              const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& out,
                              const TensorView& lse, const TensorView& segment_start,
                              const cuda::AttentionRopeBackward& rope) {
  constexpr const char* op = "attention_backward";
  // `out` may be of any type here (the backward reads it through load_any), so q stands in for it.
  if (const std::string why = why_not(op, q, lse, q, k, v); !why.empty()) return decline(Pass::Backward, why);
  // The gradients too: their stores write two columns at once (8 or 4 bytes).
  for (const TensorView* x : {&dout, &out, &dq, &dk, &dv})
    if (!cuda::attention_sm90a_aligned(x->data))
      return decline(Pass::Backward, "dout, out, dq, dk or dv is not 16-byte aligned");
  const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], KV = k.shape[2], D = q.shape[3];
  if (H == 0) return decline(Pass::Backward, "there are no heads");
  const bool segmented = segment_start.data != nullptr;
  if (segmented && !cuda::attention_sm90a_backward_takes_segments(T))
    return decline(Pass::Backward, fmt::format("packed rows of {} tokens are longer than it takes", T));
  const cuda::KType type = ktype(op, q), dout_type = ktype(op, dout);
  const int64_t bytes = cuda::attention_sm90a_backward_workspace_bytes(type, dout_type, B, T, H, D, segmented);
  Tensor workspace = Tensor::empty(Shape{(bytes + 3) / 4}, DType::F32, Device::CUDA);
  cuda::attention_sm90a_backward(dq.data, ktype(op, dq), dk.data, ktype(op, dk), dv.data, ktype(op, dv), dout.data,
                                 dout_type, q.data, k.data, v.data, type, out.data, ktype(op, out),
                                 lse.as<const float>(), segment_start.as<const int32_t>(), workspace.data<float>(), B,
                                 T, H, KV, D, cuda::stream(), rope);
  count_ran(Pass::Backward);
  return true;
}

WgmmaAttentionCounts wgmma_attention_counts() { return route_log().counts(); }

}  // namespace fsdpq::cuda_ops
