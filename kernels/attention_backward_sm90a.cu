// The Hopper attention backward (kernels/attention_sm90a.cuh): deterministic, no float atomics.
// Three launches, as the mma backward (kernels/attention_mma.cu) splits the work:
//  1. prepare: drow = rowsum(round(dout) * out) per query row, and dout rounded to the operands'
//     16-bit type where it is stored in another (the copy engine moves 16-bit tiles).
//  2. dk, dv: one block per (128-key tile, kv head, b). It loops over the group's query heads in
//     order and, per head, the 64-query tiles from the key tile's first key on, accumulating
//     dV += Pᵀ dO and dK += dSᵀ Q in registers, and stores each once.
//  3. dq: one block per (128-query tile, head, b), looping over the 64-key tiles up to the
//     diagonal in order: dQ += dS K in registers, stored once.
// Kernels 2 and 3 both recompute the scores and dP (7 tile products per tile pair instead of 5),
// the price of writing every gradient exactly once in a fixed order. Both are warp specialised as
// the forward is: warpgroup 0 produces (one thread issues the bulk tensor copies into a three-stage
// ring; in kernel 2 its warp 1 also puts each step's query statistics into the stage), warpgroups 1
// and 2 consume, 64 rows each (keys in kernel 2, queries in kernel 3).
// The products, with m64 rows per consumer:
//   kernel 2: Sᵀ = K Qᵀ and dPᵀ = V dOᵀ (shared-memory operands, K-major, n64), then
//             dV += Pᵀ dO and dK += dSᵀ Q (Pᵀ, dSᵀ from registers; dO, Q read MN-major, nD);
//   kernel 3: S = Q Kᵀ and dP = dO Vᵀ (n64), then dQ += dS K (dS in registers, K MN-major, nD).
// P = exp(scale S − lse) and dS = P (dP − drow) in fp32, rounded to 16 bits only as operands, as
// the mma kernels do; the scale of dK and dQ is applied once at the end.
// Rows past T load as zeros: their lse reads as +inf (P = 0) and their drow as 0, so they add
// nothing; keys past T give garbage rows of dK, dV that are never stored.
// Packed rows (segment_start, ops/attention.h; the kSegmented instantiations): key j is masked for
// query i also where j < segment_start[i], and both kernels skip the tiles no query can see: a
// prepare step writes each 64-query tile's smallest segment start; kernel 3 starts at the key tile
// of its block's smallest, and kernel 2 lists (in shared memory) the query tiles whose smallest
// start is within its key tile. With every start 0 they give plain causal attention's bits.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/attention_sm90a.cuh"
#include "kernels/hopper/a_operand_layout.h"
#include "kernels/hopper/mbarrier.cuh"
#include "kernels/hopper/shared_memory.cuh"
#include "kernels/hopper/tensor_map.cuh"
#include "kernels/hopper/tile_order.h"
#include "kernels/hopper/tma.cuh"
#include "kernels/hopper/type_and_dim.cuh"
#include "kernels/hopper/warpgroup.cuh"
#include "kernels/hopper/wgmma.cuh"
#include "kernels/mma_fragments.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "attention_backward_sm90a.cu needs sm_90a (wgmma, setmaxnreg): CMakeLists.txt builds *_sm90a.cu for it alone"
#endif

