// Tensor-core causal attention (FlashAttention-2 style). Every kernel runs 128 threads = 4 warps;
// a warp owns 16 rows of its block's 64-row tile (query rows in the forward and the dq kernel,
// key rows in the dk/dv kernel) and multiplies with mma.sync.m16n8k16 (16-bit inputs, fp32
// accumulators). Fragment layouts (PTX ISA, "mma.m16n8k16", with g = lane / 4, t = lane % 4):
//   A 16x16 (row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B 16x8  (k x n):     b0 = (k 2t..2t+1, n g), b1 = (k 2t+8..2t+9, n g)
//   C 16x8  (fp32):      c0, c1 = (g, 2t..2t+1), c2, c3 = (g+8, 2t..2t+1)
// (lower 16 bits = lower column / k index). So the accumulators of two adjacent 8-column score
// tiles are, rounded to 16 bits, the A fragment of the next product (P V, dS K, ...), and softmax
// statistics of row g / g+8 reduce over the 4 lanes of a quad. Tiles sit in shared memory as
// [rows][D + 8] 16-bit values: the 16-byte pad makes both the 32-bit fragment reads (8 rows x 4
// words) and the 16-bit transposed reads (rows 2t, 2t+1, columns g) hit 32 distinct banks.
// Global -> shared loads are plain 16-byte vector loads (no cp.async), converting other storage
// types (an fp32 dout) to the 16-bit type on the way; several blocks per SM hide the latency.
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/attention_mma.cuh"
#include "kernels/mma_fragments.cuh"
#include "kernels/quad_reduce.cuh"

