// The fused LoRA kernels (kernels/lora_fused.cuh). The kernels multiply 16x8x16 tiles with
// mma.sync, their fragments read from shared memory with ldmatrix (kernels/mma_fragments.cuh);
// operands go global -> shared with 16-byte cp.async copies into two-stage rings, the next step's
// tiles landing while this step's are multiplied, and dropout is applied from shared memory (a
// masked copy of the x tile per adapter, one hash per 4 elements as kernels/lora_dropout.cu draws
// them) or on the way out (input grad: the mask of each product element, one hash per 2). Rows
// past M are copied as zeros. The input grad keeps A's columns in shared memory while a block
// walks kInputGradRowTiles row tiles.
// What keeps them fast: the group's description is copied to shared memory once per block (indexed
// by adapter at run time, a kernel parameter would live in local memory), and the accumulators are
// sized for the group's Σ rank (a template over its 64-column slabs) rather than for the largest.
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/lora_dropout_mask.h"
#include "kernels/lora_fused.cuh"
#include "kernels/mma_fragments.cuh"

namespace fsdpq::cuda {
namespace {

using namespace mma_fragments;

constexpr int kThreads = 128;           // down and weight grad: 4 warps
constexpr int kInputGradThreads = 256;  // input grad: 8 warps, 4 row slabs x 2 column halves
constexpr int kRows = static_cast<int>(lora_fused::kRows);  // rows of M per step (16 per warp)
constexpr int kGradCols = static_cast<int>(lora_fused::kWidthMultiple);  // dx columns per block (input grad)
constexpr int kLdGradCols = kGradCols + 8;
constexpr int kTileK = static_cast<int>(lora_fused::kTileK);  // columns of x per step (down, weight grad)
constexpr int kLdTileK = kTileK + 8;
constexpr int kSlabRank = 64;                                 // Σ rank comes in slabs of 64 (1 to 4)
static_assert(kRows == 4 * 16 && lora_fused::kRankMultiple == 16 && lora_fused::kMinChunkRows % kRows == 0);
static_assert(kLoraFusedMaxRank % kSlabRank == 0 && kGradCols == 2 * 64);

int slabs_of(int total_rank) { return (total_rank + kSlabRank - 1) / kSlabRank; }

// fn(std::integral_constant<int, slabs>) for the group's number of 64-column slabs of Σ rank.
template <class Fn>
void with_slabs(int total_rank, Fn&& fn) {
  switch (slabs_of(total_rank)) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    default: return fn(std::integral_constant<int, 4>{});
  }
}

// The block's copy of the group, in shared memory (see the top).
__device__ __forceinline__ void share_group(LoraFusedGroup& shared, const LoraFusedGroup& param) {
  if (threadIdx.x == 0) shared = param;
  __syncthreads();
}

// What an adapter multiplies in place of x[e]: the CPU's dropout (ops/lora.cpp), rounded to T.
template <class T>
__device__ __forceinline__ T dropped(T x, bool keep, float keep_scale) {
  return keep ? from_float<T>(to_float(x) * keep_scale) : from_float<T>(0.0f);
}

// 8 consecutive elements of x starting at flat index e (a multiple of 8: two whole mask quads),
// masked for the adapter whose mixed key is `key`.
template <class T>
__device__ __forceinline__ uint4 dropped8(const uint4& raw, int64_t e, uint64_t key, const LoraFusedGroup& g) {
  const T* v = reinterpret_cast<const T*>(&raw);
  const uint64_t w0 = keep_word(key, e >> 2), w1 = keep_word(key, (e >> 2) + 1);
  uint4 out;
  T* o = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int k = 0; k < 8; ++k) o[k] = dropped(v[k], keeps_lane(k < 4 ? w0 : w1, k & 3, g.threshold), g.keep_scale);
  return out;
}