namespace fsdpq::cuda {
namespace {

using namespace hopper;

constexpr int kConsumers = 2;                     // warpgroups multiplying, 64 rows each
constexpr int kThreads = 128 * (1 + kConsumers);  // plus the producer warpgroup
constexpr int kBlockRows = 64 * kConsumers;       // keys per block (kernel 2), queries per block (kernel 3)
constexpr int kStepRows = 64;                     // queries per step (kernel 2), keys per step (kernel 3)
constexpr int kStages = 3;  // ring depth: the next step's tiles land while this one's products run
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kBlockRows % kStepRows == 0, "a block's rows are whole steps (the causal mask's tiles)");

// Packed rows: the most 64-query tiles a kernel-2 block lists (T up to 65536; longer packed rows
// take the mma kernels).
constexpr int kMaxListedTiles = 1024;

struct Params {
  int T, H, KV;
  float scale;       // 1 / sqrt(D)
  const float* lse;  // [B, H, T], natural log
  const float* drow;  // [B, H, T]
  const int32_t* segment_start;   // [B, T]; nullptr: plain causal
  const int32_t* tile_min_start;  // [B, ceil(T / 64)]: each 64-query tile's smallest segment start
  void* grad_a;      // dk (kernel 2) or dq (kernel 3)
  KType grad_a_type;
  void* grad_b;  // dv (kernel 2)
  KType grad_b_type;
  AttentionRopeBackward rope;  // applied to grad_a (dk, dq) as it is stored; cos null: none
  bool staged;  // the gradients are the operands' 16-bit type: through shared memory and the copy engine
  hopper_order::TileOrder order;  // which tile and head each block takes (its kernel's)
};

// Shared memory of either kernel, from a 1024-byte aligned base: two fixed tiles of kBlockRows
// rows (K and V in kernel 2, Q and dO in kernel 3) and two rings of kStepRows-row tiles (Q and dO,
// or K and V). A tile is D / 64 column blocks of rows x 128 bytes (kernels/hopper/wgmma.cuh).
template <int D>
struct Smem {
  static constexpr int kColumnBlocks = D / kBoxColumns;
  static constexpr int kFixedColumnBlock = kBlockRows * kSwizzleRowBytes;
  static constexpr int kStepColumnBlock = kStepRows * kSwizzleRowBytes;
  static constexpr int kFixedBytes = kFixedColumnBlock * kColumnBlocks;
  static constexpr int kStepBytes = kStepColumnBlock * kColumnBlocks;
  static constexpr int kFixedA = 0;
  static constexpr int kFixedB = kFixedBytes;
  static constexpr int kRingA = 2 * kFixedBytes;
  static constexpr int kRingB = kRingA + kStages * kStepBytes;
  // Kernel 2's per-step column statistics (lse · log2 e, drow, segment start of the step's 64
  // queries), one set per ring stage, written by the producer's stats warp.
  static constexpr int kStats = kRingB + kStages * kStepBytes;
  static constexpr int kStatsBytes = 3 * kStepRows * static_cast<int>(sizeof(float));  // per stage
  // Kernel 2 with segments: the count of listed query tiles, then the tiles.
  static constexpr int kTileList = kStats + kStages * kStatsBytes;
  static constexpr int kBarriers = kTileList + (1 + kMaxListedTiles + 3) / 4 * 16;  // 16-byte aligned
  static constexpr int kConsumerRows = 64 * kSwizzleRowBytes;  // consumer c's rows of a fixed tile: c times this
};

struct Barriers {
  uint64_t fixed_full;
  uint64_t full[kStages];   // both ring tiles of the stage have landed (kernel 2: and its statistics)
  uint64_t empty[kStages];  // every consumer thread is done with the stage
};

// Kernel 2's statistics warp (warp 1 of the producer warpgroup) arrives on each stage's full
// barrier with every lane, beside the copy thread's one arrival.
constexpr int kStatsWarpArrivals = 32;

template <int D>
constexpr size_t smem_bytes() {
  return Smem<D>::kBarriers + sizeof(Barriers) + 1024;
}

__device__ __forceinline__ int stage_of(int i) { return i % kStages; }
__device__ __forceinline__ uint32_t parity_of(int i) { return static_cast<uint32_t>(i / kStages) & 1u; }

// The producer: the two fixed tiles (rows r0.. of `fixed_head` in both maps), then for each step
// the two ring tiles at the step's rows and head, as `step_at(i, &rows, &head)` says.
template <int D, class StepAt>
__device__ void produce(const CUtensorMap& fixed_a, const CUtensorMap& fixed_b, int r0, int fixed_head,
                        const CUtensorMap& ring_a, const CUtensorMap& ring_b, int steps, StepAt step_at, int b,
                        uint8_t* smem, Barriers& bar) {
  using S = Smem<D>;
  mbarrier_arrive_expect_tx(&bar.fixed_full, 2 * S::kFixedBytes);
  for (int c = 0; c < kConsumers; ++c)
    for (int cb = 0; cb < S::kColumnBlocks; ++cb) {
      const int at = cb * S::kFixedColumnBlock + c * S::kConsumerRows;
      tma_load_4d(smem + S::kFixedA + at, fixed_a, &bar.fixed_full, cb * kBoxColumns, r0 + 64 * c, fixed_head, b);
      tma_load_4d(smem + S::kFixedB + at, fixed_b, &bar.fixed_full, cb * kBoxColumns, r0 + 64 * c, fixed_head, b);
    }
  for (int i = 0; i < steps; ++i) {
    const int s = stage_of(i);
    int rows = 0, head = 0;
    step_at(i, &rows, &head);
    mbarrier_wait(&bar.empty[s], parity_of(i) ^ 1u);
    mbarrier_arrive_expect_tx(&bar.full[s], 2 * S::kStepBytes);
    for (int cb = 0; cb < S::kColumnBlocks; ++cb) {
      const int at = s * S::kStepBytes + cb * S::kStepColumnBlock;
      tma_load_4d(smem + S::kRingA + at, ring_a, &bar.full[s], cb * kBoxColumns, rows, head, b);
      tma_load_4d(smem + S::kRingB + at, ring_b, &bar.full[s], cb * kBoxColumns, rows, head, b);
    }
  }
}

// ---- the consumers' products ----

// acc = A Bᵀ over D, n64: A this consumer's 64 rows of a fixed tile, B a 64-row ring tile, both
// K-major (issued, not waited for).
template <class T, int D>
__device__ __forceinline__ void issue_scores(float (&acc)[32], const uint8_t* a_rows, const uint8_t* b_tile) {
  using S = Smem<D>;
  const uint64_t a = opaque(descriptor_k_major(a_rows)), b = opaque(descriptor_k_major(b_tile));
  wgmma_m64n64k16_ss<T, false>(acc, a, b);
#pragma unroll
  for (int kk = 1; kk < D / 16; ++kk)
    wgmma_m64n64k16_ss<T, true>(acc, advanced(a, kk / 4 * S::kFixedColumnBlock + kk % 4 * 32),
                                advanced(b, kk / 4 * S::kStepColumnBlock + kk % 4 * 32));
}

// This consumer's 64 rows of a fixed tile (D / 64 column blocks) as wgmma's register A operand:
// 4 registers per 16-column slice, ldmatrix from the swizzled tile (kernels/hopper/a_operand_layout.h).
template <int D>
__device__ __forceinline__ void load_a_operand(const uint8_t* rows, uint32_t (&a)[D / 16 * 4]) {
  using S = Smem<D>;
  const int warp = (static_cast<int>(threadIdx.x) % 128) / 32, lane = static_cast<int>(threadIdx.x) % 32;
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t r[4];
    mma_fragments::ldmatrix_x4(r, rows + kk / 4 * S::kFixedColumnBlock +
                                      hopper_layout::a_operand_ldmatrix_offset(warp, lane, kk % 4));
#pragma unroll
    for (int q = 0; q < 4; ++q) a[4 * kk + q] = r[q];
  }
}

// acc = A Bᵀ over D, n64, as issue_scores with A in registers (load_a_operand): the product reads
// only B's tile from shared memory (issued, not waited for).
template <class T, int D>
__device__ __forceinline__ void issue_scores_rs(float (&acc)[32], const uint32_t (&a)[D / 16 * 4], const uint8_t* b_tile) {
  using S = Smem<D>;
  const uint64_t b = opaque(descriptor_k_major(b_tile));
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint32_t slice[4] = {a[4 * kk], a[4 * kk + 1], a[4 * kk + 2], a[4 * kk + 3]};
    if (kk == 0)
      wgmma_m64n64k16_rs_k_major<T, false>(acc, slice, b);
    else
      wgmma_m64n64k16_rs_k_major<T, true>(acc, slice, advanced(b, kk / 4 * S::kStepColumnBlock + kk % 4 * 32));
  }
}

// acc += A B, nD: A (64 x 64) in registers, B a 64-row ring tile read MN-major (its 64 rows are
// the product's K; issued, not waited for).
template <class T, int D>
__device__ __forceinline__ void issue_gradient(float (&acc)[D / 2], const uint32_t (&a)[16], const uint8_t* b_tile) {
  static_assert(kStepRows / 16 * 4 == 16, "A holds 4 registers per 16 rows of the step");
  wgmma_rs_over_k<T, D>(acc, a, opaque(descriptor_mn_major(b_tile, Smem<D>::kStepColumnBlock)));
}