namespace fsdpq::cuda {
namespace {

using namespace mma_fragments;  // pack2, mma, the fragment loads

constexpr int kThreads = 128;  // 4 warps x 16 rows = one 64-row tile
constexpr int kTile = 64;      // query rows per block (forward, dq), key rows per block (dk/dv), keys per step
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct MmaDims {
  int B, T, H, KV;
  float scale;  // 1 / sqrt(D), as the CPU computes it
};


// The A fragment of columns 16i..16i+15 from the fp32 accumulators of 8-column tiles 2i, 2i+1.
template <class T>
__device__ __forceinline__ void a_from_acc(uint32_t (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
  a[0] = pack2<T>(c0[0], c0[1]);
  a[1] = pack2<T>(c0[2], c0[3]);
  a[2] = pack2<T>(c1[0], c1[1]);
  a[3] = pack2<T>(c1[2], c1[3]);
}

// Rows [t0, t0 + ROWS) of head `head` of a [B, T, heads, D] tensor of storage S into a
// [ROWS][D + 8] tile of T (zeros past T). 8 elements (one 16-byte store) per step.
template <class T, class S, int D, int ROWS>
__device__ __forceinline__ void load_tile(T* dst, const S* src, int T_len, int b, int t0, int heads, int head) {
  constexpr int LD = D + 8, CH = D / 8;
  for (int idx = threadIdx.x; idx < ROWS * CH; idx += kThreads) {
    const int r = idx / CH, c = (idx - r * CH) * 8, t = t0 + r;
    uint4 packed = make_uint4(0u, 0u, 0u, 0u);
    if (t < T_len) {
      const S* p = src + ((static_cast<int64_t>(b) * T_len + t) * heads + head) * D + c;
      if constexpr (std::is_same_v<S, T>) {
        packed = *reinterpret_cast<const uint4*>(p);
      } else if constexpr (std::is_same_v<S, float>) {
        const float4 x = reinterpret_cast<const float4*>(p)[0], y = reinterpret_cast<const float4*>(p)[1];
        packed = make_uint4(pack2<T>(x.x, x.y), pack2<T>(x.z, x.w), pack2<T>(y.x, y.y), pack2<T>(y.z, y.w));
      } else {  // the other 16-bit type
        const uint4 raw = *reinterpret_cast<const uint4*>(p);
        const S* e = reinterpret_cast<const S*>(&raw);
        packed = make_uint4(pack2<T>(to_float(e[0]), to_float(e[1])), pack2<T>(to_float(e[2]), to_float(e[3])),
                            pack2<T>(to_float(e[4]), to_float(e[5])), pack2<T>(to_float(e[6]), to_float(e[7])));
      }
    }
    *reinterpret_cast<uint4*>(dst + r * LD + c) = packed;
  }
}

// Packed rows (segment_start, kernels/attention_mma.cuh): the first key query t of row b sees, 0
// without segments (and for rows past T, which are never stored).
__device__ __forceinline__ int first_key(const int32_t* segment_start, const MmaDims& d, int b, int t) {
  return segment_start != nullptr && t < d.T ? segment_start[static_cast<int64_t>(b) * d.T + t] : 0;
}

// The first key tile any query row of [q0, q0 + kTile) sees: 0 without segments. Every thread
// calls it (two barriers).
__device__ __forceinline__ int first_key_tile(const int32_t* segment_start, const MmaDims& d, int b, int q0) {
  if (segment_start == nullptr) return 0;
  __shared__ int first;
  if (threadIdx.x == 0) first = INT_MAX;
  __syncthreads();
  if (threadIdx.x < kTile && q0 + static_cast<int>(threadIdx.x) < d.T)
    atomicMin(&first, first_key(segment_start, d, b, q0 + static_cast<int>(threadIdx.x)));
  __syncthreads();
  return first / kTile;
}

// ---- forward: one block per (query tile, h, b); key tiles 0..qt in order ----
template <class T, int D>
__global__ void __launch_bounds__(kThreads)
    mma_forward_kernel(void* out, KType out_type, float* lse, const T* q, const T* k, const T* v,
                       const int32_t* segment_start, MmaDims d) {
  constexpr int LD = D + 8, NT = D / 8, KD = D / 16;
  extern __shared__ uint4 smem_raw[];  // 16-byte aligned
  T* q_s = reinterpret_cast<T*>(smem_raw);
  T* k_s = q_s + kTile * LD;
  T* v_s = k_s + kTile * LD;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t4 = lane & 3;
  const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);  // long (late) tiles first
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (d.H / d.KV);
  const int q0 = qt * kTile, row0 = warp * 16;
  const int t_lo = q0 + row0 + (lane >> 2), t_hi = t_lo + 8;  // this thread's two query rows
  const float c = d.scale * kLog2e;                          // scores in log2 units: exp2f below
  const int start_lo = first_key(segment_start, d, b, t_lo), start_hi = first_key(segment_start, d, b, t_hi);
  const int first_tile = first_key_tile(segment_start, d, b, q0);

  load_tile<T, T, D, kTile>(q_s, q, d.T, b, q0, d.H, h);
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;  // l: this thread's columns only

  for (int kt = first_tile; kt <= qt; ++kt) {  // key tiles before first_tile: masked for every row
    const int k0 = kt * kTile;
    __syncthreads();  // the previous K / V tiles are no longer read
    load_tile<T, T, D, kTile>(k_s, k, d.T, b, k0, d.KV, kvh);
    load_tile<T, T, D, kTile>(v_s, v, d.T, b, k0, d.KV, kvh);
    __syncthreads();
    float s[8][4];
#pragma unroll
    for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t a[4];
      load_a<LD>(a, q_s, row0, kk * 16, lane);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        uint32_t b0, b1;
        load_b<LD>(b0, b1, k_s, j * 8, kk * 16, lane);
        mma<T>(s[j], a, b0, b1);
      }
    }
    // Mask (key > query: causal; key >= T: padding; key before the row's example: packed rows)
    // and the row maxima. Without segments every row sees at least one key per tile (key k0 <= q0
    // <= row on the diagonal tile, all keys before it), so the maxima are finite; with them a row
    // may see none of a tile before its example's first, and its maximum stays -inf until then.
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + j * 8 + 2 * t4 + (e & 1), t = e < 2 ? t_lo : t_hi;
        const bool visible = key <= t && key < d.T && key >= (e < 2 ? start_lo : start_hi);
        const float x = visible ? s[j][e] * c : -INFINITY;
        s[j][e] = x;
        if (e < 2)
          mx_lo = fmaxf(mx_lo, x);
        else
          mx_hi = fmaxf(mx_hi, x);
      }
    const float mn_lo = fmaxf(m_lo, quad_max(mx_lo)), mn_hi = fmaxf(m_hi, quad_max(mx_hi));
    // A maximum still -inf (no key seen yet) is taken as 0: probabilities and alpha 0, not NaN.
    // Otherwise the maximum itself, so rows without segments compute what they always did.
    const float base_lo = mn_lo == -INFINITY ? 0.0f : mn_lo, base_hi = mn_hi == -INFINITY ? 0.0f : mn_hi;
    const float al_lo = exp2f(m_lo - base_lo), al_hi = exp2f(m_hi - base_hi);  // 0 on the first tile
    m_lo = mn_lo;
    m_hi = mn_hi;
    float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s[j][0] = exp2f(s[j][0] - base_lo);
      s[j][1] = exp2f(s[j][1] - base_lo);
      s[j][2] = exp2f(s[j][2] - base_hi);
      s[j][3] = exp2f(s[j][3] - base_hi);
      sum_lo += s[j][0] + s[j][1];
      sum_hi += s[j][2] + s[j][3];
    }
    l_lo = l_lo * al_lo + sum_lo;  // the fp32 probabilities (P is rounded only for P V)
    l_hi = l_hi * al_hi + sum_hi;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      o[n][0] *= al_lo;
      o[n][1] *= al_lo;
      o[n][2] *= al_hi;
      o[n][3] *= al_hi;
    }
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {  // o += P V over keys 16kk..16kk+15
      uint32_t a[4];
      a_from_acc<T>(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        uint32_t b0, b1;
        load_b_trans<LD>(b0, b1, v_s, kk * 16, n * 8, lane);
        mma<T>(o[n], a, b0, b1);
      }
    }
  }
  l_lo = quad_sum(l_lo);
  l_hi = quad_sum(l_hi);
  const float inv_lo = 1.0f / l_lo, inv_hi = 1.0f / l_hi;
  const int64_t lse_row = (static_cast<int64_t>(b) * d.H + h) * d.T;
  if (t_lo < d.T) {
    const int64_t base = ((static_cast<int64_t>(b) * d.T + t_lo) * d.H + h) * D + 2 * t4;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      store_any(out, out_type, base + n * 8, o[n][0] * inv_lo);
      store_any(out, out_type, base + n * 8 + 1, o[n][1] * inv_lo);
    }
    if (t4 == 0) lse[lse_row + t_lo] = m_lo * kLn2 + logf(l_lo);
  }
  if (t_hi < d.T) {
    const int64_t base = ((static_cast<int64_t>(b) * d.T + t_hi) * d.H + h) * D + 2 * t4;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      store_any(out, out_type, base + n * 8, o[n][2] * inv_hi);
      store_any(out, out_type, base + n * 8 + 1, o[n][3] * inv_hi);
    }
    if (t4 == 0) lse[lse_row + t_hi] = m_hi * kLn2 + logf(l_hi);
  }
}

