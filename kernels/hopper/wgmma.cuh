// Warpgroup matrix multiply-accumulate (PTX ISA "wgmma", sm_90a): four consecutive warps (a
// warpgroup, starting at a warp index divisible by 4) multiply a 64 x K tile A by a K x N tile B
// into 64 x N fp32 accumulators spread over their registers, asynchronously. B always comes from
// shared memory through a 64-bit descriptor; A from shared memory too, or from registers.
//
// Shared-memory tiles here are what the bulk tensor copies (kernels/hopper/tensor_map.cuh) write:
// rows of 128 bytes (64 16-bit elements), 128-byte swizzled, in blocks of 8 rows = 1024 bytes,
// each block 1024-byte aligned. A wider tile is several such column blocks side by side. Two
// readings of such a tile:
//  - K-major (A = Q, B = K for Q Kᵀ): a row is one row of the matrix, K along the row. One k16 step
//    reads 32 bytes of every row; step s of a column block starts 32·s bytes into it (the hardware
//    applies the swizzle to the full address). 8-row groups are 1024 bytes apart (SBO).
//  - MN-major (B = V for P V: K = keys down the rows, N = D along them): a k16 step reads 16 rows
//    (2048 bytes); N crosses column blocks, `column_block_bytes` apart (LBO); 8-row groups along K
//    are 1024 bytes apart (SBO).
//
// Accumulator layout (m64nN, fp32): warp w of the group holds rows 16w..16w+15; with g = lane / 4,
// t = lane % 4, registers d[4j .. 4j+3] are (row g, columns 8j + 2t, 8j + 2t + 1) and (row g + 8,
// the same columns). The register A operand (m64k16, 16-bit) has mma.sync's m16n8k16 layout per
// warp: a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..), lower column
// in the lower 16 bits — so the accumulators of 8-column chunks 2i, 2i+1, rounded to 16 bits, are
// the A operand of k step i of the next product.
//
// wgmma reads its register operands and writes its accumulators asynchronously, until a
// wait_group says they are done. ptxas tracks that; fence_operand keeps the compiler's front end
// from moving ordinary reads or writes of those registers across the issue and wait statements.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/hopper/mbarrier.cuh"

namespace fsdpq::cuda::hopper {

constexpr uint32_t kSwizzleRowBytes = 128;
constexpr uint32_t kSwizzleAtomBytes = 1024;  // 8 rows of 128 bytes

__device__ __forceinline__ uint64_t descriptor(const void* tile, uint32_t leading_bytes, uint32_t stride_bytes) {
  const uint64_t address = (smem_address(tile) & 0x3FFFF) >> 4;
  return address | (static_cast<uint64_t>(leading_bytes >> 4) << 16) | (static_cast<uint64_t>(stride_bytes >> 4) << 32) |
         (uint64_t{1} << 62);  // 128-byte swizzle
}

// A K-major operand starting at `tile` (one column block; the k steps: advanced()).
// The leading byte offset means nothing for a swizzled K-major tile; 1 by convention.
__device__ __forceinline__ uint64_t descriptor_k_major(const void* tile) {
  return descriptor(tile, 16, kSwizzleAtomBytes);
}

// An MN-major operand starting at `tile` (first column block; plus 2048 bytes per k step).
__device__ __forceinline__ uint64_t descriptor_mn_major(const void* tile, uint32_t column_block_bytes) {
  return descriptor(tile, column_block_bytes, kSwizzleAtomBytes);
}

// The same operand `bytes` further on (16-byte multiple; the address field cannot carry over,
// shared memory being below 256 KiB). Steps from one base keep a loop from holding every
// step's descriptor in registers.
__device__ __forceinline__ uint64_t advanced(uint64_t descriptor, uint32_t bytes) { return descriptor + (bytes >> 4); }

// Hides a value's origin from the compiler, so that descriptors derived from it are computed
// where they are used instead of being hoisted out of the loop and kept live (spilled) across it.
__device__ __forceinline__ uint64_t opaque(uint64_t v) {
  asm volatile("" : "+l"(v));
  return v;
}

// Before the first wgmma of a batch: orders earlier register and shared-memory accesses of this
// warpgroup before the tensor cores read them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
// Closes the batch of wgmmas issued since the last commit into one group.
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most `Pending` committed groups are still running (groups finish in order).
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(Pending) : "memory");
}