// Register e of chunk j of an n64 accumulator: row (row0 + 8 (e / 2)), column 8j + 2t + e % 2.
__device__ __forceinline__ int column_of(int j, int e, int t4) { return 8 * j + 2 * t4 + (e & 1); }

// Where a consumer's gradient rows go (put: row i of the thread's two, i.e. row0 + 8i, a pair of
// adjacent columns). GlobalRows: straight into a [B, T, heads, D] gradient of any KType, each pair
// one 8- or 4-byte store. StagedRows: into the consumer's 64 rows of a fixed tile, free once its
// last product is done, as the copy engine lays a box out (128-byte swizzle), for send_staged.
struct GlobalRows {
  void* grad;
  KType type;
  int64_t base[2];  // element offset of each row's column 0
  __device__ void put(int i, int column, float v0, float v1) const {
    store_any_pair(grad, type, base[i] + column, v0, v1);
  }
};
template <class T, int D>
struct StagedRows {
  uint32_t rows;  // shared-memory address of the consumer's rows of the tile's first column block
  int row0;       // the thread's first row among them
  __device__ void put(int i, int column, float v0, float v1) const {
    const int row = row0 + 8 * i, chunk = (column % kBoxColumns / 8) ^ (row % 8);
    const uint32_t at = rows + column / kBoxColumns * Smem<D>::kFixedColumnBlock + row * kSwizzleRowBytes + chunk * 16 +
                        column % 8 * 2;
    asm volatile("st.shared.b32 [%0], %1;" ::"r"(at), "r"(pack2<T>(v0, v1)) : "memory");
  }
};

// A consumer's rows of an m64 x nD accumulator times `scale` (rows row0, row0 + 8 of the thread's
// warp, at positions position0, + 8; those before T only) into `out`, with RoPE's backward applied
// first where `rotate` says: column c < D/2 pairs with c + D/2, which the thread holds too (chunk
// j + D/16): dx_c = dy_c cos + dy_{c+D/2} sin, dx_{c+D/2} = dy_{c+D/2} cos - dy_c sin, dy = acc ·
// scale, in fp32, each rounded once (the separate rope_backward reads dy rounded to its storage
// type first). `rope` is taken by reference with a flag, not as a nullable pointer: a pointer
// into the kernel's parameters would copy them to local memory.
template <int D, class Rows>
__device__ __forceinline__ void write_rows(const Rows& out, const float (&acc)[D / 2], float scale, int position0, int T,
                                           int b, int t4, bool rotate, const AttentionRopeBackward& rope) {
  constexpr int kHalfChunks = D / 16;  // 8-column chunks in each half of a row
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int position = position0 + 8 * i;
    if (position >= T) continue;
    if (!rotate) {
#pragma unroll
      for (int j = 0; j < D / 8; ++j) out.put(i, 8 * j + 2 * t4, acc[4 * j + 2 * i] * scale, acc[4 * j + 2 * i + 1] * scale);
      continue;
    }
    const int64_t token = static_cast<int64_t>(b) * T + position;
    const int64_t angle_row =
        (rope.offset + (rope.positions != nullptr ? static_cast<int64_t>(rope.positions[token]) : position)) * D;
#pragma unroll
    for (int j = 0; j < kHalfChunks; ++j) {
      const int column = 8 * j + 2 * t4;  // even: the pair's tables load as one float2 each
      const float2 c = __ldg(reinterpret_cast<const float2*>(rope.cos + angle_row + column));
      const float2 s = __ldg(reinterpret_cast<const float2*>(rope.sin + angle_row + column));
      const float lo0 = acc[4 * j + 2 * i] * scale, lo1 = acc[4 * j + 2 * i + 1] * scale;
      const float hi0 = acc[4 * (j + kHalfChunks) + 2 * i] * scale, hi1 = acc[4 * (j + kHalfChunks) + 2 * i + 1] * scale;
      // rope_kernel's arithmetic (kernels/rope.cu) with the sine negated: only dy's rounding differs.
      const auto low = [](float l, float h, float cv, float sv) { return __fsub_rn(__fmul_rn(l, cv), __fmul_rn(h, -sv)); };
      const auto high = [](float l, float h, float cv, float sv) { return __fadd_rn(__fmul_rn(h, cv), __fmul_rn(l, -sv)); };
      out.put(i, column, low(lo0, hi0, c.x, s.x), low(lo1, hi1, c.y, s.y));
      out.put(i, column + D / 2, high(lo0, hi0, c.x, s.x), high(lo1, hi1, c.y, s.y));
    }
  }
}

// One gradient of a consumer's 64 rows (from position `first`): staged through its rows of a fixed
// tile (`tile_rows`, a shared-memory address) when the params say the gradient is the operands'
// 16-bit type (send_staged then sends them), else stored directly. rotate: RoPE's backward where
// the params carry it (dk, dq). The thread's rows are recomputed here rather than kept live
// through the main loop, whose registers are all taken.
template <class T, int D>
__device__ __forceinline__ void write_gradient(const Params& p, void* grad, KType type, bool rotate,
                                               const float (&acc)[D / 2], float scale, uint32_t tile_rows, int first,
                                               int heads, int head, int b) {
  const int t4 = static_cast<int>(threadIdx.x) % 4;
  const int row0 = (static_cast<int>(threadIdx.x) % 128) / 32 * 16 + static_cast<int>(threadIdx.x) % 32 / 4;
  rotate = rotate && p.rope.cos != nullptr;
  if (p.staged) {
    write_rows<D>(StagedRows<T, D>{tile_rows, row0}, acc, scale, first + row0, p.T, b, t4, rotate, p.rope);
  } else {
    GlobalRows out{grad, type, {}};
    for (int i = 0; i < 2; ++i) out.base[i] = ((static_cast<int64_t>(b) * p.T + first + row0 + 8 * i) * heads + head) * D;
    write_rows<D>(out, acc, scale, first + row0, p.T, b, t4, rotate, p.rope);
  }
}

