// The Hopper attention forward (kernels/attention_sm90a.cuh). One block per (128-row query tile, h,
// b), long (late) tiles first; 3 warpgroups with fixed roles:
//  - warpgroup 0, the producer: one thread issues the bulk tensor copies — the Q tile once, then
//    for each key tile, from the diagonal one down to the first, K and V into stage i % kStages of
//    a ring, each stage with a "full" barrier (bytes arrived) and an "empty" one (every consumer
//    thread is done). It keeps 24 registers per thread and gives the rest to the consumers.
//  - warpgroups 1 and 2, the consumers: 64 query rows each, all 128 keys of a tile per step.
//    S = Q Kᵀ is wgmma m64n128k16 with both operands in shared memory (K-major); P V is
//    m64nDk16 with P in registers (the accumulators of S, rounded to 16 bits, are already in the
//    A operand's layout) and V in shared memory read MN-major (no transpose anywhere).
// Within a consumer the softmax of tile i overlaps the tensor cores (FlashAttention-3's
// intra-warpgroup pipelining): it issues S_i = Q K_iᵀ, then O += P_{i-1} V_{i-1}, waits for S_i
// only, computes P_i while P V runs, then waits for P V and rescales O. The two consumers run
// independently, so one's softmax also overlaps the other's products.
// Only the first (diagonal) tile needs the causal mask: query and key tiles are both 128 rows, so
// every other tile lies wholly at or below the diagonal. Packed rows (segment_start) also mask the
// keys before each row's example, in any tile, and the block stops at the first key tile any of
// its rows sees; the diagonal tile comes first and holds each row's own key, so every row's
// maximum is finite from the first tile on. Rows and keys past T are zeros from the
// copy engine; a real row never sees them (key <= row < T) and padding rows are never stored.
// The epilogue writes O / l as 16-bit values into the consumer's (no longer needed) rows of the Q
// tile, in the copy engine's swizzled layout, and one thread stores them with a bulk tensor copy.
#include <climits>
#include <cmath>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/attention_sm90a.cuh"
#include "kernels/hopper/mbarrier.cuh"
#include "kernels/hopper/shared_memory.cuh"
#include "kernels/hopper/sm90a_image.cuh"
#include "kernels/hopper/tensor_map.cuh"
#include "kernels/hopper/tma.cuh"
#include "kernels/hopper/type_and_dim.cuh"
#include "kernels/hopper/warpgroup.cuh"
#include "kernels/hopper/wgmma.cuh"
#include "kernels/quad_reduce.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_sm90a.cu needs sm_90a (wgmma, setmaxnreg): CMakeLists.txt builds *_sm90a.cu for it alone"
#endif

