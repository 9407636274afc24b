// The tile products of hopper_wgmma_kernels.h: one block of one warpgroup; thread 0 brings both
// operands in with bulk tensor copies onto one mbarrier, the warpgroup multiplies, and each
// thread writes its accumulators straight from the fragment layout.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "hopper_wgmma_kernels.h"
#include "kernels/hopper/mbarrier.cuh"
#include "kernels/hopper/tensor_map.cuh"
#include "kernels/hopper/tma.cuh"
#include "kernels/hopper/wgmma.cuh"
#include "kernels/lora_fused_sm90a_layout.h"
#include "kernels/mma_fragments.cuh"

namespace fsdpq::test {
namespace {

using namespace cuda::hopper;

constexpr int kM = 64, kN = 128, kK = 64;  // kK: the register-A product's K
// Bytes of one 64-column block of a tile of 64 or 128 rows.
constexpr int kBlock64 = 64 * 128, kBlock128 = 128 * 128;

// The fp32 accumulators of a 64 x 128 product into c [64][128] (layout: kernels/hopper/wgmma.cuh).
__device__ void store_accumulators(float* c, const float (&d)[64]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row = 16 * warp + lane / 4, col = 2 * (lane % 4);
  for (int j = 0; j < 16; ++j) {
    c[row * kN + 8 * j + col] = d[4 * j];
    c[row * kN + 8 * j + col + 1] = d[4 * j + 1];
    c[(row + 8) * kN + 8 * j + col] = d[4 * j + 2];
    c[(row + 8) * kN + 8 * j + col + 1] = d[4 * j + 3];
  }
}

__device__ uint8_t* aligned_1024(uint8_t* p) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + 1023) & ~uintptr_t{1023});
}

template <class T>
__global__ void __launch_bounds__(128) tile_ss_kernel(float* c, const __grid_constant__ CUtensorMap a_map,
                                                      const __grid_constant__ CUtensorMap b_map) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* a = aligned_1024(smem_raw);
  uint8_t* b = a + 2 * kBlock64;
  __shared__ uint64_t full;
  if (threadIdx.x == 0) {
    mbarrier_init(&full, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&full, 2 * kBlock64 + 2 * kBlock128);
    for (int cb = 0; cb < 2; ++cb) {
      tma_load_4d(a + cb * kBlock64, a_map, &full, cb * kBoxColumns, 0, 0, 0);
      tma_load_4d(b + cb * kBlock128, b_map, &full, cb * kBoxColumns, 0, 0, 0);
    }
  }
  mbarrier_wait(&full, 0);
  float d[64];
  const uint64_t a_desc = descriptor_k_major(a), b_desc = descriptor_k_major(b);
  wgmma_fence();
  wgmma_m64n128k16_ss<T, false>(d, a_desc, b_desc);
#pragma unroll
  for (int kk = 1; kk < 8; ++kk)  // as attention_sm90a.cu's issue_scores
    wgmma_m64n128k16_ss<T, true>(d, advanced(a_desc, kk / 4 * kBlock64 + kk % 4 * 32),
                                 advanced(b_desc, kk / 4 * kBlock128 + kk % 4 * 32));
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(d);
  store_accumulators(c, d);
}