// The consumer's staged rows (64 from position `first` of head `head` of batch b) of `count`
// gradients, each to the tensor its map describes: the writes made visible to the copy engine,
// then one thread sends each column block's box and waits until they have been read (the block
// may end).
template <int D>
__device__ __forceinline__ void send_staged(const CUtensorMap* const* maps, const uint32_t* tile_rows, int count,
                                            int first, int head, int b, int consumer) {
  fence_proxy_async_shared();
  warpgroup_sync(1 + consumer);
  if (threadIdx.x % 128 == 0) {
    for (int g = 0; g < count; ++g)
      for (int cb = 0; cb < Smem<D>::kColumnBlocks; ++cb)
        tma_store_4d(*maps[g], tile_rows[g] + cb * Smem<D>::kFixedColumnBlock, cb * kBoxColumns, first, head, b);
    tma_store_commit_and_wait_read();
  }
}

// ---- kernel 2: dk, dv ----

// This block's work: key tile (keys k0..k0+127) of kv head kv_head of batch b; per query head of
// the group, the query tiles first_tile..query_tiles-1 (64 rows each), or with segments those of
// them `listed` (shared memory: the count, then the tiles) after list_query_tiles.
struct KeyTile {
  int k0, kv_head, b, group, first_tile, query_tiles;
  const int* listed;  // nullptr: plain causal
  __device__ int per_head() const { return listed != nullptr ? listed[0] : query_tiles - first_tile; }
  __device__ int steps() const { return group * per_head(); }
  __device__ void step_at(int i, int* q0, int* head) const {
    const int n = per_head();
    *head = kv_head * group + i / n;
    *q0 = (listed != nullptr ? listed[1 + i % n] : first_tile + i % n) * kStepRows;
  }
};

// Segments: one thread lists the query tiles from the block's first on whose smallest segment
// start is within the key tile (the tile holding k0 always is: a query sees itself).
__device__ void list_query_tiles(const Params& p, const KeyTile& t, int* list) {
  const int32_t* tile_min = p.tile_min_start + static_cast<int64_t>(t.b) * t.query_tiles;
  int n = 0;
  for (int tile = t.first_tile; tile < t.query_tiles; ++tile)
    if (tile_min[tile] < t.k0 + kBlockRows) list[1 + n++] = tile;
  list[0] = n;
}

__device__ __forceinline__ KeyTile key_tile_of_block(const Params& p, const int* listed) {
  KeyTile t;
  t.listed = listed;
  const hopper_order::RankedTile r = hopper_order::ranked_tile(p.order, static_cast<int>(blockIdx.x));
  t.k0 = r.rank * kBlockRows;  // key tile 0 is the longest (tile_order.h)
  t.kv_head = r.head % p.KV;
  t.b = r.head / p.KV;
  t.group = p.H / p.KV;
  t.first_tile = t.k0 / kStepRows;
  t.query_tiles = (p.T + kStepRows - 1) / kStepRows;
  return t;
}

// Step i: Sᵀ and dPᵀ back to back; Pᵀ while dPᵀ runs, then dV += Pᵀ dO; dSᵀ while dV runs, then
// dK += dSᵀ Q. Every product is waited for within its step, and Sᵀ's registers die before dSᵀ's
// are written: ptxas serialises every wgmma of the kernel (a wait behind each) when one is in
// flight across a loop's back edge, or when too many registers are live to keep an in-flight
// product's operands apart from the next one's (dK, dV, Sᵀ, dPᵀ, Pᵀ and dSᵀ together were too
// many at D 128).
template <class T, int D, bool kSegmented>
__device__ void consume_dkdv(uint8_t* smem, Barriers& bar, const Params& p, const KeyTile& t, const CUtensorMap& dk_map,
                             const CUtensorMap& dv_map) {
  using S = Smem<D>;
  const int consumer = static_cast<int>(threadIdx.x) / 128 - 1;
  const int t4 = static_cast<int>(threadIdx.x) % 4;
  const int row = (static_cast<int>(threadIdx.x) % 128) / 32 * 16 + static_cast<int>(threadIdx.x) % 32 / 4;
  const int key = t.k0 + 64 * consumer + row;  // this thread's keys: key and key + 8
  const uint8_t* k_rows = smem + S::kFixedA + consumer * S::kConsumerRows;
  const uint8_t* v_rows = smem + S::kFixedB + consumer * S::kConsumerRows;
  auto q_tile = [&](int stage) { return smem + S::kRingA + stage * S::kStepBytes; };
  auto do_tile = [&](int stage) { return smem + S::kRingB + stage * S::kStepBytes; };
  const float c = p.scale * kLog2e;
  float dk[D / 2] = {}, dv[D / 2] = {}, st[32], dpt[32];
  uint32_t pt[16] = {}, dst[16] = {};
  mbarrier_wait(&bar.fixed_full, 0);
  const int steps = t.steps();
  for (int i = 0; i < steps; ++i) {
    int q0 = 0, head = 0;
    t.step_at(i, &q0, &head);
    const int s = stage_of(i);
    mbarrier_wait(&bar.full[s], parity_of(i));
    wgmma_fence();
    issue_scores<T, D>(st, k_rows, q_tile(s));
    wgmma_commit();
    issue_scores<T, D>(dpt, v_rows, do_tile(s));
    wgmma_commit();
    // The step's 64 query columns' lse (scaled to log2; past T, +inf), drow (past T, 0) and
    // segment start, which the stats warp put in the stage: read from there where used, they take
    // no registers across the products (kept in registers they made ptxas spill at D 128).
    const float* const lse2 = reinterpret_cast<const float*>(smem + S::kStats + s * S::kStatsBytes);
    const float* const drow = lse2 + kStepRows;
    const int* const start = reinterpret_cast<const int*>(drow + kStepRows);
    wgmma_wait<1>();  // Sᵀ; dPᵀ may still run
    fence_operand(st);
    const bool diagonal = q0 < t.k0 + kBlockRows;  // some key of the tile lies after some query
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int query = q0 + column_of(j, e, t4), k = key + 8 * (e >> 1);
        const bool masked = kSegmented ? k > query || k < start[column_of(j, e, t4)] : diagonal && k > query;
        st[4 * j + e] = masked ? 0.0f : exp2f(fmaf(st[4 * j + e], c, -lse2[column_of(j, e, t4)]));
      }
    to_a_operand<T>(st, pt);
    fence_operand(pt);
    fence_operand(dv);
    wgmma_fence();
    issue_gradient<T, D>(dv, pt, do_tile(s));
    wgmma_commit();
    wgmma_wait<1>();  // dPᵀ (committed before dV)
    fence_operand(dpt);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dpt[4 * j + e] = st[4 * j + e] * (dpt[4 * j + e] - drow[column_of(j, e, t4)]);
    to_a_operand<T>(dpt, dst);
    fence_operand(dst);
    fence_operand(dk);
    wgmma_fence();
    issue_gradient<T, D>(dk, dst, q_tile(s));
    wgmma_commit();
    wgmma_wait<0>();
    fence_operand(dk);
    fence_operand(dv);
    fence_operand(pt);
    fence_operand(dst);
    mbarrier_arrive(&bar.empty[s]);
  }
  // The consumer's K and V rows are free: every product that read them has been waited for.
  const uint32_t staged[2] = {smem_address(smem + S::kFixedA + consumer * S::kConsumerRows),
                              smem_address(smem + S::kFixedB + consumer * S::kConsumerRows)};
  const int first = t.k0 + 64 * consumer;
  write_gradient<T, D>(p, p.grad_a, p.grad_a_type, true, dk, p.scale, staged[0], first, p.KV, t.kv_head, t.b);
  write_gradient<T, D>(p, p.grad_b, p.grad_b_type, false, dv, 1.0f, staged[1], first, p.KV, t.kv_head, t.b);
  if (p.staged) {
    const CUtensorMap* const maps[2] = {&dk_map, &dv_map};
    send_staged<D>(maps, staged, 2, first, t.kv_head, t.b, consumer);
  }
}