namespace fsdpq::cuda {
namespace {

using namespace hopper;

constexpr int kConsumers = 2;                    // warpgroups multiplying, 64 query rows each
constexpr int kThreads = 128 * (1 + kConsumers);  // plus the producer warpgroup
constexpr int kBlockM = 64 * kConsumers;          // query rows per block
constexpr int kBlockN = 128;                      // keys per step (== kBlockM: one masked tile)
constexpr int kStages = 2;                        // K, V tiles in flight
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;  // 128·24 + 256·240 <= 64K
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kBlockM == kBlockN, "the causal mask is applied to the first key tile only");

// Shared memory, in bytes from a 1024-byte aligned base. A tile of R rows and D columns is D / 64
// column blocks of R rows x 128 bytes (kernels/hopper/wgmma.cuh), so consumer c's 64 rows of Q
// start 64·128·c bytes into each Q column block.
template <int D>
struct Smem {
  static constexpr int kColumnBlocks = D / kBoxColumns;
  static constexpr int kQColumnBlock = kBlockM * kSwizzleRowBytes;
  static constexpr int kKvColumnBlock = kBlockN * kSwizzleRowBytes;
  static constexpr int kQBytes = kQColumnBlock * kColumnBlocks;
  static constexpr int kKvBytes = kKvColumnBlock * kColumnBlocks;  // one K or V tile
  static constexpr int kK = kQBytes;                                 // K stages
  static constexpr int kV = kK + kStages * kKvBytes;                 // V stages
  static constexpr int kBarriers = kV + kStages * kKvBytes;
  static constexpr int kConsumerRows = 64 * kSwizzleRowBytes;  // offset of consumer c's Q rows: c times this
};

struct Barriers {
  uint64_t q_full;
  uint64_t k_full[kStages], v_full[kStages];    // the copy engine's bytes have landed
  uint64_t k_empty[kStages], v_empty[kStages];  // every consumer thread is done with the stage
};

template <int D>
constexpr size_t smem_bytes() {
  return Smem<D>::kBarriers + sizeof(Barriers) + 1024;  // + room to align the base to 1024
}

struct Params {
  int T, H, KV;
  float scale;  // 1 / sqrt(D), as the CPU computes it
  float* lse;
  const int32_t* segment_start;  // [B, T], nullptr: plain causal
};

// This block's work: query tile qt (rows q0..q0+127) of head h of batch b, key tiles qt down to
// qt - key_tiles + 1 (0 without segments).
struct Tile {
  int q0, last, key_tiles, h, kv_head, b;
  __device__ int key0(int i) const { return (last - i) * kBlockN; }  // the i-th key tile's first key
};

__device__ __forceinline__ Tile tile_of_block(const Params& p, int first_key_tile) {
  const int qt = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);  // long tiles first
  const int h = static_cast<int>(blockIdx.y);
  return Tile{qt * kBlockM, qt, qt + 1 - first_key_tile, h, h / (p.H / p.KV), static_cast<int>(blockIdx.z)};
}

// The first key query t sees: its example's start with segments, else (and past T) 0.
__device__ __forceinline__ int first_key(const Params& p, int b, int t) {
  return p.segment_start != nullptr && t < p.T ? p.segment_start[static_cast<int64_t>(b) * p.T + t] : 0;
}

// Stage and phase parity of the i-th key tile a block handles.
__device__ __forceinline__ int stage_of(int i) { return i % kStages; }
__device__ __forceinline__ uint32_t parity_of(int i) { return static_cast<uint32_t>(i / kStages) & 1u; }

// ---- the producer ----

template <int D>
__device__ void produce(const CUtensorMap& q_map, const CUtensorMap& k_map, const CUtensorMap& v_map, uint8_t* smem,
                        Barriers& bar, const Tile& t) {
  using S = Smem<D>;
  mbarrier_arrive_expect_tx(&bar.q_full, S::kQBytes);
  for (int c = 0; c < kConsumers; ++c)
    for (int cb = 0; cb < S::kColumnBlocks; ++cb)
      tma_load_4d(smem + cb * S::kQColumnBlock + c * S::kConsumerRows, q_map, &bar.q_full, cb * kBoxColumns,
                  t.q0 + 64 * c, t.h, t.b);
  for (int i = 0; i < t.key_tiles; ++i) {
    const int s = stage_of(i), k0 = t.key0(i);
    const uint32_t parity = parity_of(i) ^ 1u;  // the phase in which the stage was last emptied
    mbarrier_wait(&bar.k_empty[s], parity);
    mbarrier_arrive_expect_tx(&bar.k_full[s], S::kKvBytes);
    for (int cb = 0; cb < S::kColumnBlocks; ++cb)
      tma_load_4d(smem + S::kK + s * S::kKvBytes + cb * S::kKvColumnBlock, k_map, &bar.k_full[s], cb * kBoxColumns,
                  k0, t.kv_head, t.b);
    mbarrier_wait(&bar.v_empty[s], parity);
    mbarrier_arrive_expect_tx(&bar.v_full[s], S::kKvBytes);
    for (int cb = 0; cb < S::kColumnBlocks; ++cb)
      tma_load_4d(smem + S::kV + s * S::kKvBytes + cb * S::kKvColumnBlock, v_map, &bar.v_full[s], cb * kBoxColumns,
                  k0, t.kv_head, t.b);
  }
}

