// Shared-memory barriers with transaction counts (PTX ISA "mbarrier"), the handshake between the
// bulk tensor copies (kernels/hopper/tma.cuh) and the threads that read what they bring. A stage
// of a pipeline has a "full" barrier (the copy engine adds the bytes it delivered; the consumers
// wait for its phase to complete) and an "empty" one (each consumer thread arrives when it is done
// with the stage; the producer waits before refilling it). Phases alternate 0, 1, 0, ...: a waiter
// names the parity of the phase it waits for, and a freshly initialised barrier counts the phase
// before it (parity 1) as complete, so a producer's first wait on an empty barrier passes at once.
// Device code only; sm_90.
#pragma once
#include <cstdint>

namespace fsdpq::cuda::hopper {

// The shared-memory address PTX instructions take.
__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(arrivals) : "memory");
}

// Makes initialised barriers visible to the copy engine (the async proxy); then a __syncthreads
// publishes them to the other threads.
__device__ __forceinline__ void mbarrier_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// One arrival that also announces `bytes` more to come from bulk copies in this phase.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_address(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_address(bar)) : "memory");
}

__device__ __forceinline__ bool mbarrier_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}

// Waits for the phase of parity `parity` to complete. (No timeout: a trap path here, shared by
// the warpgroups of a warp-specialised kernel, kept ptxas from giving the consumers their larger
// register budget. A pipeline bug hangs the kernel; the tests run under `timeout`.)
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t addr = smem_address(bar);
  while (!mbarrier_try_wait(addr, parity)) {
  }
}

}  // namespace fsdpq::cuda::hopper