// ---- down: xa = [dropout_i(x) · A_iᵀ]_i. Block (row tile, split of in); warp w owns rows 16w..
// and every xa column (SLABS · 64 of them, 8 per tile); the split's partial sums go to `partial`
// (or straight to xa with one split). The raw x tile and the A tile of step k + 1 are copied
// asynchronously into the other half of a two-stage ring while step k is masked and multiplied:
// the loads overlap the products (at 3 blocks an SM nothing else hid their latency).
template <class T>
__device__ __forceinline__ void stage_down_tiles(T* raw_s, T* a_s, const T* x, const LoraFusedGroup& g, int64_t m0,
                                                 int64_t M, int64_t k0, int64_t in) {
  cp_async_rows<kThreads>(raw_s, kLdTileK, x + m0 * in + k0, in, kRows, kTileK, M - m0);
  for (int i = 0; i < g.count; ++i)
    cp_async_rows<kThreads>(a_s + g.first[i] * kLdTileK, kLdTileK, static_cast<const T*>(g.A[i]) + k0, in, g.rank[i],
                            kTileK, g.rank[i]);
  cp_async_commit();
}

// The staged raw x tile masked once per adapter into xm_s[i] (rows past M stay zero: their raw
// rows were zero-filled and a masked zero is zero).
template <class T>
__device__ __forceinline__ void mask_staged_x(T* xm_s, const T* raw_s, const LoraFusedGroup& g, int64_t m0,
                                              int64_t k0, int64_t in) {
  constexpr int kChunks = kTileK / 8;
  for (int idx = threadIdx.x; idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = (idx - r * kChunks) * 8;
    const uint4 raw = *reinterpret_cast<const uint4*>(raw_s + r * kLdTileK + c);
    const int64_t e = (m0 + r) * in + k0 + c;
    for (int i = 0; i < g.count; ++i)
      *reinterpret_cast<uint4*>(xm_s + (i * kRows + r) * kLdTileK + c) = dropped8<T>(raw, e, g.mixed_key[i], g);
  }
}

template <class T, class XA, int SLABS>
__global__ void __launch_bounds__(kThreads) down_kernel(XA* xa, float* partial, const T* x, const LoraFusedGroup param,
                                                        int64_t M, int64_t in, int64_t k_per_split) {
  constexpr int NT = SLABS * kSlabRank / 8;
  __shared__ LoraFusedGroup g;
  share_group(g, param);
  extern __shared__ uint4 smem_raw[];
  T* xm_s = reinterpret_cast<T*>(smem_raw);                 // [count][kRows][kLdTileK]: masked x
  T* raw_s = xm_s + g.count * kRows * kLdTileK;             // [2][kRows][kLdTileK]: the ring's raw x
  T* a_ring = raw_s + 2 * kRows * kLdTileK;                 // [2][Σ rank][kLdTileK]: the ring's A
  const int a_stage = g.total_rank * kLdTileK;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t4 = lane & 3;
  const int64_t m0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t k_begin = static_cast<int64_t>(blockIdx.y) * k_per_split;
  const int64_t k_end = k_begin + k_per_split < in ? k_begin + k_per_split : in;
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

  if (k_begin < k_end) stage_down_tiles(raw_s, a_ring, x, g, m0, M, k_begin, in);
  int stage = 0;
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kTileK, stage ^= 1) {
    cp_async_wait<0>();  // this step's tiles have landed (this thread's copies) ...
    __syncthreads();     // ... everyone's, and the previous step's products are done
    if (k0 + kTileK < k_end)
      stage_down_tiles(raw_s + (stage ^ 1) * kRows * kLdTileK, a_ring + (stage ^ 1) * a_stage, x, g, m0, M,
                       k0 + kTileK, in);
    mask_staged_x(xm_s, raw_s + stage * kRows * kLdTileK, g, m0, k0, in);
    __syncthreads();
    const T* a_s = a_ring + stage * a_stage;
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk)
      for (int i = 0; i < g.count; ++i) {
        uint32_t a[4];
        ldsm_a<kLdTileK>(a, xm_s + i * kRows * kLdTileK, warp * 16, kk * 16, lane);
        // An adapter's tiles come in pairs: its first column and its rank are multiples of 16.
        const int j_begin = g.first[i] / 8, j_end = (g.first[i] + g.rank[i]) / 8;
#pragma unroll
        for (int j = 0; j < NT; j += 2)
          if (j >= j_begin && j < j_end) {  // warp-uniform
            uint32_t b[4];
            ldsm_b_pair<kLdTileK>(b, a_s, j * 8, kk * 16, lane);
            mma<T>(acc[j], a, b[0], b[1]);
            mma<T>(acc[j + 1], a, b[2], b[3]);
          }
      }
  }
  const int total = g.total_rank;
  const int64_t r_lo = m0 + warp * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    if (j * 8 >= total) break;
    const int col = j * 8 + 2 * t4;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = r_lo + 8 * h;
      if (row >= M) continue;
      if (partial != nullptr) {
        *reinterpret_cast<float2*>(partial + (static_cast<int64_t>(blockIdx.y) * M + row) * total + col) =
            make_float2(acc[j][2 * h], acc[j][2 * h + 1]);
      } else {
        xa[row * total + col] = from_float<XA>(acc[j][2 * h]);
        xa[row * total + col + 1] = from_float<XA>(acc[j][2 * h + 1]);
      }
    }
  }
}

