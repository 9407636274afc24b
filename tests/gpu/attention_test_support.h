// Shared by the attention GPU tests of the cuDNN route (ops_attention_routes_gpu_test.cpp,
// ops_attention_cudnn_gpu_test.cpp): random inputs, the CPU op's results on them, switching the
// op's kernels for one scope, and the rule for tests that need cuDNN.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "backend/cudnn_library.h"
#include "backend/cudnn_sdpa.h"
#include "gpu/op_parity.h"
#include "ops/attention.h"

namespace fsdpq::test {

struct AttentionCase {
  int64_t B, T, H, KV, D;
  DType in;          // q, k, v and out
  DType dout, grad;  // dout; dq, dk, dv
  Shape q_shape() const { return Shape{B, T, H, D}; }
  Shape kv_shape() const { return Shape{B, T, KV, D}; }
  Shape lse_shape() const { return Shape{B, H, T}; }
  cudnn::SdpaShape sdpa() const {
    return cudnn::SdpaShape{B, T, H, KV, D, in == DType::BF16 ? cudnn::SdpaType::BF16 : cudnn::SdpaType::F16};
  }
  std::string name() const {
    return "B" + std::to_string(B) + " T" + std::to_string(T) + " H" + std::to_string(H) + " KV" + std::to_string(KV) +
           " D" + std::to_string(D) + " " + std::string(dtype_name(in)) + "/" + std::string(dtype_name(dout)) + "/" +
           std::string(dtype_name(grad));
  }
};

// Inputs on the CPU: q and k in [-2, 2) give peaked softmax rows (scores of several units), v
// and dout in [-1, 1).
struct AttentionInputs {
  Tensor q, k, v, dout;
  AttentionInputs(const AttentionCase& c, uint32_t seed)
      : q(random_tensor(c.q_shape(), c.in, seed, -2.0f, 2.0f)),
        k(random_tensor(c.kv_shape(), c.in, seed + 1, -2.0f, 2.0f)),
        v(random_tensor(c.kv_shape(), c.in, seed + 2)),
        dout(random_tensor(c.q_shape(), c.dout, seed + 3)) {}
};

// The same on the GPU, with room for one forward's and one backward's results.
struct GpuAttention {
  Tensor q, k, v, dout, out, lse, dq, dk, dv;
  GpuAttention(const AttentionCase& c, const AttentionInputs& in)
      : q(on_gpu(in.q)),
        k(on_gpu(in.k)),
        v(on_gpu(in.v)),
        dout(on_gpu(in.dout)),
        out(Tensor::empty(c.q_shape(), c.in, Device::CUDA)),
        lse(Tensor::empty(c.lse_shape(), DType::F32, Device::CUDA)),
        dq(Tensor::empty(c.q_shape(), c.grad, Device::CUDA)),
        dk(Tensor::empty(c.kv_shape(), c.grad, Device::CUDA)),
        dv(Tensor::empty(c.kv_shape(), c.grad, Device::CUDA)) {}
  void forward() { attention_forward(out, lse, q, k, v); }
  // From the given out and lse (the CPU's, to compare the backward alone, or this forward's).
  void backward(const TensorView& out_in, const TensorView& lse_in) {
    attention_backward(dq, dk, dv, dout, q, k, v, out_in, lse_in);
  }
};

// The CPU op's forward and backward: the reference every GPU route is compared with.
struct AttentionReference {
  Tensor out, lse, dq, dk, dv;
  AttentionReference(const AttentionCase& c, const AttentionInputs& in)
      : out(Tensor::empty(c.q_shape(), c.in)),
        lse(Tensor::empty(c.lse_shape(), DType::F32)),
        dq(Tensor::empty(c.q_shape(), c.grad)),
        dk(Tensor::empty(c.kv_shape(), c.grad)),
        dv(Tensor::empty(c.kv_shape(), c.grad)) {
    attention_forward(out, lse, in.q, in.k, in.v);
    attention_backward(dq, dk, dv, in.dout, in.q, in.k, in.v, out, lse);
  }
};

// The op's GPU kernels for one scope; the process's choice comes back afterwards.
class UseAttentionKernels {
 public:
  explicit UseAttentionKernels(GpuAttentionKernels kernels) : saved_(gpu_attention_kernels()) {
    set_gpu_attention_kernels(kernels);
  }
  ~UseAttentionKernels() { set_gpu_attention_kernels(saved_); }
  UseAttentionKernels(const UseAttentionKernels&) = delete;
  UseAttentionKernels& operator=(const UseAttentionKernels&) = delete;

 private:
  GpuAttentionKernels saved_;
};

// Whether a test that needs cuDNN can run: "" when cuDNN is loaded, else why not. A missing cuDNN
// skips those tests, or fails them where FSDPQ_TEST_REQUIRE_CUDNN=1 (scripts/device_attention.sh).
inline std::string why_no_cudnn() {
  std::string why;
  return cudnn::library(&why) != nullptr ? "" : why;
}
inline bool cudnn_required() {
  const char* v = std::getenv("FSDPQ_TEST_REQUIRE_CUDNN");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace fsdpq::test

// In a test body: skip (or fail, where cuDNN is required) when cuDNN cannot be loaded.
#define FSDPQ_NEED_CUDNN()                                                     \
  do {                                                                         \
    const std::string why_ = ::fsdpq::test::why_no_cudnn();                    \
    if (!why_.empty()) {                                                       \
      if (::fsdpq::test::cudnn_required()) FAIL() << "no cuDNN: " << why_;     \
      GTEST_SKIP() << "no cuDNN: " << why_;                                    \
    }                                                                          \
  } while (0)
