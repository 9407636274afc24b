// Reductions over the 4 lanes of a quad (lanes 4g .. 4g + 3): in the mma.sync and wgmma
// accumulator layouts a row's columns are spread over one quad, so a row's max or sum is these.
// Every lane gets the same bits (xor butterfly). Device code only.
#pragma once

namespace fsdpq::cuda {

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace fsdpq::cuda