// xa = the splits' partial sums, added in split order, rounded once.
template <class XA>
__global__ void down_reduce_kernel(XA* xa, const float* partial, int splits, int64_t n) {
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < splits; ++s) sum += partial[s * n + idx];
    xa[idx] = from_float<XA>(sum);
  }
}

// ---- input grad: dx += Σ_i keep_i ⊙ keep_scale ⊙ (dxa_i · A_i). Block (128 dx columns, 64 rows),
// 8 warps: warp w owns rows 16 (w % 4).. and the 64 columns 64 (w / 4).. of the block's 128.
template <class DX>
__device__ __forceinline__ void add_pair(DX* p, float lo, float hi);
template <>
__device__ __forceinline__ void add_pair<float>(float* p, float lo, float hi) {
  float2 v = *reinterpret_cast<float2*>(p);
  v.x += lo;
  v.y += hi;
  *reinterpret_cast<float2*>(p) = v;
}
template <class DX>
__device__ __forceinline__ void add_pair(DX* p, float lo, float hi) {  // 16-bit: one 32-bit access
  const uint32_t old = *reinterpret_cast<const uint32_t*>(p);
  const DX* v = reinterpret_cast<const DX*>(&old);
  *reinterpret_cast<uint32_t*>(p) = pack2<DX>(to_float(v[0]) + lo, to_float(v[1]) + hi);
}

// The rows one input-grad block walks (row tiles of kRows), keeping A's columns in shared memory:
// 8 tiles give a 7B layer's q,k,v group (8192 rows, in 4096) 512 blocks.
constexpr int kInputGradRowTiles = 8;

