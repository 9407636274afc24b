#include "ops/attention_cudnn.h"

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "runtime/log.h"

#ifdef FSDPQ_WITH_CUDA
#include "backend/cudnn_sdpa.h"
#include "ops/elementwise.h"
#endif

namespace fsdpq {
namespace {

AttentionRouteLog& route_log() {
  static AttentionRouteLog log;
  return log;
}

[[maybe_unused]] void count_ran(bool backward) { route_log().ran(backward); }

// Counts a declined call and logs its reason the first time it comes up.
bool decline(bool backward, const std::string& why) {
  if (!route_log().declined(backward, why)) return false;
  const char* pass = backward ? "backward" : "forward";
  if (gpu_attention_kernels() == GpuAttentionKernels::Auto)
    log::info("attention {} runs on fsdpq's own kernels, not cuDNN: {}", pass, why);
  else
    log::warn("attention {} runs on fsdpq's own kernels, not cuDNN: {}", pass, why);
  return false;
}

#ifdef FSDPQ_WITH_CUDA
// cuDNN's kernels load 16 bytes at a time.
bool aligned16(std::initializer_list<TensorView> operands) {
  for (const TensorView& x : operands)
    if (reinterpret_cast<uintptr_t>(x.data) % 16 != 0) return false;
  return true;
}

// The shape cuDNN sees, or why these operands are not for it (types, alignment).
std::optional<cudnn::SdpaShape> sdpa_shape(const TensorView& q, const TensorView& k, const TensorView& v,
                                           const TensorView& out, const TensorView& lse, std::string* why_not) {
  const DType t = q.dtype;
  if ((t != DType::BF16 && t != DType::F16) || k.dtype != t || v.dtype != t || out.dtype != t) {
    *why_not = fmt::format("q, k, v, out are {}, {}, {}, {}; cuDNN's attention takes them all BF16 or all F16",
                           dtype_name(q.dtype), dtype_name(k.dtype), dtype_name(v.dtype), dtype_name(out.dtype));
    return std::nullopt;
  }
  if (!aligned16({q, k, v, out, lse})) {
    *why_not = "an operand is not 16-byte aligned";
    return std::nullopt;
  }
  return cudnn::SdpaShape{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3],
                          t == DType::BF16 ? cudnn::SdpaType::BF16 : cudnn::SdpaType::F16};
}

// An operand in the 16-bit type cuDNN reads and writes: x itself when it has that type, else a
// converted copy (dout) or a buffer converted into x after the call (the gradients).
struct Staged {
  TensorView view;
  Tensor storage;  // the copy or buffer, when one was needed
};

Staged staged_input(const TensorView& x, DType t) {
  if (x.dtype == t) return Staged{x, Tensor()};
  Tensor copy = Tensor::empty(x.shape, t, Device::CUDA);
  copy_convert(copy, x);  // dout rounded to q's type, as the tensor-core kernels round it
  const TensorView view = copy.view();
  return Staged{view, std::move(copy)};
}

Staged staged_output(const TensorView& x, DType t) {
  if (x.dtype == t) return Staged{x, Tensor()};
  Tensor buffer = Tensor::empty(x.shape, t, Device::CUDA);
  const TensorView view = buffer.view();
  return Staged{view, std::move(buffer)};
}

void unstage_output(const TensorView& destination, const Staged& staged) {
  if (staged.storage.defined()) copy_convert(destination, staged.view);
}
#endif

}  // namespace

#ifdef FSDPQ_WITH_CUDA

bool cudnn_attention_forward(const TensorView& out, const TensorView& lse, const TensorView& q, const TensorView& k,
                             const TensorView& v) {
  std::string why;
  const std::optional<cudnn::SdpaShape> shape = sdpa_shape(q, k, v, out, lse, &why);
  if (!shape) return decline(false, why);
  why = cudnn::why_not_sdpa_forward(*shape);
  if (!why.empty()) return decline(false, why);
  cudnn::sdpa_forward(*shape, out.data, lse.as<float>(), q.data, k.data, v.data);
  count_ran(false);
  return true;
}

bool cudnn_attention_backward(const TensorView& dq, const TensorView& dk, const TensorView& dv,
                              const TensorView& dout, const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const TensorView& lse) {
  std::string why;
  const std::optional<cudnn::SdpaShape> shape = sdpa_shape(q, k, v, out, lse, &why);
  if (!shape) return decline(true, why);
  if (!aligned16({dq, dk, dv, dout})) return decline(true, "a gradient or dout is not 16-byte aligned");
  const cudnn::SdpaBackward algorithm = gpu_attention_kernels() == GpuAttentionKernels::CudnnNondeterministic
                                            ? cudnn::SdpaBackward::Nondeterministic
                                            : cudnn::SdpaBackward::Deterministic;
  why = cudnn::why_not_sdpa_backward(*shape, algorithm);
  if (!why.empty()) return decline(true, why);
  const DType t = q.dtype;
  const Staged dout_t = staged_input(dout, t);
  const Staged dq_t = staged_output(dq, t), dk_t = staged_output(dk, t), dv_t = staged_output(dv, t);
  cudnn::sdpa_backward(*shape, algorithm, dq_t.view.data, dk_t.view.data, dv_t.view.data, dout_t.view.data, q.data,
                       k.data, v.data, out.data, lse.as<const float>());
  unstage_output(dq, dq_t);
  unstage_output(dk, dk_t);
  unstage_output(dv, dv_t);
  count_ran(true);
  return true;
}

#else  // built without CUDA: the op never asks (its CUDA branch is not built)

bool cudnn_attention_forward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                             const TensorView&) {
  return decline(false, "this fsdpq was built without CUDA");
}
bool cudnn_attention_backward(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                              const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                              const TensorView&) {
  return decline(true, "this fsdpq was built without CUDA");
}

#endif

CudnnAttentionCounts cudnn_attention_counts() { return route_log().counts(); }

}  // namespace fsdpq