// ---- backward, step 1: drow[b, h, t] = round_T(dout[b, t, h, :]) . out[b, t, h, :] (a warp per
// row, lanes in a fixed order) ----
template <class T, class S>
__global__ void __launch_bounds__(256)
    mma_drow_kernel(float* drow, const S* dout, const void* out, KType out_type, MmaDims d, int D) {
  const int64_t rows = static_cast<int64_t>(d.B) * d.T * d.H;  // in [b, t, h] order
  const int lane = threadIdx.x % 32;
  for (int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * (blockDim.x / 32)) {
    float sum = 0.0f;
    for (int c = lane; c < D; c += 32)
      sum += round_to<T>(to_float(dout[row * D + c])) * load_any(out, out_type, row * D + c);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) {
      const int64_t h = row % d.H, bt = row / d.H, t = bt % d.T, b = bt / d.T;
      drow[(b * d.H + h) * d.T + t] = sum;
    }
  }
}

// Two score-shaped products of one warp's 16 rows (row0..) at once, over D (KD k-steps): s[j] =
// a · b_jᵀ and t[j] = c · e_jᵀ for the n tiles j of 8 rows of b and e. The dq kernel's Q Kᵀ and
// dO Vᵀ (rows: queries), the dk/dv kernel's K Qᵀ and V dOᵀ (rows: keys).
template <class T, int LD, int KD, int NJ>
__device__ __forceinline__ void paired_scores(float (&s)[NJ][4], float (&t)[NJ][4], const T* a, const T* c,
                                              const T* b, const T* e, int row0, int lane) {
#pragma unroll
  for (int j = 0; j < NJ; ++j)
#pragma unroll
    for (int x = 0; x < 4; ++x) s[j][x] = t[j][x] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < KD; ++kk) {
    uint32_t fa[4], fc[4];
    load_a<LD>(fa, a, row0, kk * 16, lane);
    load_a<LD>(fc, c, row0, kk * 16, lane);
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      uint32_t b0, b1;
      load_b<LD>(b0, b1, b, j * 8, kk * 16, lane);
      mma<T>(s[j], fa, b0, b1);
      load_b<LD>(b0, b1, e, j * 8, kk * 16, lane);
      mma<T>(t[j], fc, b0, b1);
    }
  }
}