template <class T, class DX, int SLABS>
__global__ void __launch_bounds__(kInputGradThreads)
    input_grad_kernel(DX* dx, const T* dxa, const LoraFusedGroup param, int64_t M, int64_t in) {
  constexpr int NT = 64 / 8;                  // the warp's 64 columns
  constexpr int LDR = SLABS * kSlabRank + 8;  // a [rows][Σ rank] tile of dxa, its slabs only
  __shared__ LoraFusedGroup g;
  share_group(g, param);
  extern __shared__ uint4 smem_raw[];
  T* a_s = reinterpret_cast<T*>(smem_raw);               // [Σ rank][kLdGradCols]: every adapter's A columns c0..
  T* dxa_ring = a_s + g.total_rank * kLdGradCols;        // [2][kRows][LDR]: the ring's dxa rows
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t4 = lane & 3;
  const int row_slab = warp % 4, col_half = warp / 4;
  const int col0 = col_half * 64;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kGradCols;
  const int64_t tiles = (M + kRows - 1) / kRows;
  const int64_t tile_begin = static_cast<int64_t>(blockIdx.y) * kInputGradRowTiles;
  const int64_t tile_end = tile_begin + kInputGradRowTiles < tiles ? tile_begin + kInputGradRowTiles : tiles;
  const int total = g.total_rank;

  // A's columns once, with the first dxa rows (one copy group).
  for (int i = 0; i < g.count; ++i)
    cp_async_rows<kInputGradThreads>(a_s + g.first[i] * kLdGradCols, kLdGradCols, static_cast<const T*>(g.A[i]) + c0,
                                     in, g.rank[i], kGradCols, g.rank[i]);
  // Rows [m0, m0 + kRows) of dxa into ring stage `stage`, zeros past M.
  const auto stage_dxa = [&](int stage, int64_t m0) {
    cp_async_rows<kInputGradThreads>(dxa_ring + stage * kRows * LDR, LDR, dxa + m0 * total, total, kRows, total, M - m0);
    cp_async_commit();
  };
  if (tile_begin < tile_end) stage_dxa(0, tile_begin * kRows);

  int stage = 0;
  for (int64_t tile = tile_begin; tile < tile_end; ++tile, stage ^= 1) {
    cp_async_wait<0>();  // this tile's dxa rows (and A) have landed (this thread's copies) ...
    __syncthreads();     // ... everyone's, and the previous tile's products are done
    if (tile + 1 < tile_end) stage_dxa(stage ^ 1, (tile + 1) * kRows);
    const T* dxa_s = dxa_ring + stage * kRows * LDR;
    const int64_t r_lo = tile * kRows + row_slab * 16 + (lane >> 2);
    float sum[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) sum[j][0] = sum[j][1] = sum[j][2] = sum[j][3] = 0.0f;
    for (int i = 0; i < g.count; ++i) {
      float acc[NT][4];
#pragma unroll
      for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
      for (int kk = 0; kk < g.rank[i] / 16; ++kk) {
        uint32_t a[4];
        ldsm_a<LDR>(a, dxa_s, row_slab * 16, g.first[i] + kk * 16, lane);
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
          uint32_t b[4];
          ldsm_b_trans_pair<kLdGradCols>(b, a_s, g.first[i] + kk * 16, col0 + j * 8, lane);
          mma<T>(acc[j], a, b[0], b[1]);
          mma<T>(acc[j + 1], a, b[2], b[3]);
        }
      }
      // Each element's own mask: columns 2t, 2t + 1 of a row share a quad (in is a multiple of 4).
      const uint64_t key = g.mixed_key[i];
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t e = (r_lo + 8 * h) * in + c0 + col0 + j * 8 + 2 * t4;
          const uint64_t word = keep_word(key, e >> 2);
          const int first_lane = static_cast<int>(e & 3);
          if (keeps_lane(word, first_lane, g.threshold)) sum[j][2 * h] += g.keep_scale * acc[j][2 * h];
          if (keeps_lane(word, first_lane + 1, g.threshold)) sum[j][2 * h + 1] += g.keep_scale * acc[j][2 * h + 1];
        }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = r_lo + 8 * h;
        if (row < M) add_pair(dx + row * in + c0 + col0 + j * 8 + 2 * t4, sum[j][2 * h], sum[j][2 * h + 1]);
      }
  }
}