// Kernel 2's statistics warp: for each step, once the stage is free, the step's 64 query columns'
// lse · log2 e, drow and segment start (rows past T: +inf, 0, 0) into the stage, then every lane
// arrives on its full barrier. The global loads' latency stays off the consumers' path (they read
// the stage once its full barrier completes), and one copy serves both consumers.
template <int D, bool kSegmented>
__device__ void produce_stats(const Params& p, const KeyTile& t, uint8_t* smem, Barriers& bar) {
  using S = Smem<D>;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int steps = t.steps();
  for (int i = 0; i < steps; ++i) {
    int q0 = 0, head = 0;
    t.step_at(i, &q0, &head);
    const int s = stage_of(i);
    mbarrier_wait(&bar.empty[s], parity_of(i) ^ 1u);
    float* const lse2 = reinterpret_cast<float*>(smem + S::kStats + s * S::kStatsBytes);
    float* const drow = lse2 + kStepRows;
    int* const start = reinterpret_cast<int*>(drow + kStepRows);
    const int64_t row_base = (static_cast<int64_t>(t.b) * p.H + head) * p.T;
#pragma unroll
    for (int r = lane; r < kStepRows; r += 32) {
      const int query = q0 + r;
      lse2[r] = query < p.T ? __ldg(p.lse + row_base + query) * kLog2e : INFINITY;
      drow[r] = query < p.T ? __ldg(p.drow + row_base + query) : 0.0f;
      if constexpr (kSegmented)
        start[r] = query < p.T ? __ldg(p.segment_start + static_cast<int64_t>(t.b) * p.T + query) : 0;
    }
    mbarrier_arrive(&bar.full[s]);  // release: the lane's stores are seen by whoever waits on the phase
  }
}

// What both kernels' blocks do first and how their warpgroups split: the shared memory aligned to
// 1024 bytes, the barriers set up, then warpgroup 0 produces (one thread: produce_tiles) with few
// registers and the others consume (consume_tiles) with many.
// (A kernel may write shared memory before run_block: its barrier publishes that too.) A side
// producer (kernel 2's statistics) runs on warp 1 of the producer warpgroup, arriving on the full
// barriers with `side_arrivals` lanes.
template <int D, class Produce, class Consume, class ProduceSide>
__device__ __forceinline__ void run_block(uint8_t* smem_raw, Produce&& produce_tiles, Consume&& consume_tiles,
                                          ProduceSide&& produce_side, int side_arrivals) {
  uint8_t* smem = aligned_shared_1024(smem_raw);
  Barriers& bar = *reinterpret_cast<Barriers*>(smem + Smem<D>::kBarriers);
  if (threadIdx.x == 0) {
    mbarrier_init(&bar.fixed_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&bar.full[s], 1 + side_arrivals);
      mbarrier_init(&bar.empty[s], 128 * kConsumers);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    release_registers<kProducerRegisters>();
    if (threadIdx.x == 0) produce_tiles(smem, bar);
    if (side_arrivals > 0 && threadIdx.x / 32 == 1) produce_side(smem, bar);
  } else {
    claim_registers<kConsumerRegisters>();
    consume_tiles(smem, bar);
  }
}

template <class T, int D, bool kSegmented>
__global__ void __launch_bounds__(kThreads, 1)
    attention_dkdv_sm90a_kernel(const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
                                const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap do_map,
                                const __grid_constant__ CUtensorMap dk_map, const __grid_constant__ CUtensorMap dv_map,
                                const Params p) {
  extern __shared__ uint8_t smem_raw[];
  int* const list = reinterpret_cast<int*>(aligned_shared_1024(smem_raw) + Smem<D>::kTileList);
  const KeyTile t = key_tile_of_block(p, kSegmented ? list : nullptr);
  if (kSegmented && threadIdx.x == 32) list_query_tiles(p, t, list);  // thread 0 sets up the barriers
  run_block<D>(
      smem_raw,
      [&](uint8_t* smem, Barriers& bar) {
        produce<D>(k_map, v_map, t.k0, t.kv_head, q_map, do_map, t.steps(),
                   [&](int i, int* rows, int* head) { t.step_at(i, rows, head); }, t.b, smem, bar);
      },
      [&](uint8_t* smem, Barriers& bar) { consume_dkdv<T, D, kSegmented>(smem, bar, p, t, dk_map, dv_map); },
      [&](uint8_t* smem, Barriers& bar) { produce_stats<D, kSegmented>(p, t, smem, bar); }, kStatsWarpArrivals);
}