template <class T>
__global__ void __launch_bounds__(128) tile_rs_kernel(float* c, const T* a, const __grid_constant__ CUtensorMap b_map) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* b = aligned_1024(smem_raw);
  __shared__ uint64_t full;
  if (threadIdx.x == 0) {
    mbarrier_init(&full, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&full, 2 * kBlock64);
    for (int cb = 0; cb < 2; ++cb) tma_load_4d(b + cb * kBlock64, b_map, &full, cb * kBoxColumns, 0, 0, 0);
  }
  // The A operand, k step kk: (row g, columns 16kk + 2t..), (g + 8, same), (g, + 8), (g + 8, + 8).
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, row = 16 * warp + lane / 4, col = 2 * (lane % 4);
  auto pair = [&](int r, int k) { return *reinterpret_cast<const uint32_t*>(a + r * kK + k); };
  uint32_t frag[4][4];
  for (int kk = 0; kk < 4; ++kk) {
    frag[kk][0] = pair(row, 16 * kk + col);
    frag[kk][1] = pair(row + 8, 16 * kk + col);
    frag[kk][2] = pair(row, 16 * kk + 8 + col);
    frag[kk][3] = pair(row + 8, 16 * kk + 8 + col);
  }
  mbarrier_wait(&full, 0);
  float d[64] = {};
  const uint64_t b_desc = descriptor_mn_major(b, kBlock64);
  fence_operand(d);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)  // as attention_sm90a.cu's issue_pv
    wgmma_m64nk16_rs<T, kN>(d, frag[kk], advanced(b_desc, kk * 16 * kSwizzleRowBytes));
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(d);
  store_accumulators(c, d);
}

// Two 64 x 64 tiles (a, then b) brought in by the copy engine, 128-byte swizzled, onto one mbarrier;
// every thread returns once they have landed.
__device__ void load_two_tiles(uint8_t* a, uint8_t* b, const CUtensorMap& a_map, const CUtensorMap& b_map,
                               uint64_t* full) {
  if (threadIdx.x == 0) {
    mbarrier_init(full, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(full, 2 * kBlock64);
    tma_load_4d(a, a_map, full, 0, 0, 0, 0);
    tma_load_4d(b, b_map, full, 0, 0, 0, 0);
  }
  mbarrier_wait(full, 0);
}

// The fp32 accumulators of a 64 x 64 product into c [64][64] (the layout the LoRA kernels read
// their accumulators in: kernels/lora_fused_sm90a_layout.h).
__device__ void store_accumulators64(float* c, const float (&d)[32]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int j = 0; j < 8; ++j)
    for (int h = 0; h < 2; ++h) {
      const lora_sm90a_layout::Pair at = lora_sm90a_layout::accumulator_pair(warp, lane, j, h);
      c[at.row * 64 + at.column] = d[4 * j + 2 * h];
      c[at.row * 64 + at.column + 1] = d[4 * j + 2 * h + 1];
    }
}

// c [64][64] = a bᵀ: a goes from its swizzled tile to registers through ldmatrix, as the LoRA down
// kernel loads x (kernels/lora_fused_sm90a_layout.h's offsets), and b stays K-major in shared memory.
template <class T>
__global__ void __launch_bounds__(128) tile_rs_swizzled_kernel(float* c, const __grid_constant__ CUtensorMap a_map,
                                                               const __grid_constant__ CUtensorMap b_map) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* a = aligned_1024(smem_raw);
  uint8_t* b = a + kBlock64;
  __shared__ uint64_t full;
  load_two_tiles(a, b, a_map, b_map, &full);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint32_t frag[4][4];
  for (int kk = 0; kk < 4; ++kk)
    cuda::mma_fragments::ldmatrix_x4(frag[kk], a + hopper_layout::a_operand_ldmatrix_offset(warp, lane, kk));
  float d[32] = {};
  const uint64_t b_desc = descriptor_k_major(b);
  fence_operand(d);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_m64n64k16_rs_k_major<T>(d, frag[kk], advanced(b_desc, kk * 32));
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(d);
  store_accumulators64(c, d);
}

// c [64][64] = aᵀ b, a and b row-major (K rows), both read MN-major from shared memory — the LoRA
// weight gradient's dxaᵀ · masked x (kernels/lora_fused_sm90a.cu).
template <class T>
__global__ void __launch_bounds__(128) tile_ss_mn_major_kernel(float* c, const __grid_constant__ CUtensorMap a_map,
                                                               const __grid_constant__ CUtensorMap b_map) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* a = aligned_1024(smem_raw);
  uint8_t* b = a + kBlock64;
  __shared__ uint64_t full;
  load_two_tiles(a, b, a_map, b_map, &full);
  float d[32] = {};
  const uint64_t a_desc = descriptor_mn_major(a, kBlock64), b_desc = descriptor_mn_major(b, kBlock64);
  fence_operand(d);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const uint32_t k_rows = kk * 16 * kSwizzleRowBytes;  // k step kk: rows 16kk .. 16kk + 15
    wgmma_m64n64k16_ss_mn_major<T>(d, advanced(a_desc, k_rows), advanced(b_desc, k_rows));
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(d);
  store_accumulators64(c, d);
}

