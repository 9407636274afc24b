// The dynamic shared memory of the Hopper kernels, aligned as their tiles need it. Device code.
#pragma once
#include <cstdint>

namespace fsdpq::cuda::hopper {

// `raw` (the kernel's extern __shared__ array) advanced to the next 1024-byte boundary of the
// shared window: the 128-byte swizzle's atoms, and the copy engine's boxes in them, start there.
// An offset from `raw` rather than a rounding through an integer, so the pointer keeps its
// provenance: the compiler then knows every access through it is to shared memory (LDS / STS with
// 32-bit addresses) instead of emitting generic 64-bit loads and stores and their address
// arithmetic on the ALU pipe.
__device__ __forceinline__ uint8_t* aligned_shared_1024(uint8_t* raw) {
  return raw + ((0u - static_cast<uint32_t>(__cvta_generic_to_shared(raw))) & 1023u);
}

}  // namespace fsdpq::cuda::hopper