template <int N>
__device__ __forceinline__ void fence_operand(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void fence_operand(uint32_t (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

#define FSDPQ_WGMMA_D64 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FSDPQ_WGMMA_D32 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FSDPQ_WGMMA_ACC64(c, d) \
    c(d[0]), c(d[1]), c(d[2]), c(d[3]), c(d[4]), c(d[5]), c(d[6]), c(d[7]), \
    c(d[8]), c(d[9]), c(d[10]), c(d[11]), c(d[12]), c(d[13]), c(d[14]), c(d[15]), \
    c(d[16]), c(d[17]), c(d[18]), c(d[19]), c(d[20]), c(d[21]), c(d[22]), c(d[23]), \
    c(d[24]), c(d[25]), c(d[26]), c(d[27]), c(d[28]), c(d[29]), c(d[30]), c(d[31]), \
    c(d[32]), c(d[33]), c(d[34]), c(d[35]), c(d[36]), c(d[37]), c(d[38]), c(d[39]), \
    c(d[40]), c(d[41]), c(d[42]), c(d[43]), c(d[44]), c(d[45]), c(d[46]), c(d[47]), \
    c(d[48]), c(d[49]), c(d[50]), c(d[51]), c(d[52]), c(d[53]), c(d[54]), c(d[55]), \
    c(d[56]), c(d[57]), c(d[58]), c(d[59]), c(d[60]), c(d[61]), c(d[62]), c(d[63])
#define FSDPQ_WGMMA_ACC32(c, d) \
    c(d[0]), c(d[1]), c(d[2]), c(d[3]), c(d[4]), c(d[5]), c(d[6]), c(d[7]), \
    c(d[8]), c(d[9]), c(d[10]), c(d[11]), c(d[12]), c(d[13]), c(d[14]), c(d[15]), \
    c(d[16]), c(d[17]), c(d[18]), c(d[19]), c(d[20]), c(d[21]), c(d[22]), c(d[23]), \
    c(d[24]), c(d[25]), c(d[26]), c(d[27]), c(d[28]), c(d[29]), c(d[30]), c(d[31])

// d = A B (kAccumulate false: d's previous values are not read) or d += A B, m64n128k16: A and B
// K-major in shared memory (descriptor_k_major).
template <class T, bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t a, uint64_t b) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>);
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (kAccumulate && kBf16)
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FSDPQ_WGMMA_D64 ", %64, %65, 1, 1, 1, 0, 0;\n"
                 : FSDPQ_WGMMA_ACC64("+f", d)
                 : "l"(a), "l"(b));
  else if constexpr (kAccumulate)
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " FSDPQ_WGMMA_D64 ", %64, %65, 1, 1, 1, 0, 0;\n"
                 : FSDPQ_WGMMA_ACC64("+f", d)
                 : "l"(a), "l"(b));
  else if constexpr (kBf16)
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FSDPQ_WGMMA_D64 ", %64, %65, 0, 1, 1, 0, 0;\n"
                 : FSDPQ_WGMMA_ACC64("=f", d)
                 : "l"(a), "l"(b));
  else
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " FSDPQ_WGMMA_D64 ", %64, %65, 0, 1, 1, 0, 0;\n"
                 : FSDPQ_WGMMA_ACC64("=f", d)
                 : "l"(a), "l"(b));
}

// d = A B or d += A B, m64n64k16: A and B K-major in shared memory (the backward's 64-key and
// 64-query score tiles).
template <class T, bool kAccumulate>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t a, uint64_t b) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>);
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (kAccumulate && kBf16)
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FSDPQ_WGMMA_D32 ", %32, %33, 1, 1, 1, 0, 0;\n"
                 : FSDPQ_WGMMA_ACC32("+f", d)
                 : "l"(a), "l"(b));
  else if constexpr (kAccumulate)
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FSDPQ_WGMMA_D32 ", %32, %33, 1, 1, 1, 0, 0;\n"
                 : FSDPQ_WGMMA_ACC32("+f", d)
                 : "l"(a), "l"(b));
  else if constexpr (kBf16)
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FSDPQ_WGMMA_D32 ", %32, %33, 0, 1, 1, 0, 0;\n"
                 : FSDPQ_WGMMA_ACC32("=f", d)
                 : "l"(a), "l"(b));
  else
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FSDPQ_WGMMA_D32 ", %32, %33, 0, 1, 1, 0, 0;\n"
                 : FSDPQ_WGMMA_ACC32("=f", d)
                 : "l"(a), "l"(b));
}