// ---- the consumers' products ----

// s = Q Kᵀ over D: this consumer's 64 rows of Q, the 128 keys of a K stage (issued, not waited for).
template <class T, int D>
__device__ __forceinline__ void issue_scores(float (&s)[64], const uint8_t* q_rows, const uint8_t* k_tile) {
  using S = Smem<D>;
  const uint64_t q = opaque(descriptor_k_major(q_rows)), k = opaque(descriptor_k_major(k_tile));
  auto at = [](uint64_t base, int kk, int column_block) { return advanced(base, kk / 4 * column_block + kk % 4 * 32); };
  wgmma_m64n128k16_ss<T, false>(s, q, k);  // s = ..., not s += ...: s's old values are no input
#pragma unroll
  for (int kk = 1; kk < D / 16; ++kk)
    wgmma_m64n128k16_ss<T, true>(s, at(q, kk, S::kQColumnBlock), at(k, kk, S::kKvColumnBlock));
}

// o += P V: P (64 rows x 128 keys) in registers, V (128 keys x D) a V stage (issued, not waited for).
template <class T, int D>
__device__ __forceinline__ void issue_pv(float (&o)[D / 2], const uint32_t (&p)[32], const uint8_t* v_tile) {
  static_assert(kBlockN / 16 * 4 == 32, "P holds 4 registers per 16 keys");
  wgmma_rs_over_k<T, D>(o, p, opaque(descriptor_mn_major(v_tile, Smem<D>::kKvColumnBlock)));
}

// ---- the consumers' softmax ----

// The running statistics of this thread's two rows ([0]: row g, [1]: row g + 8 of its warp's 16).
struct RowStats {
  float max[2] = {-INFINITY, -INFINITY};  // of the raw scores so far
  float sum[2] = {0.0f, 0.0f};            // of exp(scale (score - max)) over this thread's columns
};

// Folds one key tile's scores into the statistics: s becomes the tile's probabilities (relative to
// the new maxima), alpha how much the rows' earlier terms shrink. On the diagonal tile keys past a
// row's own position are masked (row, keys: offsets within the block); with segments, also keys
// before column hidden_below[i] of the tile (row i's example starts there; <= 0: none hidden).
template <bool kDiagonal, bool kSegmented>
__device__ __forceinline__ void softmax_tile(float (&s)[64], RowStats& r, float scale_log2, int row, int t4,
                                             const int (&hidden_below)[2], float (&alpha)[2]) {
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int column = 8 * j + 2 * t4 + (e & 1);
      if (kDiagonal && column > row + 8 * (e >> 1)) s[4 * j + e] = -INFINITY;
      if (kSegmented && column < hidden_below[e >> 1]) s[4 * j + e] = -INFINITY;
      tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[4 * j + e]);
    }
  float neg_max_scaled[2], tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    // Finite: every row sees its diagonal key in the first tile (its example includes it).
    const float new_max = fmaxf(r.max[i], quad_max(tile_max[i]));
    alpha[i] = exp2f((r.max[i] - new_max) * scale_log2);  // 0 on the first tile
    r.max[i] = new_max;
    neg_max_scaled[i] = -new_max * scale_log2;
  }
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float x = exp2f(fmaf(s[4 * j + e], scale_log2, neg_max_scaled[e >> 1]));
      s[4 * j + e] = x;
      tile_sum[e >> 1] += x;
    }
#pragma unroll
  for (int i = 0; i < 2; ++i) r.sum[i] = r.sum[i] * alpha[i] + tile_sum[i];  // fp32 P; rounded only for P V
}

