// Bytes held by live CPU tensors (their nbytes, before alignment) and the most held at once since
// the last reset_host_tensor_peak(), counted by Tensor (backend/tensor.cpp): what the memory
// planner's CPU test compares its activation bytes with (tests/unit/memory_plan_test.cpp).
#pragma once
#include <cstdint>

namespace fsdpq {

struct HostTensorBytes {
  int64_t live = 0;
  int64_t peak = 0;
};
HostTensorBytes host_tensor_bytes();
void reset_host_tensor_peak();  // peak = live

}  // namespace fsdpq