// d += A B, m64nNk16 (N 64 or 128): A in registers (the layout above), B MN-major in shared memory
// (descriptor_mn_major).
template <class T, int N>
__device__ __forceinline__ void wgmma_m64nk16_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>);
  static_assert(N == 64 || N == 128);
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (N == 128 && kBf16)
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " FSDPQ_WGMMA_D64
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
                 : FSDPQ_WGMMA_ACC64("+f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  else if constexpr (N == 128)
    asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " FSDPQ_WGMMA_D64
                 ", {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
                 : FSDPQ_WGMMA_ACC64("+f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  else if constexpr (kBf16)
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FSDPQ_WGMMA_D32
                 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                 : FSDPQ_WGMMA_ACC32("+f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  else
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FSDPQ_WGMMA_D32
                 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
                 : FSDPQ_WGMMA_ACC32("+f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// d += A B, m64n64k16: A and B both MN-major in shared memory (descriptor_mn_major): A's tile holds
// K rows with M along each, B's K rows with N along each (the LoRA weight gradient's dxaᵀ · x,
// kernels/lora_fused_sm90a.cu, reads both straight from row-major [tokens, …] tiles).
template <class T>
__device__ __forceinline__ void wgmma_m64n64k16_ss_mn_major(float (&d)[32], uint64_t a, uint64_t b) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>);
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FSDPQ_WGMMA_D32 ", %32, %33, 1, 1, 1, 1, 1;\n"
                 : FSDPQ_WGMMA_ACC32("+f", d)
                 : "l"(a), "l"(b));
  else
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FSDPQ_WGMMA_D32 ", %32, %33, 1, 1, 1, 1, 1;\n"
                 : FSDPQ_WGMMA_ACC32("+f", d)
                 : "l"(a), "l"(b));
}

// d += A B, m64n64k16: A in registers (the layout above), B K-major in shared memory
// (descriptor_k_major): a tile whose 64 rows are B's columns, K along each row (the LoRA down
// product's A_j, kernels/lora_fused_sm90a.cu).
// kAccumulate false: d = A B (d's old values unread), as the first k-step of a product.
template <class T, bool kAccumulate = true>
__device__ __forceinline__ void wgmma_m64n64k16_rs_k_major(float (&d)[32], const uint32_t (&a)[4], uint64_t b) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>);
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  if constexpr (kAccumulate && kBf16)
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FSDPQ_WGMMA_D32
                 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
                 : FSDPQ_WGMMA_ACC32("+f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  else if constexpr (kAccumulate)
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FSDPQ_WGMMA_D32
                 ", {%32, %33, %34, %35}, %36, 1, 1, 1, 0;\n"
                 : FSDPQ_WGMMA_ACC32("+f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  else if constexpr (kBf16)
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " FSDPQ_WGMMA_D32
                 ", {%32, %33, %34, %35}, %36, 0, 1, 1, 0;\n"
                 : FSDPQ_WGMMA_ACC32("=f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
  else
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " FSDPQ_WGMMA_D32
                 ", {%32, %33, %34, %35}, %36, 0, 1, 1, 0;\n"
                 : FSDPQ_WGMMA_ACC32("=f", d)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// d += A B over K = 16 · len(a) / 4: A's k-steps in registers (4 each, as wgmma_m64nk16_rs takes
// them), B an MN-major tile whose K rows follow one another as 128-byte swizzled rows (b its
// descriptor). The attention forward's P V and the backward's gradient products.
template <class T, int N, int KREGS>
__device__ __forceinline__ void wgmma_rs_over_k(float (&d)[N / 2], const uint32_t (&a)[KREGS], uint64_t b) {
  static_assert(KREGS % 4 == 0);
#pragma unroll
  for (int kk = 0; kk < KREGS / 4; ++kk) {
    const uint32_t a_k[4] = {a[4 * kk], a[4 * kk + 1], a[4 * kk + 2], a[4 * kk + 3]};
    wgmma_m64nk16_rs<T, N>(d, a_k, advanced(b, kk * 16 * kSwizzleRowBytes));
  }
}

#undef FSDPQ_WGMMA_D64
#undef FSDPQ_WGMMA_D32
#undef FSDPQ_WGMMA_ACC64
#undef FSDPQ_WGMMA_ACC32

// Two floats rounded (nearest even) to T, lo in the lower 16 bits: a register of an A operand.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// An accumulator of N columns (N / 2 registers per thread: the scores of P V, dS of dK ...) as the
// register A operand of the next product, rounded to T: k step kk is 8-column chunks 2kk, 2kk + 1.
template <class T, int N>
__device__ __forceinline__ void to_a_operand(const float (&acc)[N], uint32_t (&a)[N / 2]) {
#pragma unroll
  for (int kk = 0; kk < N / 8; ++kk) {
    a[4 * kk] = pack2<T>(acc[8 * kk], acc[8 * kk + 1]);
    a[4 * kk + 1] = pack2<T>(acc[8 * kk + 2], acc[8 * kk + 3]);
    a[4 * kk + 2] = pack2<T>(acc[8 * kk + 4], acc[8 * kk + 5]);
    a[4 * kk + 3] = pack2<T>(acc[8 * kk + 6], acc[8 * kk + 7]);
  }
}

}  // namespace fsdpq::cuda::hopper