// ---- backward, step 2: dq, one block per (query tile, h, b); key tiles 0..qt in order ----
template <class T, int D, class S>
__global__ void __launch_bounds__(kThreads)
    mma_dq_kernel(void* dq, KType dq_type, const S* dout, const T* q, const T* k, const T* v, const float* lse,
                  const float* drow, const int32_t* segment_start, MmaDims d) {
  constexpr int LD = D + 8, NT = D / 8, KD = D / 16;
  extern __shared__ uint4 smem_raw[];
  T* q_s = reinterpret_cast<T*>(smem_raw);
  T* do_s = q_s + kTile * LD;
  T* k_s = do_s + kTile * LD;
  T* v_s = k_s + kTile * LD;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t4 = lane & 3;
  const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z, kvh = h / (d.H / d.KV);
  const int q0 = qt * kTile, row0 = warp * 16;
  const int t_lo = q0 + row0 + (lane >> 2), t_hi = t_lo + 8;
  const float c = d.scale * kLog2e;
  const int start_lo = first_key(segment_start, d, b, t_lo), start_hi = first_key(segment_start, d, b, t_hi);
  const int first_tile = first_key_tile(segment_start, d, b, q0);

  load_tile<T, T, D, kTile>(q_s, q, d.T, b, q0, d.H, h);
  load_tile<T, S, D, kTile>(do_s, dout, d.T, b, q0, d.H, h);
  const int64_t lse_row = (static_cast<int64_t>(b) * d.H + h) * d.T;
  const float lse_lo = t_lo < d.T ? lse[lse_row + t_lo] * kLog2e : 0.0f;
  const float lse_hi = t_hi < d.T ? lse[lse_row + t_hi] * kLog2e : 0.0f;
  const float dr_lo = t_lo < d.T ? drow[lse_row + t_lo] : 0.0f;
  const float dr_hi = t_hi < d.T ? drow[lse_row + t_hi] : 0.0f;
  float acc[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  for (int kt = first_tile; kt <= qt; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();
    load_tile<T, T, D, kTile>(k_s, k, d.T, b, k0, d.KV, kvh);
    load_tile<T, T, D, kTile>(v_s, v, d.T, b, k0, d.KV, kvh);
    __syncthreads();
    float s[8][4], dp[8][4];
    paired_scores<T, LD, KD>(s, dp, q_s, do_s, k_s, v_s, row0, lane);
    // dS = P (dP - rowsum(dO O)) scale, P = exp(s scale - lse) recomputed; dS replaces s.
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = k0 + j * 8 + 2 * t4 + (e & 1), t = e < 2 ? t_lo : t_hi;
        const bool visible = key <= t && t < d.T && key < d.T && key >= (e < 2 ? start_lo : start_hi);
        const float p = visible ? exp2f(s[j][e] * c - (e < 2 ? lse_lo : lse_hi)) : 0.0f;
        s[j][e] = p * (dp[j][e] - (e < 2 ? dr_lo : dr_hi)) * d.scale;
      }
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {  // dq += dS K over keys 16kk..
      uint32_t a[4];
      a_from_acc<T>(a, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        uint32_t b0, b1;
        load_b_trans<LD>(b0, b1, k_s, kk * 16, n * 8, lane);
        mma<T>(acc[n], a, b0, b1);
      }
    }
  }
  if (t_lo < d.T) {
    const int64_t base = ((static_cast<int64_t>(b) * d.T + t_lo) * d.H + h) * D + 2 * t4;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      store_any(dq, dq_type, base + n * 8, acc[n][0]);
      store_any(dq, dq_type, base + n * 8 + 1, acc[n][1]);
    }
  }
  if (t_hi < d.T) {
    const int64_t base = ((static_cast<int64_t>(b) * d.T + t_hi) * d.H + h) * D + 2 * t4;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      store_any(dq, dq_type, base + n * 8, acc[n][2]);
      store_any(dq, dq_type, base + n * 8 + 1, acc[n][3]);
    }
  }
}

