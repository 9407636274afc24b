// Host-side dispatch of the Hopper attention kernels' template parameters: the 16-bit operand
// type and the head dim they are instantiated for. Host code.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda::hopper {

// fn(T{}, std::integral_constant<int, D>{}) for `type` (BF16 or F16) and head dim D (64 or 128);
// anything else throws std::logic_error naming `who`.
template <class Fn>
void with_type_and_dim(KType type, int64_t D, const char* who, Fn&& fn) {
  auto with_dim = [&](auto tag) {
    if (D == 64)
      fn(tag, std::integral_constant<int, 64>{});
    else if (D == 128)
      fn(tag, std::integral_constant<int, 128>{});
    else
      throw std::logic_error(std::string(who) + ": head dim " + std::to_string(D) + " is not 64 or 128");
  };
  if (type == KType::BF16)
    with_dim(__nv_bfloat16{});
  else if (type == KType::F16)
    with_dim(__half{});
  else
    throw std::logic_error(std::string(who) + ": operands are not BF16 or F16");
}

}  // namespace fsdpq::cuda::hopper