template <int N>
__device__ __forceinline__ void rescale(float (&o)[N], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < N / 4; ++j) {
    o[4 * j] *= alpha[0];
    o[4 * j + 1] *= alpha[0];
    o[4 * j + 2] *= alpha[1];
    o[4 * j + 3] *= alpha[1];
  }
}

// ---- the consumers' epilogue ----

// out = o / l through this consumer's rows of the Q tile (free once its last Q Kᵀ is done), and
// lse = max · scale + log l for its rows before T.
template <class T, int D>
__device__ void store_rows(const float (&o)[D / 2], const RowStats& r, uint8_t* q_rows, const CUtensorMap& out_map,
                           const Params& p, const Tile& t, int consumer, int row_in_consumer, int t4) {
  using S = Smem<D>;
  float sum[2], inv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    sum[i] = quad_sum(r.sum[i]);
    inv[i] = 1.0f / sum[i];
  }
#pragma unroll
  for (int j = 0; j < D / 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = row_in_consumer + 8 * i, chunk = (j % 8) ^ (row % 8);  // the copy engine's swizzle
      uint8_t* at = q_rows + (j / 8) * S::kQColumnBlock + row * kSwizzleRowBytes + chunk * 16 + t4 * 4;
      *reinterpret_cast<uint32_t*>(at) = pack2<T>(o[4 * j + 2 * i] * inv[i], o[4 * j + 2 * i + 1] * inv[i]);
    }
  fence_proxy_async_shared();
  warpgroup_sync(1 + consumer);
  if (threadIdx.x % 128 == 0) {
    for (int cb = 0; cb < S::kColumnBlocks; ++cb)
      tma_store_4d(out_map, q_rows + cb * S::kQColumnBlock, cb * kBoxColumns, t.q0 + 64 * consumer, t.h, t.b);
    tma_store_commit_and_wait_read();
  }
  if (t4 == 0)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int position = t.q0 + 64 * consumer + row_in_consumer + 8 * i;
      if (position < p.T)
        p.lse[(static_cast<int64_t>(t.b) * p.H + t.h) * p.T + position] = r.max[i] * p.scale + logf(sum[i]);
    }
}

// ---- a consumer warpgroup ----

// One consumer's state across its key tiles (FlashAttention-3's order): after tile i's softmax,
// O still holds the terms of tiles < i - 1 relative to the maxima before tile i - 1, and p holds
// P_{i-1}; the next step rescales O by tile i - 1's alpha while Q K_iᵀ runs, then adds P_{i-1} V.
// P is converted to the A operand only once P V has finished reading the previous one.
template <class T, int D, bool kSegmented>
struct Consumer {
  using S = Smem<D>;
  uint8_t* smem;
  Barriers& bar;
  float scale_log2;
  const Tile& tile;
  int start[2];  // with segments: the first key this thread's rows see
  const int index = static_cast<int>(threadIdx.x) / 128 - 1;  // 0 or 1
  const int t4 = static_cast<int>(threadIdx.x) % 4;
  const int row_in_consumer = (static_cast<int>(threadIdx.x) % 128) / 32 * 16 + static_cast<int>(threadIdx.x) % 32 / 4;
  const int row_in_block = 64 * index + row_in_consumer;  // this thread's rows: this and + 8
  uint8_t* const q_rows = smem + index * S::kConsumerRows;
  float s[64], o[D / 2] = {}, alpha[2];
  uint32_t p[32];
  RowStats rows;

  __device__ uint8_t* k_tile(int stage) const { return smem + S::kK + stage * S::kKvBytes; }
  // Tile i's columns before which this thread's rows see nothing (their examples start there).
  __device__ void hidden_below(int i, int (&columns)[2]) const {
    columns[0] = start[0] - tile.key0(i);
    columns[1] = start[1] - tile.key0(i);
  }
  __device__ uint8_t* v_tile(int stage) const { return smem + S::kV + stage * S::kKvBytes; }

