// Bulk tensor copies between global and shared memory (PTX ISA "cp.async.bulk.tensor"): one thread
// asks the copy engine for a whole box of a tensor described by a tensor map
// (kernels/hopper/tensor_map.cuh), passed to the kernel by value as a __grid_constant__ parameter.
// Loads complete on an mbarrier (kernels/hopper/mbarrier.cuh) with their byte count; stores are
// tracked in bulk groups. Device code only; sm_90.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "kernels/hopper/mbarrier.cuh"

namespace fsdpq::cuda::hopper {

// The box at {c0, c1, c2, c3} (innermost first) into shared memory at dst (1024-byte aligned for
// the 128-byte swizzle), adding its bytes to `bar`'s transaction count. Out-of-range elements read
// as zeros, and count.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap& map, uint64_t* bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], "
      "[%2];" ::"r"(smem_address(dst)),
      "l"(reinterpret_cast<uint64_t>(&map)), "r"(smem_address(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
      : "memory");
}

// The box in shared memory at shared-memory address src (smem_address) to {c0, c1, c2, c3};
// elements out of range are not written.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap& map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(&map)),
               "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void tma_store_4d(const CUtensorMap& map, const void* src, int c0, int c1, int c2, int c3) {
  tma_store_4d(map, smem_address(src), c0, c1, c2, c3);
}

// Closes the group of the stores issued so far, then waits until every group has read its shared
// memory (so it may be reused or the block may end).
__device__ __forceinline__ void tma_store_commit_and_wait_read() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// Orders this thread's ordinary shared-memory writes before later reads by the copy engine or
// the tensor cores (the async proxy); a barrier among the writers follows.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

}  // namespace fsdpq::cuda::hopper