// ---- weight grad: partial[chunk] = [dxa_iᵀ · dropout_i(x)]_i over the chunk's rows. Block (64
// columns of in, a chunk of chunk_rows rows of M: lora_fused::weight_grad_chunk_rows, whole 64-row
// steps); warp w owns the 16-rank slabs w, w + 4, … of the group's SLABS · 64 rank rows.
template <class T, int SLABS>
__global__ void __launch_bounds__(kThreads)
    weight_grad_kernel(float* partial, const T* dxa, const T* x, const LoraFusedGroup param, int64_t M, int64_t in,
                       int64_t chunk_rows) {
  constexpr int kSlabsPerWarp = SLABS * kSlabRank / 16 / 4;
  constexpr int NT = kTileK / 8;
  __shared__ LoraFusedGroup g;
  share_group(g, param);
  constexpr int LDR = SLABS * kSlabRank + 8;  // a [rows][Σ rank] tile of dxa, its slabs only
  extern __shared__ uint4 smem_raw[];
  T* xm_s = reinterpret_cast<T*>(smem_raw);       // [count][kRows][kLdTileK]: masked x
  T* raw_s = xm_s + g.count * kRows * kLdTileK;   // [2][kRows][kLdTileK]: the ring's raw x
  T* dxa_ring = raw_s + 2 * kRows * kLdTileK;     // [2][kRows][LDR]: the ring's dxa rows
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, t4 = lane & 3;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTileK;
  const int64_t m_begin = static_cast<int64_t>(blockIdx.y) * chunk_rows;
  const int64_t m_end = m_begin + chunk_rows < M ? m_begin + chunk_rows : M;
  const int total = g.total_rank;
  int adapter_of[kSlabsPerWarp];  // the adapter of each of this warp's slabs (-1: past Σ rank)
#pragma unroll
  for (int q = 0; q < kSlabsPerWarp; ++q) {
    const int rank_row = (warp + 4 * q) * 16;
    adapter_of[q] = -1;
    for (int i = 0; i < g.count; ++i)
      if (rank_row >= g.first[i] && rank_row < g.first[i] + g.rank[i]) adapter_of[q] = i;
  }
  float acc[kSlabsPerWarp][NT][4];
#pragma unroll
  for (int q = 0; q < kSlabsPerWarp; ++q)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[q][j][0] = acc[q][j][1] = acc[q][j][2] = acc[q][j][3] = 0.0f;

  // Rows [m0, m0 + kRows) of dxa and of x's columns c0.. into ring stage `stage`, zeros past m_end.
  const auto stage_tiles = [&](int stage, int64_t m0) {
    cp_async_rows<kThreads>(dxa_ring + stage * kRows * LDR, LDR, dxa + m0 * total, total, kRows, total, m_end - m0);
    cp_async_rows<kThreads>(raw_s + stage * kRows * kLdTileK, kLdTileK, x + m0 * in + c0, in, kRows, kTileK, m_end - m0);
    cp_async_commit();
  };

  if (m_begin < m_end) stage_tiles(0, m_begin);
  int stage = 0;
  for (int64_t m0 = m_begin; m0 < m_end; m0 += kRows, stage ^= 1) {
    cp_async_wait<0>();  // this step's tiles have landed (this thread's copies) ...
    __syncthreads();     // ... everyone's, and the previous step's products are done
    if (m0 + kRows < m_end) stage_tiles(stage ^ 1, m0 + kRows);
    mask_staged_x(xm_s, raw_s + stage * kRows * kLdTileK, g, m0, c0, in);
    __syncthreads();
    const T* dxa_s = dxa_ring + stage * kRows * LDR;
#pragma unroll
    for (int q = 0; q < kSlabsPerWarp; ++q) {
      if (adapter_of[q] < 0) continue;  // warp-uniform
      const T* xm = xm_s + adapter_of[q] * kRows * kLdTileK;
#pragma unroll
      for (int kk = 0; kk < kRows / 16; ++kk) {
        uint32_t a[4];
        ldsm_a_trans<LDR>(a, dxa_s, (warp + 4 * q) * 16, kk * 16, lane);  // dxaᵀ: rank rows, M columns
#pragma unroll
        for (int j = 0; j < NT; j += 2) {
          uint32_t b[4];
          ldsm_b_trans_pair<kLdTileK>(b, xm, kk * 16, j * 8, lane);
          mma<T>(acc[q][j], a, b[0], b[1]);
          mma<T>(acc[q][j + 1], a, b[2], b[3]);
        }
      }
    }
  }
#pragma unroll
  for (int q = 0; q < kSlabsPerWarp; ++q) {
    if (adapter_of[q] < 0) continue;
    const int rank_lo = (warp + 4 * q) * 16 + (lane >> 2);
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(partial + (static_cast<int64_t>(blockIdx.y) * total + rank_lo + 8 * h) * in + c0 +
                                   j * 8 + 2 * t4) = make_float2(acc[q][j][2 * h], acc[q][j][2 * h + 1]);
  }
}

struct AdapterGrads {
  float* dA[kLoraFusedMaxAdapters];
};