template <class Fn>
void with_type(cuda::KType type, Fn&& fn) {
  if (type == cuda::KType::BF16)
    fn(__nv_bfloat16{});
  else
    fn(__half{});
}

template <class Kernel>
size_t with_smem(Kernel kernel, size_t bytes) {
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  return bytes;
}

}  // namespace

void wgmma_tile_ss(float* c, const void* a, const void* b, cuda::KType type, cudaStream_t stream) {
  // Matrices as [1, rows, 1, 128] tensors: the attention kernel's maps, one head of one batch.
  const CUtensorMap a_map = head_tensor_map(a, 1, kM, 1, 128, kM), b_map = head_tensor_map(b, 1, kN, 1, 128, kN);
  with_type(type, [&](auto tag) {
    using T = decltype(tag);
    const size_t smem = with_smem(tile_ss_kernel<T>, 2 * kBlock64 + 2 * kBlock128 + 1024);
    tile_ss_kernel<T><<<1, 128, smem, stream>>>(c, a_map, b_map);
  });
  cuda::check_launch("wgmma_tile_ss");
}

void wgmma_tile_rs(float* c, const void* a, const void* b, cuda::KType type, cudaStream_t stream) {
  const CUtensorMap b_map = head_tensor_map(b, 1, 64, 1, kN, 64);
  with_type(type, [&](auto tag) {
    using T = decltype(tag);
    const size_t smem = with_smem(tile_rs_kernel<T>, 2 * kBlock64 + 1024);
    tile_rs_kernel<T><<<1, 128, smem, stream>>>(c, static_cast<const T*>(a), b_map);
  });
  cuda::check_launch("wgmma_tile_rs");
}

namespace {

// A 64 x 64 tile product of `kernel<T>` over a and b, each mapped as 64 rows of 64 16-bit values.
template <template <class> class Launch>
void tile64(float* c, const void* a, const void* b, cuda::KType type, cudaStream_t stream, const char* name) {
  const CUtensorMap a_map = head_tensor_map(a, 1, 64, 1, 64, 64), b_map = head_tensor_map(b, 1, 64, 1, 64, 64);
  with_type(type, [&](auto tag) { Launch<decltype(tag)>::run(c, a_map, b_map, stream); });
  cuda::check_launch(name);
}

template <class T>
struct RsSwizzled {
  static void run(float* c, const CUtensorMap& a_map, const CUtensorMap& b_map, cudaStream_t stream) {
    const size_t smem = with_smem(tile_rs_swizzled_kernel<T>, 2 * kBlock64 + 1024);
    tile_rs_swizzled_kernel<T><<<1, 128, smem, stream>>>(c, a_map, b_map);
  }
};

template <class T>
struct SsMnMajor {
  static void run(float* c, const CUtensorMap& a_map, const CUtensorMap& b_map, cudaStream_t stream) {
    const size_t smem = with_smem(tile_ss_mn_major_kernel<T>, 2 * kBlock64 + 1024);
    tile_ss_mn_major_kernel<T><<<1, 128, smem, stream>>>(c, a_map, b_map);
  }
};

}  // namespace

void wgmma_tile_rs_swizzled(float* c, const void* a, const void* b, cuda::KType type, cudaStream_t stream) {
  tile64<RsSwizzled>(c, a, b, type, stream, "wgmma_tile_rs_swizzled");
}

void wgmma_tile_ss_mn_major(float* c, const void* a, const void* b, cuda::KType type, cudaStream_t stream) {
  tile64<SsMnMajor>(c, a, b, type, stream, "wgmma_tile_ss_mn_major");
}

}  // namespace fsdpq::test