// Query rows per step of the dk/dv kernel: 32 at D = 128 keeps the registers (two D-wide
// accumulators per warp) below the spill point.
template <int D>
constexpr int kDkdvQueryRows = D == 128 ? 32 : 64;

// ---- backward, step 3: dk, dv, one block per (key tile, kv head, b), looping over the group's
// query heads in order and, per head, the query tiles from the key tile's first row on ----
template <class T, int D, class S>
__global__ void __launch_bounds__(kThreads)
    mma_dkdv_kernel(void* dk, KType dk_type, void* dv, KType dv_type, const S* dout, const T* q, const T* k,
                    const T* v, const float* lse, const float* drow, const int32_t* segment_start, MmaDims d) {
  constexpr int LD = D + 8, NT = D / 8, KD = D / 16, BQ = kDkdvQueryRows<D>, NQ = BQ / 8;
  extern __shared__ uint4 smem_raw[];
  T* k_s = reinterpret_cast<T*>(smem_raw);
  T* v_s = k_s + kTile * LD;
  T* q_s = v_s + kTile * LD;
  T* do_s = q_s + BQ * LD;
  float* lse_s = reinterpret_cast<float*>(do_s + BQ * LD);  // lse * log2(e) per query row
  float* drow_s = lse_s + BQ;
  int* start_s = reinterpret_cast<int*>(drow_s + BQ);  // each query row's first key
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t4 = lane & 3;
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;  // tile 0 (the longest) first
  const int group = d.H / d.KV;
  const int k0 = kt * kTile, row0 = warp * 16;
  const int key_lo = k0 + row0 + (lane >> 2), key_hi = key_lo + 8;  // this thread's two key rows
  const float c = d.scale * kLog2e;

  load_tile<T, T, D, kTile>(k_s, k, d.T, b, k0, d.KV, kvh);
  load_tile<T, T, D, kTile>(v_s, v, d.T, b, k0, d.KV, kvh);
  float dk_acc[NT][4], dv_acc[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.0f;

  for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
    const int64_t lse_row = (static_cast<int64_t>(b) * d.H + h) * d.T;
    for (int q0 = k0; q0 < d.T; q0 += BQ) {  // k0 is a multiple of BQ; earlier queries see none of these keys
      __syncthreads();  // the previous query tiles are no longer read
      // Packed rows: a step whose queries' examples all start after this key tile sees none of it
      // (block-uniform: one barrier's OR).
      if (segment_start != nullptr) {
        const int t = q0 + static_cast<int>(threadIdx.x);
        const bool sees = threadIdx.x < BQ && t < d.T && first_key(segment_start, d, b, t) < k0 + kTile;
        if (!__syncthreads_or(sees)) continue;
      }
      load_tile<T, T, D, BQ>(q_s, q, d.T, b, q0, d.H, h);
      load_tile<T, S, D, BQ>(do_s, dout, d.T, b, q0, d.H, h);
      if (threadIdx.x < BQ) {
        const int t = q0 + threadIdx.x;
        lse_s[threadIdx.x] = t < d.T ? lse[lse_row + t] * kLog2e : 0.0f;
        drow_s[threadIdx.x] = t < d.T ? drow[lse_row + t] : 0.0f;
        start_s[threadIdx.x] = first_key(segment_start, d, b, t);
      }
      __syncthreads();
      if (k0 + row0 > q0 + BQ - 1) continue;  // warp-uniform: no query of this step sees this warp's keys
      // Transposed scores and dP: rows = this warp's 16 keys, columns = the BQ queries.
      float st[NQ][4], dpt[NQ][4];
      paired_scores<T, LD, KD>(st, dpt, k_s, v_s, q_s, do_s, row0, lane);
      // Pᵀ replaces st, dSᵀ replaces dpt.
#pragma unroll
      for (int j = 0; j < NQ; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = e < 2 ? key_lo : key_hi, qi = j * 8 + 2 * t4 + (e & 1), t = q0 + qi;
          const bool visible = key <= t && t < d.T && key < d.T && key >= start_s[qi];
          const float p = visible ? exp2f(st[j][e] * c - lse_s[qi]) : 0.0f;
          st[j][e] = p;
          dpt[j][e] = p * (dpt[j][e] - drow_s[qi]) * d.scale;
        }
#pragma unroll
      for (int kq = 0; kq < BQ / 16; ++kq) {  // dv += Pᵀ dO, dk += dSᵀ Q over queries 16kq..
        uint32_t ap[4], ads[4];
        a_from_acc<T>(ap, st[2 * kq], st[2 * kq + 1]);
        a_from_acc<T>(ads, dpt[2 * kq], dpt[2 * kq + 1]);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          uint32_t b0, b1;
          load_b_trans<LD>(b0, b1, do_s, kq * 16, n * 8, lane);
          mma<T>(dv_acc[n], ap, b0, b1);
          load_b_trans<LD>(b0, b1, q_s, kq * 16, n * 8, lane);
          mma<T>(dk_acc[n], ads, b0, b1);
        }
      }
    }
  }
  if (key_lo < d.T) {
    const int64_t base = ((static_cast<int64_t>(b) * d.T + key_lo) * d.KV + kvh) * D + 2 * t4;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      store_any(dk, dk_type, base + n * 8, dk_acc[n][0]);
      store_any(dk, dk_type, base + n * 8 + 1, dk_acc[n][1]);
      store_any(dv, dv_type, base + n * 8, dv_acc[n][0]);
      store_any(dv, dv_type, base + n * 8 + 1, dv_acc[n][1]);
    }
  }
  if (key_hi < d.T) {
    const int64_t base = ((static_cast<int64_t>(b) * d.T + key_hi) * d.KV + kvh) * D + 2 * t4;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      store_any(dk, dk_type, base + n * 8, dk_acc[n][2]);
      store_any(dk, dk_type, base + n * 8 + 1, dk_acc[n][3]);
      store_any(dv, dv_type, base + n * 8, dv_acc[n][2]);
      store_any(dv, dv_type, base + n * 8 + 1, dv_acc[n][3]);
    }
  }
}