  // Tile 0 (the diagonal one): its scores and softmax.
  __device__ __forceinline__ void first_tile() {
    mbarrier_wait(&bar.q_full, 0);
    mbarrier_wait(&bar.k_full[0], 0);
    wgmma_fence();
    issue_scores<T, D>(s, q_rows, k_tile(0));
    wgmma_commit();
    wgmma_wait<0>();
    fence_operand(s);
    mbarrier_arrive(&bar.k_empty[0]);
    int hidden[2];
    hidden_below(0, hidden);
    softmax_tile<true, kSegmented>(s, rows, scale_log2, row_in_block, t4, hidden, alpha);
    to_a_operand<T>(s, p);
  }

  // Tile i > 0: S_i = Q K_iᵀ and O += P_{i-1} V_{i-1} in flight together, tile i's softmax while
  // P V runs.
  __device__ __forceinline__ void step(int i) {
    const int stage = stage_of(i), prev = stage_of(i - 1);
    // V_{i-1} was copied before K_i: waiting for both first costs nothing and keeps the products
    // back to back.
    mbarrier_wait(&bar.v_full[prev], parity_of(i - 1));
    mbarrier_wait(&bar.k_full[stage], parity_of(i));
    wgmma_fence();
    issue_scores<T, D>(s, q_rows, k_tile(stage));
    wgmma_commit();
    add_pv(prev);
    wgmma_wait<1>();  // the scores; P V still runs
    fence_operand(s);
    mbarrier_arrive(&bar.k_empty[stage]);
    int hidden[2];
    hidden_below(i, hidden);
    softmax_tile<false, kSegmented>(s, rows, scale_log2, row_in_block, t4, hidden, alpha);
    wgmma_wait<0>();
    fence_operand(o);
    fence_operand(p);
    mbarrier_arrive(&bar.v_empty[prev]);
    to_a_operand<T>(s, p);
  }

  // O = O · alpha + P V of a V stage (issued and committed, not waited for).
  __device__ __forceinline__ void add_pv(int stage) {
    fence_operand(o);
    rescale(o, alpha);
    fence_operand(o);
    fence_operand(p);
    wgmma_fence();
    issue_pv<T, D>(o, p, v_tile(stage));
    wgmma_commit();
  }

  __device__ __forceinline__ void last_pv(int last) {
    mbarrier_wait(&bar.v_full[stage_of(last)], parity_of(last));
    add_pv(stage_of(last));
    wgmma_wait<0>();
    fence_operand(o);
  }
};

template <class T, int D, bool kSegmented>
__device__ void consume(uint8_t* smem, Barriers& bar, const CUtensorMap& out_map, const Params& p, const Tile& t) {
  Consumer<T, D, kSegmented> c{smem, bar, p.scale * kLog2e, t};
  if constexpr (kSegmented) {
    c.start[0] = first_key(p, t.b, t.q0 + c.row_in_block);
    c.start[1] = first_key(p, t.b, t.q0 + c.row_in_block + 8);
  }
  c.first_tile();
  for (int i = 1; i < t.key_tiles; ++i) c.step(i);
  c.last_pv(t.key_tiles - 1);
  store_rows<T, D>(c.o, c.rows, c.q_rows, out_map, p, t, c.index, c.row_in_consumer, c.t4);
}

// The first key tile any query row of the block sees: 0 without segments (kSegmented: every
// thread calls it; two barriers).
template <bool kSegmented>
__device__ __forceinline__ int first_key_tile(const Params& p) {
  if constexpr (!kSegmented) {
    return 0;
  } else {
    __shared__ int first;
    const int q0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x)) * kBlockM;
    if (threadIdx.x == 0) first = INT_MAX;
    __syncthreads();
    if (threadIdx.x < kBlockM && q0 + static_cast<int>(threadIdx.x) < p.T)
      atomicMin(&first, first_key(p, static_cast<int>(blockIdx.z), q0 + static_cast<int>(threadIdx.x)));
    __syncthreads();
    return first / kBlockN;
  }
}