// dA_i += the chunks' partial sums, added in chunk order.
__global__ void weight_grad_reduce_kernel(const AdapterGrads grads_param, const float* partial,
                                          const LoraFusedGroup param, int chunks, int64_t in) {
  __shared__ LoraFusedGroup g;  // indexed by adapter: in shared memory, not local (see the top)
  __shared__ AdapterGrads grads;
  if (threadIdx.x == 0) grads = grads_param;
  share_group(g, param);
  const int64_t n = static_cast<int64_t>(g.total_rank) * in;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float sum = 0.0f;
    for (int c = 0; c < chunks; ++c) sum += partial[c * n + idx];
    const int row = static_cast<int>(idx / in);
    int i = 0;
    while (i + 1 < g.count && row >= g.first[i + 1]) ++i;
    float* dA = grads.dA[i] + (row - g.first[i]) * in + idx % in;
    *dA += sum;
  }
}

// ---- launch helpers ----

void check_group(const char* what, KType type, int64_t in, const LoraFusedGroup& g) {
  if (!lora_fused_supported(type, in, g))
    throw std::logic_error(std::string(what) +
                           ": needs x, A, dxa of one 16-bit type, ranks that are multiples of 16 with a sum of at most "
                           "256, and an input width that is a multiple of 128");
}

template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes, const char* what) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) != cudaSuccess)
    check_launch(what);
}

// fn(T{}) with the CUDA 16-bit type of `type`.
template <class Fn>
void with_16bit(KType type, Fn&& fn) {
  if (type == KType::BF16)
    fn(__nv_bfloat16{});
  else
    fn(__half{});
}

using lora_fused::down_k_per_split;
using lora_fused::down_splits;
using lora_fused::row_tiles;
using lora_fused::weight_grad_chunks;

}  // namespace

bool lora_fused_supported(KType type, int64_t in, const LoraFusedGroup& g) {
  if (type != KType::BF16 && type != KType::F16) return false;
  if (g.count < 1 || g.count > kLoraFusedMaxAdapters) return false;
  int64_t ranks[kLoraFusedMaxAdapters] = {};
  int total = 0;
  for (int i = 0; i < g.count; ++i) {
    if (g.first[i] != total || g.A[i] == nullptr) return false;
    ranks[i] = g.rank[i];
    total += g.rank[i];
  }
  return total == g.total_rank && lora_fused::takes(in, ranks, static_cast<size_t>(g.count));
}

void lora_fused_down(void* xa, KType xa_type, const void* x, KType type, const LoraFusedGroup& g, int64_t M, int64_t in,
                     float* workspace, cudaStream_t stream) {
  check_group("cuda::lora_fused_down", type, in, g);
  if (M == 0) return;
  const int64_t per = down_k_per_split(M, in), splits = down_splits(M, in);
  if (splits > 1 && workspace == nullptr) throw std::logic_error("cuda::lora_fused_down: no workspace for the split");
  // masked x per adapter, and the two-stage ring of raw x and A tiles
  const size_t smem = sizeof(uint16_t) * static_cast<size_t>((g.count * kRows + 2 * kRows + 2 * g.total_rank) * kLdTileK);
  with_16bit(type, [&](auto tag) {
    using T = decltype(tag);
    with_ktype(xa_type, [&](auto xa_tag) {
      using XA = decltype(xa_tag);
      with_slabs(g.total_rank, [&](auto slabs) {
        constexpr int SLABS = decltype(slabs)::value;
        allow_smem(down_kernel<T, XA, SLABS>, smem, "lora_fused_down (shared memory attribute)");
        const dim3 grid(static_cast<unsigned>(row_tiles(M)), static_cast<unsigned>(splits));
        down_kernel<T, XA, SLABS><<<grid, kThreads, smem, stream>>>(
            static_cast<XA*>(xa), splits > 1 ? workspace : nullptr, static_cast<const T*>(x), g, M, in, per);
      });
      check_launch("lora_fused_down");
    });
  });
  if (splits > 1) lora_fused_split_sum(xa, xa_type, workspace, static_cast<int>(splits), M * g.total_rank, stream);
}

