// runs_on_cuda, where every op picks its device (ops/dispatch.h). No kernel runs here: a CUDA
// operand is a view whose memory is never touched, so the tests run in every build, GPU or not.
#include "ops/checks.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

namespace fsdpq {
namespace {

// A view that claims to live on the GPU; runs_on_cuda only reads where it lives.
TensorView cuda_view(float& memory) { return TensorView{&memory, DType::F32, Shape{1}, Device::CUDA}; }

TEST(OpsDispatch, CpuOperandsRunOnTheCpuAndViewsWithoutDataDoNotCount) {
  Tensor a = Tensor::zeros(Shape{4}, DType::F32), b = Tensor::zeros(Shape{4}, DType::BF16);
  const TensorView absent{nullptr, DType::F32, Shape{4}, Device::CUDA};  // an optional output left out
  EXPECT_FALSE(runs_on_cuda("op", {a, b, absent}));
}

TEST(OpsDispatch, OperandsOnTwoDevicesAreALogicErrorNamingThem) {
  Tensor a = Tensor::zeros(Shape{4}, DType::F32);
  float memory = 0.0f;
  try {
    runs_on_cuda("residual_add", {a, cuda_view(memory)});
    FAIL() << "expected a logic_error";
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(), "residual_add: operands on different devices (F32[4] on CPU, F32[1] on CUDA)");
  }
  // An op checks before it reads: the mix stops it with the same error.
  EXPECT_THROW(residual_add(a, a, TensorView{&memory, DType::F32, Shape{4}, Device::CUDA}), std::logic_error);
}

// With CUDA built in, the op hands CUDA operands to its CUDA implementation; without, a CUDA
// operand can only be a programming error, and this is the one error that says so.
TEST(OpsDispatch, CudaOperandsGoToCudaOrAreTheOneErrorOfABuildWithoutIt) {
  float memory = 0.0f;
  if (kWithCuda) {
    EXPECT_TRUE(runs_on_cuda("scale_in_place", {cuda_view(memory)}));
    return;
  }
  try {
    scale_in_place(cuda_view(memory), 2.0f);
    FAIL() << "expected a logic_error";
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(), "scale_in_place: CUDA operands, but this fsdpq was built without CUDA");
  }
}

// The checks an op makes before it picks its device must pass views on either device; only the CPU
// implementation's own checks may insist on the CPU (a GPU run of DoRA once stopped at this).
TEST(OpsDispatch, ChecksBeforeDispatchAcceptEitherDeviceAndCpuChecksOnlyTheCpu) {
  float memory = 0.0f;
  EXPECT_NO_THROW(check_dtype("op", "P", cuda_view(memory), DType::F32));
  EXPECT_NO_THROW(check_float("op", "P", cuda_view(memory)));
  EXPECT_THROW(check_dtype("op", "P", cuda_view(memory), DType::I32), std::logic_error);
  try {
    check_cpu_dtype("dora_row_norms", "P", cuda_view(memory), DType::F32);
    FAIL() << "expected a logic_error";
  } catch (const std::logic_error& e) {
    EXPECT_STREQ(e.what(), "dora_row_norms: P is F32[1] on CUDA, but this is the CPU implementation");
  }
}

}  // namespace
}  // namespace fsdpq