template <int D>
size_t tile_bytes(int rows) {
  return static_cast<size_t>(rows) * (D + 8) * 2;
}
template <int D>
size_t forward_smem() {
  return 3 * tile_bytes<D>(kTile);
}
template <int D>
size_t dq_smem() {
  return 4 * tile_bytes<D>(kTile);
}
template <int D>
size_t dkdv_smem() {
  return 2 * tile_bytes<D>(kTile) + 2 * tile_bytes<D>(kDkdvQueryRows<D>) +
         2 * sizeof(float) * kDkdvQueryRows<D> + sizeof(int) * kDkdvQueryRows<D>;
}

MmaDims make_dims(const char* what, KType q, KType k, KType v, int64_t B, int64_t T, int64_t H, int64_t KV,
                  int64_t D) {
  if (!attention_mma_supported(q, k, v, KType::F32, D))
    throw std::logic_error(std::string(what) + ": needs q, k, v of one type, BF16 or F16, and head dim 64 or 128");
  if (B < 0 || T < 0 || H < 0 || KV <= 0 || H % KV != 0 || T > (1 << 30) || B > 65535 || H > 65535 || KV > 65535)
    throw std::logic_error(std::string(what) + ": unsupported sizes (need KV > 0, H % KV == 0)");
  return MmaDims{static_cast<int>(B), static_cast<int>(T), static_cast<int>(H), static_cast<int>(KV),
                 1.0f / std::sqrt(static_cast<float>(D))};
}

void check_aligned(const char* what, std::initializer_list<const void*> pointers) {
  for (const void* p : pointers)
    if (!attention_mma_aligned(p)) throw std::logic_error(std::string(what) + ": operands must be 16-byte aligned");
}

// fn(T{}) with the 16-bit CUDA type of q's KType.
template <class Fn>
void with_half_type(KType type, Fn&& fn) {
  if (type == KType::BF16)
    fn(__nv_bfloat16{});
  else if (type == KType::F16)
    fn(__half{});
  else
    throw std::logic_error("attention_mma: q is not BF16 or F16");
}

// fn(std::integral_constant<int, D>) for D in {64, 128}.
template <class Fn>
void with_head_dim(int64_t D, Fn&& fn) {
  if (D == 64)
    fn(std::integral_constant<int, 64>{});
  else if (D == 128)
    fn(std::integral_constant<int, 128>{});
  else
    throw std::logic_error("attention_mma: head dim is not 64 or 128");
}

template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) !=
      cudaSuccess)
    check_launch("attention_mma (shared memory attribute)");
}

}  // namespace