void lora_fused_split_sum(void* xa, KType xa_type, const float* partial, int splits, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  with_ktype(xa_type, [&](auto xa_tag) {
    using XA = decltype(xa_tag);
    down_reduce_kernel<XA><<<blocks_for(n), 256, 0, stream>>>(static_cast<XA*>(xa), partial, splits, n);
  });
  check_launch("lora_fused_down (split sum)");
}

void lora_fused_input_grad(void* dx, KType dx_type, const void* dxa, KType type, const LoraFusedGroup& g, int64_t M,
                           int64_t in, cudaStream_t stream) {
  check_group("cuda::lora_fused_input_grad", type, in, g);
  if (M == 0) return;
  const int64_t row_blocks = (row_tiles(M) + kInputGradRowTiles - 1) / kInputGradRowTiles;
  with_16bit(type, [&](auto tag) {
    using T = decltype(tag);
    with_ktype(dx_type, [&](auto dx_tag) {
      using DX = decltype(dx_tag);
      with_slabs(g.total_rank, [&](auto slabs) {
        constexpr int SLABS = decltype(slabs)::value;
        // A's columns, and the two-stage ring of dxa rows
        const size_t smem = sizeof(uint16_t) * static_cast<size_t>(g.total_rank * kLdGradCols +
                                                                   2 * kRows * (SLABS * kSlabRank + 8));
        allow_smem(input_grad_kernel<T, DX, SLABS>, smem, "lora_fused_input_grad (shared memory attribute)");
        const dim3 grid(static_cast<unsigned>(in / kGradCols), static_cast<unsigned>(row_blocks));
        input_grad_kernel<T, DX, SLABS><<<grid, kInputGradThreads, smem, stream>>>(
            static_cast<DX*>(dx), static_cast<const T*>(dxa), g, M, in);
      });
    });
  });
  check_launch("lora_fused_input_grad");
}

void lora_fused_weight_grad(float* const* dA, const void* dxa, const void* x, KType type, const LoraFusedGroup& g,
                            int64_t M, int64_t in, float* workspace, cudaStream_t stream) {
  check_group("cuda::lora_fused_weight_grad", type, in, g);
  if (M == 0) return;
  if (workspace == nullptr) throw std::logic_error("cuda::lora_fused_weight_grad: no workspace");
  const int64_t chunk_rows = lora_fused::weight_grad_chunk_rows(M, in), chunks = weight_grad_chunks(M, in);
  with_16bit(type, [&](auto tag) {
    using T = decltype(tag);
    with_slabs(g.total_rank, [&](auto slabs) {
      constexpr int SLABS = decltype(slabs)::value;
      // masked x per adapter, and the two-stage ring of raw x tiles and dxa rows
      const size_t smem = sizeof(uint16_t) * static_cast<size_t>((g.count + 2) * kRows * kLdTileK +
                                                                 2 * kRows * (SLABS * kSlabRank + 8));
      allow_smem(weight_grad_kernel<T, SLABS>, smem, "lora_fused_weight_grad (shared memory attribute)");
      const dim3 grid(static_cast<unsigned>(in / kTileK), static_cast<unsigned>(chunks));
      weight_grad_kernel<T, SLABS><<<grid, kThreads, smem, stream>>>(workspace, static_cast<const T*>(dxa),
                                                                     static_cast<const T*>(x), g, M, in, chunk_rows);
    });
  });
  check_launch("lora_fused_weight_grad");
  lora_fused_weight_grad_sum(dA, workspace, g, static_cast<int>(chunks), in, stream);
}

void lora_fused_weight_grad_sum(float* const* dA, const float* partial, const LoraFusedGroup& g, int chunks, int64_t in,
                                cudaStream_t stream) {
  AdapterGrads grads{};
  for (int i = 0; i < g.count; ++i) grads.dA[i] = dA[i];
  weight_grad_reduce_kernel<<<blocks_for(static_cast<int64_t>(g.total_rank) * in), 256, 0, stream>>>(
      grads, partial, g, chunks, in);
  check_launch("lora_fused_weight_grad (chunk sum)");
}

}  // namespace fsdpq::cuda