template <class T, int D, bool kSegmented>
__global__ void __launch_bounds__(kThreads, 1)
    attention_sm90a_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap k_map,
                           const __grid_constant__ CUtensorMap v_map, const __grid_constant__ CUtensorMap out_map,
                           const Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = aligned_shared_1024(smem_raw);
  Barriers& bar = *reinterpret_cast<Barriers*>(smem + Smem<D>::kBarriers);
  const Tile t = tile_of_block(p, first_key_tile<kSegmented>(p));
  if (threadIdx.x == 0) {
    mbarrier_init(&bar.q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&bar.k_full[s], 1);
      mbarrier_init(&bar.v_full[s], 1);
      mbarrier_init(&bar.k_empty[s], 128 * kConsumers);
      mbarrier_init(&bar.v_empty[s], 128 * kConsumers);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    release_registers<kProducerRegisters>();
    if (threadIdx.x == 0) produce<D>(q_map, k_map, v_map, smem, bar, t);
  } else {
    claim_registers<kConsumerRegisters>();
    consume<T, D, kSegmented>(smem, bar, out_map, p, t);
  }
}

}  // namespace

bool attention_sm90a_supported(KType q, KType k, KType v, KType out, int64_t D) {
  return (q == KType::BF16 || q == KType::F16) && k == q && v == q && out == q && (D == 64 || D == 128);
}

const std::string& attention_sm90a_unavailable() {
  static const std::string why =
      sm90a_unavailable(reinterpret_cast<const void*>(attention_sm90a_kernel<__nv_bfloat16, 128, false>));
  return why;
}

void attention_sm90a_forward(void* out, float* lse, const void* q, const void* k, const void* v, KType type,
                             const int32_t* segment_start, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                             cudaStream_t stream) {
  if (!attention_sm90a_supported(type, type, type, type, D))
    throw std::logic_error("cuda::attention_sm90a_forward: needs BF16 or F16 operands and head dim 64 or 128");
  if (B < 0 || T < 0 || H < 0 || KV <= 0 || H % KV != 0 || T > (1 << 30) || B > 65535 || H > 65535)
    throw std::logic_error("cuda::attention_sm90a_forward: unsupported sizes (need KV > 0, H % KV == 0)");
  for (const void* ptr : {static_cast<const void*>(out), q, k, v})
    if (!attention_sm90a_aligned(ptr))
      throw std::logic_error("cuda::attention_sm90a_forward: operands must be 16-byte aligned");
  if (B == 0 || T == 0 || H == 0) return;
  const Params p{static_cast<int>(T), static_cast<int>(H), static_cast<int>(KV),
                 1.0f / std::sqrt(static_cast<float>(D)), lse, segment_start};
  const CUtensorMap q_map = head_tensor_map(q, B, T, H, D, 64), out_map = head_tensor_map(out, B, T, H, D, 64);
  const CUtensorMap k_map = head_tensor_map(k, B, T, KV, D, kBlockN), v_map = head_tensor_map(v, B, T, KV, D, kBlockN);
  with_type_and_dim(type, D, "attention_sm90a_forward", [&](auto tag, auto dim) {
    using T16 = decltype(tag);
    constexpr int HD = decltype(dim)::value;
    const auto kernel = segment_start != nullptr ? attention_sm90a_kernel<T16, HD, true>
                                                 : attention_sm90a_kernel<T16, HD, false>;
    const size_t smem = smem_bytes<HD>();
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) !=
        cudaSuccess)
      check_launch("attention_sm90a_forward (shared memory attribute)");
    const dim3 grid(static_cast<unsigned>((T + kBlockM - 1) / kBlockM), static_cast<unsigned>(H),
                    static_cast<unsigned>(B));
    kernel<<<grid, kThreads, smem, stream>>>(q_map, k_map, v_map, out_map, p);
  });
  check_launch("attention_sm90a_forward");
}

}  // namespace fsdpq::cuda