// ---- kernel 3: dq ----

// This block's work: query tile (rows q0..q0+127) of head h of batch b, key tiles
// first_tile..key_tiles-1 (first_tile 0 without segments).
struct QueryTile {
  int q0, h, kv_head, b, first_tile, key_tiles;
  __device__ int steps() const { return key_tiles - first_tile; }
  __device__ int key0(int i) const { return (first_tile + i) * kStepRows; }
  __device__ void step_at(int i, int* k0, int* head) const {
    *k0 = key0(i);
    *head = kv_head;
  }
};

__device__ __forceinline__ QueryTile query_tile_of_block(const Params& p) {
  QueryTile t;
  const hopper_order::RankedTile r = hopper_order::ranked_tile(p.order, static_cast<int>(blockIdx.x));
  t.q0 = (p.order.ranks - 1 - r.rank) * kBlockRows;  // the last query tile is the longest (tile_order.h)
  t.h = r.head % p.H;
  t.kv_head = t.h / (p.H / p.KV);
  t.b = r.head / p.H;
  const int last_row = min(t.q0 + kBlockRows, p.T);  // keys up to the block's last row
  t.key_tiles = (last_row + kStepRows - 1) / kStepRows;
  t.first_tile = 0;
  if (p.segment_start != nullptr) {  // the key tile of the smallest start of the block's query tiles
    const int query_tiles = (p.T + kStepRows - 1) / kStepRows;
    const int32_t* tile_min = p.tile_min_start + static_cast<int64_t>(t.b) * query_tiles;
    int first = tile_min[t.q0 / kStepRows];
    for (int tile = t.q0 / kStepRows + 1; tile < query_tiles && tile * kStepRows < last_row; ++tile)
      first = min(first, tile_min[tile]);
    t.first_tile = first / kStepRows;
  }
  return t;
}

// As in kernel 2: step i issues dQ += dS_{i-1} K_{i-1} (dS kept in registers from step i - 1),
// then S_i and dP_i; P is computed while dP runs, and every product is waited for within its step.
template <class T, int D, bool kSegmented>
__device__ void consume_dq(uint8_t* smem, Barriers& bar, const Params& p, const QueryTile& t,
                           const CUtensorMap& dq_map) {
  using S = Smem<D>;
  const int consumer = static_cast<int>(threadIdx.x) / 128 - 1;
  const int t4 = static_cast<int>(threadIdx.x) % 4;
  const int row = (static_cast<int>(threadIdx.x) % 128) / 32 * 16 + static_cast<int>(threadIdx.x) % 32 / 4;
  const int query = t.q0 + 64 * consumer + row;  // this thread's rows: query and query + 8
  const uint8_t* q_rows = smem + S::kFixedA + consumer * S::kConsumerRows;
  const uint8_t* do_rows = smem + S::kFixedB + consumer * S::kConsumerRows;
  auto k_tile = [&](int stage) { return smem + S::kRingA + stage * S::kStepBytes; };
  auto v_tile = [&](int stage) { return smem + S::kRingB + stage * S::kStepBytes; };
  const float c = p.scale * kLog2e;
  const int64_t row_base = (static_cast<int64_t>(t.b) * p.H + t.h) * p.T;
  float lse2[2], drow[2];
  int start[2] = {0, 0};  // the first key rows query and query + 8 see
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = query + 8 * i;
    lse2[i] = r < p.T ? p.lse[row_base + r] * kLog2e : INFINITY;
    drow[i] = r < p.T ? p.drow[row_base + r] : 0.0f;
    if constexpr (kSegmented) start[i] = r < p.T ? p.segment_start[static_cast<int64_t>(t.b) * p.T + r] : 0;
  }
  float dq[D / 2] = {}, sc[32], dp[32];
  uint32_t ds[16] = {};
  // Q's and dO's rows never change in the block: as register operands, S and dP read only K's and
  // V's tiles from shared memory (both operands there needed all of its bandwidth at n64).
  uint32_t q_regs[D / 16 * 4], do_regs[D / 16 * 4];
  mbarrier_wait(&bar.fixed_full, 0);
  load_a_operand<D>(q_rows, q_regs);
  load_a_operand<D>(do_rows, do_regs);
  const int steps = t.steps();
  for (int i = 0; i < steps; ++i) {
    const int s = stage_of(i), k0 = t.key0(i);
    mbarrier_wait(&bar.full[s], parity_of(i));
    wgmma_fence();
    if (i > 0) {
      issue_gradient<T, D>(dq, ds, k_tile(stage_of(i - 1)));
      wgmma_commit();
    }
    issue_scores_rs<T, D>(sc, q_regs, k_tile(s));
    wgmma_commit();
    issue_scores_rs<T, D>(dp, do_regs, v_tile(s));
    wgmma_commit();
    wgmma_wait<1>();  // dQ_{i-1} and S_i; dP_i may still run
    fence_operand(sc);
    fence_operand(dq);
    fence_operand(ds);
    if (i > 0) mbarrier_arrive(&bar.empty[stage_of(i - 1)]);
    const bool diagonal = k0 + kStepRows > t.q0;  // some key of the tile lies after some row
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool masked = (diagonal && k0 + column_of(j, e, t4) > query + 8 * (e >> 1)) ||
                            (kSegmented && k0 + column_of(j, e, t4) < start[e >> 1]);
        sc[4 * j + e] = masked ? 0.0f : exp2f(fmaf(sc[4 * j + e], c, -lse2[e >> 1]));
      }
    wgmma_wait<0>();  // dP_i
    fence_operand(dp);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) dp[4 * j + e] = sc[4 * j + e] * (dp[4 * j + e] - drow[e >> 1]);
    to_a_operand<T>(dp, ds);
    fence_operand(ds);
  }
  wgmma_fence();
  issue_gradient<T, D>(dq, ds, k_tile(stage_of(steps - 1)));
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(dq);
  fence_operand(ds);
  mbarrier_arrive(&bar.empty[stage_of(steps - 1)]);
  // The consumer's Q rows are free: its Q operand has been in registers since the first step.
  const uint32_t staged[1] = {smem_address(smem + S::kFixedA + consumer * S::kConsumerRows)};
  const int first = t.q0 + 64 * consumer;
  write_gradient<T, D>(p, p.grad_a, p.grad_a_type, true, dq, p.scale, staged[0], first, p.H, t.h, t.b);
  if (p.staged) {
    const CUtensorMap* const maps[1] = {&dq_map};
    send_staged<D>(maps, staged, 1, first, t.h, t.b, consumer);
  }
}