bool attention_mma_supported(KType q, KType k, KType v, KType out, int64_t D) {
  (void)out;  // any output type: it is rounded once on store
  return (q == KType::BF16 || q == KType::F16) && k == q && v == q && (D == 64 || D == 128);
}

void attention_mma_forward(void* out, KType out_type, float* lse, const void* q, KType q_type, const void* k,
                           KType k_type, const void* v, KType v_type, const int32_t* segment_start, int64_t B,
                           int64_t T, int64_t H, int64_t KV, int64_t D, cudaStream_t stream) {
  const MmaDims d = make_dims("cuda::attention_mma_forward", q_type, k_type, v_type, B, T, H, KV, D);
  if (B == 0 || T == 0 || H == 0) return;
  check_aligned("cuda::attention_mma_forward", {q, k, v});
  with_half_type(q_type, [&](auto tag) {
    using T16 = decltype(tag);
    with_head_dim(D, [&](auto dim) {
      constexpr int HD = decltype(dim)::value;
      const size_t smem = forward_smem<HD>();
      allow_smem(mma_forward_kernel<T16, HD>, smem);
      const dim3 grid(static_cast<unsigned>((d.T + kTile - 1) / kTile), static_cast<unsigned>(d.H),
                      static_cast<unsigned>(d.B));
      mma_forward_kernel<T16, HD><<<grid, kThreads, smem, stream>>>(out, out_type, lse, static_cast<const T16*>(q),
                                                                    static_cast<const T16*>(k),
                                                                    static_cast<const T16*>(v), segment_start, d);
    });
  });
  check_launch("attention_mma_forward");
}

void attention_mma_backward(void* dq, KType dq_type, void* dk, KType dk_type, void* dv, KType dv_type,
                            const void* dout, KType dout_type, const void* q, KType q_type, const void* k,
                            KType k_type, const void* v, KType v_type, const void* out, KType out_type,
                            const float* lse, const int32_t* segment_start, float* drow, int64_t B, int64_t T,
                            int64_t H, int64_t KV, int64_t D, cudaStream_t stream) {
  const MmaDims d = make_dims("cuda::attention_mma_backward", q_type, k_type, v_type, B, T, H, KV, D);
  if (B == 0 || T == 0) return;
  check_aligned("cuda::attention_mma_backward", {dout, q, k, v});
  with_half_type(q_type, [&](auto tag) {
    using T16 = decltype(tag);
    with_ktype(dout_type, [&](auto dout_tag) {
      using S = decltype(dout_tag);
      const S* dout_s = static_cast<const S*>(dout);
      if (H > 0) {
        mma_drow_kernel<T16, S><<<blocks_for(B * T * H * 32, 256), 256, 0, stream>>>(drow, dout_s, out, out_type, d,
                                                                                    static_cast<int>(D));
        check_launch("attention_mma_backward (rowsum dout*out)");
      }
      with_head_dim(D, [&](auto dim) {
        constexpr int HD = decltype(dim)::value;
        const unsigned tiles = static_cast<unsigned>((d.T + kTile - 1) / kTile);
        const T16* q16 = static_cast<const T16*>(q);
        const T16* k16 = static_cast<const T16*>(k);
        const T16* v16 = static_cast<const T16*>(v);
        if (H > 0) {
          const size_t smem = dq_smem<HD>();
          allow_smem(mma_dq_kernel<T16, HD, S>, smem);
          mma_dq_kernel<T16, HD, S><<<dim3(tiles, static_cast<unsigned>(d.H), static_cast<unsigned>(d.B)), kThreads,
                                      smem, stream>>>(dq, dq_type, dout_s, q16, k16, v16, lse, drow, segment_start, d);
          check_launch("attention_mma_backward (dq)");
        }
        // With H == 0 the group is empty and the kernel writes zeros, as the CPU does.
        const size_t smem = dkdv_smem<HD>();
        allow_smem(mma_dkdv_kernel<T16, HD, S>, smem);
        mma_dkdv_kernel<T16, HD, S><<<dim3(tiles, static_cast<unsigned>(d.KV), static_cast<unsigned>(d.B)), kThreads,
                                      smem, stream>>>(dk, dk_type, dv, dv_type, dout_s, q16, k16, v16, lse, drow,
                                                      segment_start, d);
        check_launch("attention_mma_backward (dk, dv)");
      });
    });
  });
}

}  // namespace fsdpq::cuda
