// Warpgroup-level controls (sm_90a): moving registers between the warpgroups of a warp-specialised
// block, and barriers among the threads of one warpgroup. Device code only.
#pragma once
#include <cstdint>

namespace fsdpq::cuda::hopper {

// Shrinks (or grows) this warpgroup's registers per thread to N, a multiple of 8 in [24, 256].
// Takes effect only in a kernel with a register cap at entry (__launch_bounds__). Registers move
// within the block only: a claim waits until the block's own releases cover it, so the block's
// total after every release and claim may not exceed its threads times the entry cap (ptxas's,
// e.g. 168 at 384 threads and one block an SM, 80 at two), or the claim waits for ever.
template <int N>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}

// A barrier among the 128 threads of one warpgroup: hardware barrier `id` (1..15; 0 is
// __syncthreads'), so other warpgroups do not wait.
__device__ __forceinline__ void warpgroup_sync(uint32_t id) { asm volatile("bar.sync %0, 128;" ::"r"(id) : "memory"); }

}  // namespace fsdpq::cuda::hopper