template <class T, int D, bool kSegmented>
__global__ void __launch_bounds__(kThreads, 1)
    attention_dq_sm90a_kernel(const __grid_constant__ CUtensorMap q_map, const __grid_constant__ CUtensorMap do_map,
                              const __grid_constant__ CUtensorMap k_map, const __grid_constant__ CUtensorMap v_map,
                              const __grid_constant__ CUtensorMap dq_map, const Params p) {
  extern __shared__ uint8_t smem_raw[];
  const QueryTile t = query_tile_of_block(p);
  run_block<D>(
      smem_raw,
      [&](uint8_t* smem, Barriers& bar) {
        produce<D>(q_map, do_map, t.q0, t.h, k_map, v_map, t.steps(),
                   [&](int i, int* rows, int* head) { t.step_at(i, rows, head); }, t.b, smem, bar);
      },
      [&](uint8_t* smem, Barriers& bar) { consume_dq<T, D, kSegmented>(smem, bar, p, t, dq_map); },
      [](uint8_t*, Barriers&) {}, 0);
}

// ---- kernel 1: drow, and dout as a 16-bit tile source ----

// Eight consecutive values as floats: one 16-byte load of a 16-bit type, two of fp32.
template <class U>
__device__ __forceinline__ void load8(const U* p, float (&v)[8]) {
  if constexpr (sizeof(U) == 2) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const U* h = reinterpret_cast<const U*>(&raw);
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = to_float(h[e]);
  } else {
    const float4 lo = reinterpret_cast<const float4*>(p)[0], hi = reinterpret_cast<const float4*>(p)[1];
    const float all[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = all[e];
  }
}

// D / 8 threads per query row [b, t, h], eight columns each (16-byte loads; rows are 16-byte
// aligned): drow[b, h, t] = Σ round_T(dout) · out over D (each thread's columns in order, then the
// row's threads in a fixed shuffle order), and dout16 = round_T(dout) when dout16 is not null. (A
// warp per row with 2-byte loads took 340 µs at B 8, T 2048, H 32, D 128: 11% of the backward.)
template <class T, class DoutT, class OutT>
__global__ void __launch_bounds__(256)
    prepare_kernel(float* drow, T* dout16, const DoutT* dout, const OutT* out, int64_t rows, int T_, int H, int D) {
  constexpr int kColumns = 8;
  const int per_row = D / kColumns;  // 8 or 16: a row's threads sit in one warp
  const int64_t total = rows * per_row;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  // Whole warps walk the rows, so every lane takes part in the shuffles.
  for (int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x - lane; first < total;
       first += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = first + lane;
    const bool valid = i < total;
    const int64_t r = i / per_row;
    const int part = static_cast<int>(i % per_row);
    float sum = 0.0f;
    if (valid) {
      const int64_t at = r * D + part * kColumns;
      float d[kColumns], o[kColumns];
      load8(dout + at, d);
      load8(out + at, o);
      alignas(16) T rounded[kColumns];
#pragma unroll
      for (int e = 0; e < kColumns; ++e) {
        rounded[e] = from_float<T>(d[e]);
        sum += to_float(rounded[e]) * o[e];
      }
      if (dout16 != nullptr) *reinterpret_cast<uint4*>(dout16 + at) = *reinterpret_cast<const uint4*>(rounded);
    }
    for (int off = per_row / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (valid && part == 0) {
      const int64_t h = r % H, bt = r / H, t = bt % T_, b = bt / T_;
      drow[(b * H + h) * T_ + t] = sum;
    }
  }
}

// Packed rows: tile_min[b, tile] = the smallest segment start of the tile's 64 query rows (< T).
__global__ void __launch_bounds__(256)
    tile_min_start_kernel(int32_t* tile_min, const int32_t* segment_start, int B, int T) {
  const int tiles = (T + kStepRows - 1) / kStepRows;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < static_cast<int64_t>(B) * tiles;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t b = i / tiles;
    const int first = static_cast<int>(i % tiles) * kStepRows, last = min(first + kStepRows, T);
    int smallest = first;  // a row's start is at most the row
    for (int t = first; t < last; ++t) smallest = min(smallest, segment_start[b * T + t]);
    tile_min[i] = smallest;
  }
}

template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes, const char* what) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) !=
      cudaSuccess)
    check_launch(what);
}

}  // namespace

namespace {
int64_t round_up_256(int64_t bytes) { return (bytes + 255) / 256 * 256; }
}  // namespace

int64_t attention_sm90a_backward_workspace_bytes(KType type, KType dout_type, int64_t B, int64_t T, int64_t H,
                                                 int64_t D, bool segmented) {
  const int64_t drow = B * H * T * static_cast<int64_t>(sizeof(float));
  const int64_t dout16 = dout_type == type ? 0 : B * T * H * D * 2;
  const int64_t tile_min = segmented ? B * ((T + kStepRows - 1) / kStepRows) * static_cast<int64_t>(sizeof(int32_t)) : 0;
  return round_up_256(drow) + round_up_256(dout16) + tile_min;
}

bool attention_sm90a_backward_takes_segments(int64_t T) { return (T + kStepRows - 1) / kStepRows <= kMaxListedTiles; }

