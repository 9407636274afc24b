// Tensor-core products with mma.sync.m16n8k16 (16-bit inputs, fp32 accumulators) on tiles in shared
// memory, for kernels that are not worth a Hopper wgmma pipeline (skinny products: the LoRA
// kernels, kernels/lora_fused.cu). Fragment layouts (PTX ISA, "mma.m16n8k16"; g = lane / 4,
// t = lane % 4):
//   A 16x16 (row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B 16x8  (k x n):     b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//   C 16x8  (fp32):      c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1)
// (lower 16 bits = lower column / k index). Tiles sit in shared memory row-major with a leading
// dimension LD (elements) that is a multiple of 8 plus 8, so fragment reads hit distinct banks.
// Device code only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fsdpq::cuda::mma_fragments {

// Two floats rounded (nearest even) to T, lo in the lower 16 bits.
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// c += a b on the tensor cores (16x8x16, fp32 accumulate).
template <class T>
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <class T>
__device__ __forceinline__ uint32_t ld32(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// Two 16-bit values of a tile, lo in the lower bits.
__device__ __forceinline__ uint32_t two(const uint16_t* lo, const uint16_t* hi) {
  return static_cast<uint32_t>(*lo) | (static_cast<uint32_t>(*hi) << 16);
}

// A fragment: rows row0.. and columns k0.. of a [rows][LD] tile stored row-major.
template <int LD, class T>
__device__ __forceinline__ void load_a(uint32_t (&a)[4], const T* s, int row0, int k0, int lane) {
  const T* p = s + (row0 + (lane >> 2)) * LD + k0 + 2 * (lane & 3);
  a[0] = ld32(p);
  a[1] = ld32(p + 8 * LD);
  a[2] = ld32(p + 8);
  a[3] = ld32(p + 8 * LD + 8);
}

// A fragment of the transpose of a tile stored [k][rows] row-major: A rows row0.. are the tile's
// columns, A columns k0.. its rows.
template <int LD, class T>
__device__ __forceinline__ void load_a_trans(uint32_t (&a)[4], const T* s, int row0, int k0, int lane) {
  const uint16_t* p = reinterpret_cast<const uint16_t*>(s) + (k0 + 2 * (lane & 3)) * LD + row0 + (lane >> 2);
  a[0] = two(p, p + LD);
  a[1] = two(p + 8, p + LD + 8);
  a[2] = two(p + 8 * LD, p + 9 * LD);
  a[3] = two(p + 8 * LD + 8, p + 9 * LD + 8);
}

// B fragment (k x n) of a tile stored [n][k] (B = tileᵀ): n rows n0.., k columns k0...
template <int LD, class T>
__device__ __forceinline__ void load_b(uint32_t& b0, uint32_t& b1, const T* s, int n0, int k0, int lane) {
  const T* p = s + (n0 + (lane >> 2)) * LD + k0 + 2 * (lane & 3);
  b0 = ld32(p);
  b1 = ld32(p + 8);
}

// B fragment (k x n) of a tile stored [k][n] (B = the tile itself): k rows k0.., n columns n0...
template <int LD, class T>
__device__ __forceinline__ void load_b_trans(uint32_t& b0, uint32_t& b1, const T* s, int k0, int n0, int lane) {
  const uint16_t* p = reinterpret_cast<const uint16_t*>(s) + (k0 + 2 * (lane & 3)) * LD + n0 + (lane >> 2);
  b0 = two(p, p + LD);
  b1 = two(p + 8 * LD, p + 9 * LD);
}

// ---- the same fragments with ldmatrix: one instruction per fragment (or per two B fragments)
// instead of 16- or 32-bit shared loads, for kernels whose products are limited by those loads.
// Every row address must be 16-byte aligned: LD a multiple of 8 and k0, n0, row0 multiples of 8.

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Four 8x8 16-bit matrices; lanes 8m..8m+7 give the row addresses of matrix m, and each lane gets
// (row lane / 4, columns 2 (lane % 4), +1) of each matrix, or with .trans of its transpose.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}

// load_a with ldmatrix.
template <int LD, class T>
__device__ __forceinline__ void ldsm_a(uint32_t (&a)[4], const T* s, int row0, int k0, int lane) {
  const int m = lane >> 3, i = lane & 7;  // matrices: (row0, k0), (row0 + 8, k0), (row0, k0 + 8), (+8, +8)
  ldmatrix_x4(a, s + (row0 + i + (m & 1) * 8) * LD + k0 + (m >> 1) * 8);
}

// load_a_trans with ldmatrix.trans.
template <int LD, class T>
__device__ __forceinline__ void ldsm_a_trans(uint32_t (&a)[4], const T* s, int row0, int k0, int lane) {
  const int m = lane >> 3, i = lane & 7;  // stored blocks: (k0, row0), (k0, row0 + 8), (k0 + 8, row0), (+8, +8)
  ldmatrix_x4_trans(a, s + (k0 + i + (m >> 1) * 8) * LD + row0 + (m & 1) * 8);
}

// load_b for two n tiles at once (n0 and n0 + 8): b = {b0, b1 of n0; b0, b1 of n0 + 8}.
template <int LD, class T>
__device__ __forceinline__ void ldsm_b_pair(uint32_t (&b)[4], const T* s, int n0, int k0, int lane) {
  const int m = lane >> 3, i = lane & 7;  // blocks: (n0, k0), (n0, k0 + 8), (n0 + 8, k0), (+8, +8)
  ldmatrix_x4(b, s + (n0 + i + (m >> 1) * 8) * LD + k0 + (m & 1) * 8);
}

// load_b_trans for two n tiles at once (n0 and n0 + 8), as ldsm_b_pair orders them.
template <int LD, class T>
__device__ __forceinline__ void ldsm_b_trans_pair(uint32_t (&b)[4], const T* s, int k0, int n0, int lane) {
  const int m = lane >> 3, i = lane & 7;  // stored blocks: (k0, n0), (k0 + 8, n0), (k0, n0 + 8), (+8, +8)
  ldmatrix_x4_trans(b, s + (k0 + i + (m & 1) * 8) * LD + n0 + (m >> 1) * 8);
}

// ---- 16-byte asynchronous copies global -> shared (sm_80+), for kernels that stage their next
// tiles while multiplying the current ones. `bytes` 16 copies, 0 fills the 16 shared bytes with
// zeros (rows past the end).
__device__ __forceinline__ void cp_async16(void* shared, const void* global, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(bytes)
               : "memory");
}
// Rows [0, rows) of a 16-bit matrix, `cols` elements each (a multiple of 8), from global `src`
// (row stride src_ld elements) into shared `dst` (row stride dst_ld), in 16-byte pieces spread over
// `threads` threads; rows at or past `valid_rows` are zero-filled (their source address is row 0's,
// never read). Not committed: the caller groups its copies.
template <int Threads, class T>
__device__ __forceinline__ void cp_async_rows(T* dst, int dst_ld, const T* src, int64_t src_ld, int rows, int cols,
                                              int64_t valid_rows) {
  static_assert(sizeof(T) == 2, "cp_async_rows moves 16-bit elements, 8 a piece");
  const int chunks = cols / 8;
  for (int idx = threadIdx.x; idx < rows * chunks; idx += Threads) {
    const int r = idx / chunks, c = (idx - r * chunks) * 8;
    const bool inside = r < valid_rows;
    cp_async16(dst + r * dst_ld + c, src + (inside ? r : 0) * src_ld + c, inside ? 16 : 0);
  }
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace fsdpq::cuda::mma_fragments