void attention_sm90a_backward(void* dq, KType dq_type, void* dk, KType dk_type, void* dv, KType dv_type,
                              const void* dout, KType dout_type, const void* q, const void* k, const void* v,
                              KType type, const void* out, KType out_type, const float* lse,
                              const int32_t* segment_start, void* workspace, int64_t B, int64_t T, int64_t H,
                              int64_t KV, int64_t D, cudaStream_t stream, const AttentionRopeBackward& rope) {
  if (!attention_sm90a_supported(type, type, type, type, D))
    throw std::logic_error("cuda::attention_sm90a_backward: needs BF16 or F16 operands and head dim 64 or 128");
  if (B < 0 || T < 0 || H <= 0 || KV <= 0 || H % KV != 0 || T > (1 << 30) || B > 65535 || H > 65535)
    throw std::logic_error("cuda::attention_sm90a_backward: unsupported sizes (need H, KV > 0, H % KV == 0)");
  for (const void* ptr : {dout, q, k, v, out, static_cast<const void*>(workspace), static_cast<const void*>(dq),
                          static_cast<const void*>(dk), static_cast<const void*>(dv)})
    if (!attention_sm90a_aligned(ptr))
      throw std::logic_error("cuda::attention_sm90a_backward: operands must be 16-byte aligned");
  if (segment_start != nullptr && !attention_sm90a_backward_takes_segments(T))
    throw std::logic_error("cuda::attention_sm90a_backward: packed rows longer than the kernel lists (T " +
                           std::to_string(T) + ")");
  if (B == 0 || T == 0) return;
  if ((T + kBlockRows - 1) / kBlockRows * B * H > INT32_MAX)
    throw std::logic_error("cuda::attention_sm90a_backward: more than 2^31 - 1 blocks (B · H · T / 128)");
  // The workspace: drow, then dout rounded to `type` when it is stored in another, then (segments)
  // each query tile's smallest segment start.
  uint8_t* const bytes = static_cast<uint8_t*>(workspace);
  float* drow = static_cast<float*>(workspace);
  const int64_t drow_bytes = round_up_256(B * H * T * static_cast<int64_t>(sizeof(float)));
  const int64_t dout16_bytes = round_up_256(dout_type == type ? 0 : B * T * H * D * 2);
  void* dout16 = dout_type == type ? nullptr : bytes + drow_bytes;
  int32_t* tile_min = segment_start != nullptr ? reinterpret_cast<int32_t*>(bytes + drow_bytes + dout16_bytes) : nullptr;
  const void* do_tiles = dout16 != nullptr ? dout16 : dout;
  const Params base{static_cast<int>(T), static_cast<int>(H), static_cast<int>(KV),
                    1.0f / std::sqrt(static_cast<float>(D)), lse, drow, segment_start, tile_min,
                    nullptr, KType::F32, nullptr, KType::F32, rope, false, {}};
  with_type_and_dim(type, D, "attention_sm90a_backward", [&](auto tag, auto dim) {
    using T16 = decltype(tag);
    constexpr int HD = decltype(dim)::value;
    const int64_t rows = B * T * H;
    const int64_t blocks = std::min<int64_t>((rows * (D / 8) + 255) / 256, 65535 * 8);
    with_ktype(dout_type, [&](auto dout_tag) {
      with_ktype(out_type, [&](auto out_tag) {
        using DoutT = decltype(dout_tag);
        using OutT = decltype(out_tag);
        prepare_kernel<T16, DoutT, OutT><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(
            drow, static_cast<T16*>(dout16), static_cast<const DoutT*>(dout), static_cast<const OutT*>(out), rows,
            static_cast<int>(T), static_cast<int>(H), static_cast<int>(D));
      });
    });
    check_launch("attention_sm90a_backward (rowsum dout*out)");
    if (segment_start != nullptr) {
      const int64_t tiles = B * ((T + kStepRows - 1) / kStepRows);
      tile_min_start_kernel<<<static_cast<unsigned>(std::min<int64_t>((tiles + 255) / 256, 65535)), 256, 0, stream>>>(
          tile_min, segment_start, static_cast<int>(B), static_cast<int>(T));
      check_launch("attention_sm90a_backward (segments' smallest starts)");
    }
    const CUtensorMap q_map = head_tensor_map(q, B, T, H, D, 64), do_map = head_tensor_map(do_tiles, B, T, H, D, 64);
    const CUtensorMap k_map = head_tensor_map(k, B, T, KV, D, 64), v_map = head_tensor_map(v, B, T, KV, D, 64);
    const size_t smem = smem_bytes<HD>();
    const unsigned tiles = static_cast<unsigned>((T + kBlockRows - 1) / kBlockRows);

    Params kv = base;
    kv.grad_a = dk;
    kv.grad_a_type = dk_type;
    kv.grad_b = dv;
    kv.grad_b_type = dv_type;
    // dk and dv of the operands' type go out as boxes through the consumers' free K and V rows.
    kv.staged = dk_type == type && dv_type == type;
    const CUtensorMap dk_map = kv.staged ? head_tensor_map(dk, B, T, KV, D, 64) : k_map;  // else unused
    const CUtensorMap dv_map = kv.staged ? head_tensor_map(dv, B, T, KV, D, 64) : v_map;
    const auto dkdv = segment_start != nullptr ? attention_dkdv_sm90a_kernel<T16, HD, true>
                                               : attention_dkdv_sm90a_kernel<T16, HD, false>;
    allow_smem(dkdv, smem, "attention_sm90a_backward (dk, dv: shared memory attribute)");
    kv.order = hopper_order::tile_order(tiles, B * KV, 2 * T * D * 2 * (H / KV));  // Q, dO of the group
    dkdv<<<static_cast<unsigned>(kv.order.ranks * kv.order.heads), kThreads, smem, stream>>>(
        k_map, v_map, q_map, do_map, dk_map, dv_map, kv);
    check_launch("attention_sm90a_backward (dk, dv)");

    Params qp = base;
    qp.grad_a = dq;
    qp.grad_a_type = dq_type;
    qp.staged = dq_type == type;
    const CUtensorMap dq_map = qp.staged ? head_tensor_map(dq, B, T, H, D, 64) : q_map;  // else unused
    const auto dqk = segment_start != nullptr ? attention_dq_sm90a_kernel<T16, HD, true>
                                              : attention_dq_sm90a_kernel<T16, HD, false>;
    allow_smem(dqk, smem, "attention_sm90a_backward (dq: shared memory attribute)");
    qp.order = hopper_order::tile_order(tiles, B * H, 2 * T * D * 2);  // K, V
    dqk<<<static_cast<unsigned>(qp.order.ranks * qp.order.heads), kThreads, smem, stream>>>(
        q_map, do_map, k_map, v_map, dq_map, qp);
    check_launch("attention_sm90a_backward (dq)");
  });
}

}  // namespace fsdpq::cuda
