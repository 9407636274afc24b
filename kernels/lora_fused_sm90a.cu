// The Hopper fused LoRA kernels (kernels/lora_fused_sm90a.cuh): the down product, and below it the
// input gradient. The down product: one block per (128-row tile of x, split of the input width);
// 3 warpgroups with fixed roles, as the Hopper attention forward (kernels/attention_sm90a.cu) has
// them:
//  - warpgroup 0, the producer: one thread issues the bulk tensor copies of each 64-column k step
//    — the x tile (128 rows) and every adapter's A tile (its 64 rows) — into stage i % kStages of
//    a ring, each stage with a "full" barrier (bytes arrived) and an "empty" one (every consumer
//    thread is done). It keeps 24 registers per thread and gives the rest to the consumers.
//  - warpgroups 1 and 2, the consumers: 64 rows of x each. Per k step and 16-column slice, a warp
//    loads its 16 rows once (ldmatrix from the copy engine's swizzled tile: the layout of wgmma's
//    register A operand), then for each adapter masks those registers with the adapter's dropout
//    (the CPU's mask and rounding: kernels/lora_dropout_mask.h, ops/lora.cpp) and issues
//    xa_i += masked x · A_iᵀ (wgmma m64n64k16, A_i's tile K-major in shared memory). Each step's
//    products are waited for within the step: ptxas serialises every wgmma of a kernel where
//    registers of a product's operands are written while products run (docs/cuda.md). The two
//    consumers run independently, so one's masking overlaps the other's products.
// Rows past M load as zeros (their products are never stored). The epilogue writes each thread's
// accumulators straight to xa, or to the split's fp32 partial sums, which
// lora_fused_split_sum adds in split order.
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/hopper/mbarrier.cuh"
#include "kernels/hopper/shared_memory.cuh"
#include "kernels/hopper/sm90a_image.cuh"
#include "kernels/hopper/tensor_map.cuh"
#include "kernels/hopper/tma.cuh"
#include "kernels/hopper/warpgroup.cuh"
#include "kernels/hopper/wgmma.cuh"
#include "kernels/lora_fused_sm90a_layout.h"
#include "kernels/lora_fused_sm90a.cuh"
#include "kernels/lora_dropout_mask.h"
#include "kernels/lora_fused_shape.h"
#include "kernels/mma_fragments.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "lora_fused_sm90a.cu needs sm_90a (wgmma, setmaxnreg): CMakeLists.txt builds *_sm90a.cu for it alone"
#endif

namespace fsdpq::cuda {
namespace {

using namespace hopper;

constexpr int kConsumers = 2;                     // warpgroups multiplying, 64 rows of x each
constexpr int kThreads = 128 * (1 + kConsumers);  // plus the producer warpgroup
constexpr int kBlockRows = 64 * kConsumers;       // rows of x per block
constexpr int kRank = 64;                         // every adapter's: one wgmma n64 per adapter
constexpr int kStepColumns = 64;                  // columns of x per k step: one 128-byte swizzled box
constexpr int kSlices = kStepColumns / 16;        // wgmma k16 slices per step
constexpr int kStages = 4;
// Adapters a block takes: each holds 32 accumulators and 16 masked registers per thread, and the
// consumers have 240 registers (q, k, v is the largest group a Llama layer has).
constexpr int kMaxCount = 3;
constexpr int kProducerRegisters = 24;
// The consumers' registers a thread at `blocks` blocks an SM: one, or two for the weight gradient
// of a group of one adapter (o, down), whose blocks fit twice in an SM's shared memory: 16 warps an
// SM instead of 8 for a kernel that is latency-bound as much as ALU-bound (bench/RESULTS.md, stop
// 48: the 7B step's "lora: dA, dx" -2%). ptxas starts every thread at the register file's share
// (65536 / (384 · blocks), rounded down to 8: 168, or 80 at two), and setmaxnreg moves registers
// within a block only (a claim waits for what the block's own warpgroups released), so the
// consumers grow by what the producer gives up: 240 at one block, 104 at two. (112, which the
// registers an SM would allow, waits for registers that never come: the kernel hangs. The down
// kernel at two blocks and 104 registers has ptxas serialise its products, for no gain: measured.)
__host__ __device__ constexpr int consumer_registers(int blocks) {
  const int entry = 65536 / (kThreads * blocks) / 8 * 8;
  return (entry + (entry - kProducerRegisters) * 128 / (128 * kConsumers)) / 8 * 8;
}
constexpr int kConsumerRegisters = consumer_registers(1);
static_assert(kConsumerRegisters == 240 && consumer_registers(2) == 104);
static_assert(kStepColumns == static_cast<int>(lora_fused::kTileK), "the split's k ranges are whole steps");
static_assert(kStepColumns == kBoxColumns);

// Shared memory from a 1024-byte aligned base: kStages x tiles, then kStages x COUNT A tiles, then
// the barriers. Every tile is whole 1024-byte swizzle atoms (rows of 128 bytes).
template <int COUNT>
struct Smem {
  static constexpr int kXBytes = kBlockRows * kSwizzleRowBytes;  // 16 KiB
  static constexpr int kABytes = kRank * kSwizzleRowBytes;       // 8 KiB
  static constexpr int kX = 0;
  static constexpr int kA = kX + kStages * kXBytes;
  static constexpr int kBarriers = kA + kStages * COUNT * kABytes;
  static constexpr int kStepBytes = kXBytes + COUNT * kABytes;  // what one step's copies bring
  static constexpr int kConsumerRows = 64 * kSwizzleRowBytes;   // offset of consumer c's rows: c times this
};

struct Barriers {
  uint64_t full[kStages];   // the copy engine's bytes have landed
  uint64_t empty[kStages];  // every consumer thread is done with the stage
};

template <int COUNT>
constexpr size_t smem_bytes() {
  return Smem<COUNT>::kBarriers + sizeof(Barriers) + 1024;  // + room to align the base to 1024
}

// Every kernel's tensor maps: the rows it reads once a block (x for the down product, dxa for the
// input gradient), each adapter's A (unused entries repeat adapter 0's), and what the copy engine
// also writes: the down kernel's copy of x (Params::copy_x), the input gradient's dx where it is
// staged; unused otherwise.
struct Maps {
  CUtensorMap rows;
  CUtensorMap a[lora_fused::kMaxAdapters];
  CUtensorMap out;
};

struct Params {
  // down: xa (XA) with one split, else the fp32 partial sums [splits][M][Σ rank]; input gradient: dx
  void* out;
  int64_t M, in;
  int64_t per_split;  // columns of `in` a block's split covers
  LoraFusedGroup g;
  bool copy_x = false;  // down: also store x's tiles through maps.out
  int64_t chunk_rows = 0;  // weight gradient: rows of M per partial sum (lora_fused::weight_grad_chunk_rows)
};

// The ring stage and phase parity of a block's i-th step.
template <int STAGES = kStages>
__device__ __forceinline__ int stage_of(int i) {
  return i % STAGES;
}
template <int STAGES = kStages>
__device__ __forceinline__ uint32_t parity_of(int i) {
  return static_cast<uint32_t>(i / STAGES) & 1u;
}

// ---- what both kernels' blocks start with ----

// The columns of `in` this block's split covers: [begin, begin + steps · step_columns).
struct Split {
  int begin, steps;
};
__device__ __forceinline__ Split block_split(const Params& p, int step_columns) {
  const int64_t begin = static_cast<int64_t>(blockIdx.y) * p.per_split;
  const int64_t end = begin + p.per_split < p.in ? begin + p.per_split : p.in;
  return Split{static_cast<int>(begin), static_cast<int>((end - begin) / step_columns)};
}

// A ring's barriers (thread 0; the caller's __syncthreads publishes them): "full" completes on the
// copy engine's bytes, "empty" on every consumer thread's arrival.
template <int STAGES>
__device__ __forceinline__ void init_ring(uint64_t (&full)[STAGES], uint64_t (&empty)[STAGES]) {
  for (int s = 0; s < STAGES; ++s) {
    mbarrier_init(&full[s], 1);
    mbarrier_init(&empty[s], 128 * kConsumers);
  }
}

// A warp-specialised block's roles: thread 0 initialises the barriers (init), then warpgroup 0's
// first thread produces with a small register budget and the consumer warpgroups consume with
// the rest, as the attention kernels split them.
template <int CONSUMER_REGISTERS = kConsumerRegisters, class Init, class Produce, class Consume>
__device__ __forceinline__ void run_roles(Init&& init, Produce&& produce, Consume&& consume) {
  if (threadIdx.x == 0) {
    init();
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    release_registers<kProducerRegisters>();
    if (threadIdx.x == 0) produce();
  } else {
    claim_registers<CONSUMER_REGISTERS>();
    consume();
  }
}

// ---- the producer ----

// The down kernel's copy of x (`copy`: the folded GEMM's [x | xa], model/llama_layer.cpp): step j's
// x tile, once it has landed, stored from its stage by the copy engine, so x is read once for both.
template <int COUNT>
__device__ __forceinline__ void store_x_tile(const CUtensorMap& copy, uint8_t* smem, Barriers& bar, int m0,
                                             int k_begin, int j) {
  using S = Smem<COUNT>;
  mbarrier_wait(&bar.full[stage_of(j)], parity_of(j));
  tma_store_4d(copy, smem + S::kX + stage_of(j) * S::kXBytes, k_begin + j * kStepColumns, m0, 0, 0);
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Step i's tiles into stage i % kStages once every consumer is done with it. With copy_x, step i - 2's
// x tile is stored after step i's copies are issued (two steps behind: its tiles have long landed),
// and a stage is refilled only once the store of its last x tile has read it: before step i's
// copies, stores of steps up to i - 3 have been issued and at most one (step i - 3) may still read.
template <int COUNT>
__device__ void produce(const Maps& maps, uint8_t* smem, Barriers& bar, int m0, int k_begin, int steps, bool copy_x) {
  using S = Smem<COUNT>;
  static_assert(kStages >= 3, "the stored x tiles trail the copies by two steps");
  for (int i = 0; i < steps; ++i) {
    const int s = stage_of(i), k = k_begin + i * kStepColumns;
    mbarrier_wait(&bar.empty[s], parity_of(i) ^ 1u);  // the phase in which the stage was last emptied
    if (copy_x && i >= kStages) asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kStages - 3) : "memory");
    mbarrier_arrive_expect_tx(&bar.full[s], S::kStepBytes);
    tma_load_4d(smem + S::kX + s * S::kXBytes, maps.rows, &bar.full[s], k, m0, 0, 0);
#pragma unroll
    for (int j = 0; j < COUNT; ++j)
      tma_load_4d(smem + S::kA + (s * COUNT + j) * S::kABytes, maps.a[j], &bar.full[s], k, 0, 0, 0);
    if (copy_x && i >= 2) store_x_tile<COUNT>(maps.out, smem, bar, m0, k_begin, i - 2);
  }
  if (copy_x) {
    for (int j = steps < 2 ? 0 : steps - 2; j < steps; ++j) store_x_tile<COUNT>(maps.out, smem, bar, m0, k_begin, j);
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // the block's shared memory outlives the stores
  }
}

// ---- a consumer warpgroup ----

// Waits until at most `pending` committed groups of products are still running (0 to 2: the
// unrolled callers make it a constant).
__device__ __forceinline__ void wgmma_wait_pending(int pending) {
  if (pending >= 2)
    wgmma_wait<2>();
  else if (pending == 1)
    wgmma_wait<1>();
  else
    wgmma_wait<0>();
}

// A register of x's A operand (two consecutive 16-bit elements, lower column in the lower bits)
// with both elements times keep_scale, rounded to T: what a kept element becomes in the CPU's
// dropped copy. Every adapter of a group keeps or drops the same scaled values, so each register
// is scaled once, not once per adapter (dropped_pair then only masks).
template <class T>
__device__ __forceinline__ uint32_t scaled_pair(uint32_t raw, float keep_scale) {
  const T* v = reinterpret_cast<const T*>(&raw);
  return pack2<T>(__fmul_rn(to_float(v[0]), keep_scale), __fmul_rn(to_float(v[1]), keep_scale));
}

// A scaled_pair as an adapter's dropout leaves it: `fields` decide the two
// (kernels/lora_fused_sm90a_layout.h: element h kept when field h >= threshold); a dropped element
// becomes +0, as the CPU's dropped copy holds it. Without compares and selects, which the ALU pipe
// these kernels are bound by would run: field − threshold is negative exactly where the element
// drops, and prmt's sign-replicating selectors (nibbles 0xB, 0xF: the top byte of the first or
// second operand, its sign repeated over the byte) turn the two signs into the 16-bit halves of
// the drop mask.
__device__ __forceinline__ uint32_t dropped_pair(uint32_t scaled, uint32_t fields, uint32_t threshold) {
  const int32_t lo = static_cast<int32_t>(fields & 0xFFFFu) - static_cast<int32_t>(threshold);
  const int32_t hi = static_cast<int32_t>(fields >> 16) - static_cast<int32_t>(threshold);
  uint32_t drop;
  asm("prmt.b32 %0, %1, %2, 0xFFBB;" : "=r"(drop) : "r"(lo), "r"(hi));
  return scaled & ~drop;
}

// The fields of this thread's pairs in rows g and g + 8 from the one word this lane hashed (row g's
// or, odd lanes, row g + 8's), the halves exchanged with the neighbouring lane
// (kernels/lora_fused_sm90a_layout.h). The words come from keep_word_at: one 64-bit product per
// step and adapter instead of one per word, where the masks are most of these kernels' work.
__device__ __forceinline__ lora_sm90a_layout::PairFields pair_fields(uint64_t word, bool odd) {
  using namespace lora_sm90a_layout;
  const Halves mine = split(word, odd);
  return combine(mine.keep, __shfl_xor_sync(0xffffffffu, mine.give, 1), odd);
}

// A step's products go out adapter by adapter, each group issued as soon as its adapter's operand
// is masked, so masking one adapter overlaps the products of the ones before it. Groups of up to
// 2 adapters also mask step i + 1 into a second register set while step i's products run (3
// adapters have no registers for a second set: ptxas spills). Every operand register is written
// only while no product reads it: rewriting one a running group had read (as a wait for just
// that group would allow) makes ptxas serialise every product of the kernel.
template <class T, class XA, int COUNT>
struct Consumer {
  static constexpr bool kTwoSets = COUNT <= 2;
  using S = Smem<COUNT>;
  using Set = uint32_t[COUNT][kSlices * 4];  // a step's x rows as each adapter's A operand
  uint8_t* smem;
  Barriers& bar;
  const Params& p;
  const int m0, k_begin;
  const int index = static_cast<int>(threadIdx.x) / 128 - 1;  // 0 or 1
  const int warp = (static_cast<int>(threadIdx.x) % 128) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t4 = lane % 4;
  // This thread's rows (and + 8) of x, in the block and in x.
  const int row_in_block = 64 * index + 16 * warp + g;
  float acc[COUNT][32] = {};
  uint32_t scaled[kSlices * 4];  // the step's x rows as wgmma's A operand, scaled, unmasked
  Set even;                   // as each adapter's dropout leaves them: every step, or the even ones
  Set odd;                    // the odd steps' (kTwoSets; unused otherwise)

  // Step i's x rows (the stage has landed), scaled, into `scaled`.
  __device__ __forceinline__ void load_step(int i) {
    mbarrier_wait(&bar.full[stage_of(i)], parity_of(i));
    const uint8_t* x_rows = smem + S::kX + stage_of(i) * S::kXBytes + index * S::kConsumerRows;
#pragma unroll
    for (int kk = 0; kk < kSlices; ++kk) {
      uint32_t r[4];
      mma_fragments::ldmatrix_x4(r, x_rows + hopper_layout::a_operand_ldmatrix_offset(warp, lane, kk));
#pragma unroll
      for (int q = 0; q < 4; ++q)  // [2h], [2h + 1]: rows g and g + 8, same columns
        scaled[4 * kk + q] = scaled_pair<T>(r[q], p.g.keep_scale);
    }
  }

  // `scaled` masked with adapter j's dropout (step i's columns) into set[j].
  __device__ __forceinline__ void mask_adapter(int i, int j, Set& set) {
    using namespace lora_sm90a_layout;
    const int64_t step_column = static_cast<int64_t>(k_begin) + static_cast<int64_t>(i) * kStepColumns;
    const bool odd_lane = (t4 & 1) != 0;
    const uint64_t keyed =
        keyed_at(p.g.mixed_key[j], lane_base_quad(warp, lane, static_cast<int64_t>(m0) + 64 * index, step_column, p.in));
#pragma unroll
    for (int kk = 0; kk < kSlices; ++kk)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const PairFields f = pair_fields(keep_word_at(keyed, down_quad_offset(kk, h)), odd_lane);
        set[j][4 * kk + 2 * h] = dropped_pair(scaled[4 * kk + 2 * h], f.row_g, p.g.threshold);
        set[j][4 * kk + 2 * h + 1] = dropped_pair(scaled[4 * kk + 2 * h + 1], f.row_g8, p.g.threshold);
      }
  }

  // Adapter j's products of step i from set[j], issued and committed as one group.
  __device__ __forceinline__ void issue_adapter(int i, int j, Set& set) {
    const uint8_t* a_tile = smem + S::kA + (stage_of(i) * COUNT + j) * S::kABytes;
    fence_operand(acc[j]);
    fence_operand(set[j]);
    wgmma_fence();
    const uint64_t a = opaque(descriptor_k_major(a_tile));
#pragma unroll
    for (int kk = 0; kk < kSlices; ++kk) {
      const uint32_t slice[4] = {set[j][4 * kk], set[j][4 * kk + 1], set[j][4 * kk + 2], set[j][4 * kk + 3]};
      wgmma_m64n64k16_rs_k_major<T>(acc[j], slice, advanced(a, kk * 32));
    }
    wgmma_commit();
  }

  // Step i loaded, masked into `set` and issued, adapter by adapter.
  __device__ __forceinline__ void start_step(int i, Set& set) {
    load_step(i);
#pragma unroll
    for (int j = 0; j < COUNT; ++j) {
      mask_adapter(i, j, set);
      issue_adapter(i, j, set);
    }
  }

  // Step i's products done (they read `set`), with the `behind` groups issued after them still
  // running: step i's stage goes back.
  __device__ __forceinline__ void finish_step(int i, Set& set, int behind = 0) {
    wgmma_wait_pending(behind);
#pragma unroll
    for (int j = 0; j < COUNT; ++j) fence_operand(acc[j]);
#pragma unroll
    for (int j = 0; j < COUNT; ++j) fence_operand(set[j]);
    mbarrier_arrive(&bar.empty[stage_of(i)]);
  }

  // With two sets, step i + 1 is loaded and masked while step i's products run and issues behind
  // them (the tensor cores take a warpgroup's groups in order); step i is waited for, with step
  // i + 1's groups still running, before its set is masked into again. Two steps an iteration
  // keep each set a fixed array.
  __device__ void run(int steps) {
    if constexpr (!kTwoSets) {
      for (int i = 0; i < steps; ++i) {
        start_step(i, even);
        finish_step(i, even);
      }
    } else {
      if (steps == 0) return;
      start_step(0, even);
      int i = 1;
      for (; i + 1 < steps; i += 2) {
        start_step(i, odd);
        finish_step(i - 1, even, COUNT);  // step i's COUNT groups may still run
        start_step(i + 1, even);
        finish_step(i, odd, COUNT);
      }
      if (i < steps) {
        start_step(i, odd);
        finish_step(i - 1, even, COUNT);
        finish_step(i, odd);
      } else {
        finish_step(i - 1, even);
      }
    }
  }

  // acc[j] (rows row, row + 8; columns 8c + 2·t4, + 1 of adapter j's 64) to xa, or to this split's
  // partial sums.
  __device__ void store(bool partial) {
    const int total = p.g.total_rank;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t row = static_cast<int64_t>(m0) + row_in_block + 8 * h;
      if (row >= p.M) continue;
#pragma unroll
      for (int j = 0; j < COUNT; ++j)
#pragma unroll
        for (int c = 0; c < kRank / 8; ++c) {
          const int64_t column = p.g.first[j] + 8 * c + 2 * t4;
          const float lo = acc[j][4 * c + 2 * h], hi = acc[j][4 * c + 2 * h + 1];
          if (partial) {
            float* out = static_cast<float*>(p.out) + (static_cast<int64_t>(blockIdx.y) * p.M + row) * total + column;
            *reinterpret_cast<float2*>(out) = make_float2(lo, hi);
          } else {
            XA* out = static_cast<XA*>(p.out) + row * total + column;
            out[0] = from_float<XA>(lo);
            out[1] = from_float<XA>(hi);
          }
        }
    }
  }
};

template <class T, class XA, int COUNT>
__global__ void __launch_bounds__(kThreads, 1)
    lora_down_sm90a_kernel(const __grid_constant__ Maps maps, const __grid_constant__ Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = aligned_shared_1024(smem_raw);
  Barriers& bar = *reinterpret_cast<Barriers*>(smem + Smem<COUNT>::kBarriers);
  const int m0 = static_cast<int>(blockIdx.x) * kBlockRows;
  const Split split = block_split(p, kStepColumns);
  run_roles([&] { init_ring(bar.full, bar.empty); },
            [&] { produce<COUNT>(maps, smem, bar, m0, split.begin, split.steps, p.copy_x); },
            [&] {
              Consumer<T, XA, COUNT> c{smem, bar, p, m0, split.begin};
              c.run(split.steps);
              c.store(gridDim.y > 1);
            });
}

// ---- the input gradient: dx (+)= Σ_i keep_i ⊙ keep_scale ⊙ (dxa_i · A_i) ----
// One block per (128-row tile, split of dx's columns), the same 3 warpgroups. The producer brings
// the block's dxa rows once (each adapter's 64 columns: one box) and, per 128-column step, every
// adapter's A columns (two 64-column boxes of its 64 rows) into a ring. A consumer loads its rows
// of each adapter's dxa into registers once (wgmma's A operand, as the down kernel loads x), then
// works in units of one 64-column half of a step: it issues every adapter's acc_i = dxa_i · A_i
// (m64n64k16, B MN-major: A_i's rows are the k steps), each committed on its own, then waits for
// them one at a time and adds each, masked with adapter i's dropout (the fields as the down kernel
// shares them: kernels/lora_fused_sm90a_layout.h) and times keep_scale, into an fp32 sum, in
// adapter order — so the masking of one adapter overlaps the others' products. The sum goes to dx
// while the next unit's products run: dx = sum (overwrite) or dx + sum, rounded once, as the mma
// kernel (the separate path rounds each adapter's product, then dx after each). Units of 64
// columns keep a consumer's registers (3 adapters' dxa and acc, and the sum) within its 240.
// dx of the operands' 16-bit type, 16-byte aligned (the common case: "staged") moves through the
// ring too: with ADD the producer brings the step's dx tile (a 64 x 64 box per consumer and unit)
// beside A's, the consumer adds its sum into the box in shared memory, and one thread of the
// consumer stores the box with the copy engine; so dx is read ahead of use and written in whole
// 128-byte rows, where per-thread 4-byte loads and stores left the kernel waiting on memory at
// ~1 TB/s (ncu, stop 38). A stage is let go of once its boxes' stores have read them. fp32 or
// unaligned dx keeps the per-thread accesses.
constexpr int kGradColumns = 128;  // dx columns per step: two column blocks of A_i's tile
constexpr int kHalfColumns = 64;   // one wgmma n64, one column block: a unit
constexpr int kGradTargetBlocks = 132;  // an H100's or H200's SMs: the column split fills them about once

template <int COUNT, bool STAGED>
struct GradSmem {
  // Two stages when dx's boxes share the ring: three do not fit beside 3 adapters' dxa and A tiles.
  static constexpr int kStages = STAGED ? 2 : 3;
  static constexpr int kDxaBytes = kBlockRows * kSwizzleRowBytes;  // one adapter's columns of the block's rows
  static constexpr int kABlockBytes = kRank * kSwizzleRowBytes;     // 64 columns of A_i's 64 rows
  static constexpr int kABytes = 2 * kABlockBytes;                  // a step's 128 columns of A_i
  static constexpr int kDxBoxBytes = 64 * kSwizzleRowBytes;         // a consumer's 64 rows of a unit's 64 columns
  static constexpr int kDxStageBytes = STAGED ? 2 * kConsumers * kDxBoxBytes : 0;  // [unit][consumer] boxes
  static constexpr int kDxa = 0;
  static constexpr int kA = kDxa + COUNT * kDxaBytes;
  static constexpr int kDx = kA + kStages * COUNT * kABytes;
  static constexpr int kBarriers = kDx + kStages * kDxStageBytes;
  static constexpr int kABytesPerStep = COUNT * kABytes;
  static constexpr int kConsumerRows = 64 * kSwizzleRowBytes;
  __device__ static constexpr int dx_box(int stage, int half, int consumer) {
    return kDx + stage * kDxStageBytes + (half * kConsumers + consumer) * kDxBoxBytes;
  }
};

struct GradBarriers {
  uint64_t dxa_full;
  uint64_t full[3], empty[3];  // the first GradSmem::kStages of each
};

template <int COUNT, bool STAGED>
constexpr size_t grad_smem_bytes() {
  return GradSmem<COUNT, STAGED>::kBarriers + sizeof(GradBarriers) + 1024;
}

template <int COUNT, bool STAGED, bool ADD>
__device__ void produce_grad(const Maps& maps, const LoraFusedGroup& g, uint8_t* smem, GradBarriers& bar, int m0,
                             int c_begin, int steps) {
  using S = GradSmem<COUNT, STAGED>;
  constexpr bool kLoadsDx = STAGED && ADD;
  mbarrier_arrive_expect_tx(&bar.dxa_full, COUNT * S::kDxaBytes);
#pragma unroll
  for (int j = 0; j < COUNT; ++j)
    tma_load_4d(smem + S::kDxa + j * S::kDxaBytes, maps.rows, &bar.dxa_full, g.first[j], m0, 0, 0);
  for (int i = 0; i < steps; ++i) {
    const int s = stage_of<S::kStages>(i), c = c_begin + i * kGradColumns;
    mbarrier_wait(&bar.empty[s], parity_of<S::kStages>(i) ^ 1u);
    mbarrier_arrive_expect_tx(&bar.full[s], S::kABytesPerStep + (kLoadsDx ? S::kDxStageBytes : 0));
#pragma unroll
    for (int j = 0; j < COUNT; ++j)
#pragma unroll
      for (int cb = 0; cb < 2; ++cb)
        tma_load_4d(smem + S::kA + (s * COUNT + j) * S::kABytes + cb * S::kABlockBytes, maps.a[j],
                    &bar.full[s], c + kBoxColumns * cb, 0, 0, 0);
    if constexpr (kLoadsDx) {
#pragma unroll
      for (int half = 0; half < 2; ++half)
#pragma unroll
        for (int consumer = 0; consumer < kConsumers; ++consumer)
          tma_load_4d(smem + S::dx_box(s, half, consumer), maps.out, &bar.full[s], c + kHalfColumns * half,
                      m0 + 64 * consumer, 0, 0);
    }
  }
}

// dx's pair at `at` = (lo, hi), or += (lo, hi) with ADD: rounded once to DX.
template <class DX, bool ADD>
__device__ __forceinline__ void store_pair(DX* at, float lo, float hi) {
  if constexpr (std::is_same_v<DX, float>) {
    float2 v = make_float2(lo, hi);
    if constexpr (ADD) {
      const float2 old = *reinterpret_cast<const float2*>(at);
      v.x += old.x;
      v.y += old.y;
    }
    *reinterpret_cast<float2*>(at) = v;
  } else {
    if constexpr (ADD) {
      const uint32_t old = *reinterpret_cast<const uint32_t*>(at);
      const DX* v = reinterpret_cast<const DX*>(&old);
      lo += to_float(v[0]);
      hi += to_float(v[1]);
    }
    *reinterpret_cast<uint32_t*>(at) = pack2<DX>(lo, hi);
  }
}

template <class T, class DX, bool ADD, int COUNT, bool STAGED>
struct GradConsumer {
  static_assert(COUNT <= 3, "wgmma_wait_pending waits for at most 2 groups behind the one it needs");
  static_assert(!STAGED || sizeof(DX) == 2, "staged dx is of the operands' 16-bit type");
  using S = GradSmem<COUNT, STAGED>;
  uint8_t* smem;
  GradBarriers& bar;
  const Params& p;
  const CUtensorMap& dx_map;
  const int m0, c_begin;
  const int index = static_cast<int>(threadIdx.x) / 128 - 1;  // 0 or 1
  const int warp = (static_cast<int>(threadIdx.x) % 128) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const bool storer = threadIdx.x % 128 == 0;  // staged: the consumer's thread that issues its boxes' stores
  uint32_t dxa[COUNT][kSlices * 4];  // this warp's 16 rows of each adapter's dxa: wgmma's A operand
  float acc[COUNT][32], sum[32];      // one unit (64 columns)

  __device__ __forceinline__ void load_dxa() {
    mbarrier_wait(&bar.dxa_full, 0);
#pragma unroll
    for (int j = 0; j < COUNT; ++j)
#pragma unroll
      for (int kk = 0; kk < kSlices; ++kk) {
        uint32_t r[4];
        mma_fragments::ldmatrix_x4(r, smem + S::kDxa + j * S::kDxaBytes + index * S::kConsumerRows +
                                          hopper_layout::a_operand_ldmatrix_offset(warp, lane, kk));
#pragma unroll
        for (int q = 0; q < 4; ++q) dxa[j][4 * kk + q] = r[q];
      }
  }

  __device__ __forceinline__ int64_t column_of_unit(int u) const {
    return static_cast<int64_t>(c_begin) + static_cast<int64_t>(u / 2) * kGradColumns + kHalfColumns * (u % 2);
  }

  // Unit u's products (its step's stage has landed): one committed group per adapter.
  __device__ __forceinline__ void issue_unit(int u) {
    const int s = stage_of<S::kStages>(u / 2), half = u % 2;
#pragma unroll
    for (int j = 0; j < COUNT; ++j) {
#pragma unroll
      for (int e = 0; e < 32; ++e) acc[j][e] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < COUNT; ++j) fence_operand(acc[j]);
#pragma unroll
    for (int j = 0; j < COUNT; ++j) fence_operand(dxa[j]);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < COUNT; ++j) {
      // The half's column block of A_i's step tile, MN-major: k step kk is rows 16kk .. 16kk + 15.
      const uint64_t b = opaque(descriptor_mn_major(
          smem + S::kA + (s * COUNT + j) * S::kABytes + half * S::kABlockBytes, S::kABlockBytes));
#pragma unroll
      for (int kk = 0; kk < kSlices; ++kk) {
        const uint32_t slice[4] = {dxa[j][4 * kk], dxa[j][4 * kk + 1], dxa[j][4 * kk + 2], dxa[j][4 * kk + 3]};
        wgmma_m64nk16_rs<T, kHalfColumns>(acc[j], slice, advanced(b, kk * 16 * kSwizzleRowBytes));
      }
      wgmma_commit();
    }
  }

  // sum = Σ_j keep_scale · (adapter j's dropout ⊙ acc[j]) for unit u, adapter by adapter as its
  // products finish.
  __device__ __forceinline__ void sum_unit(int u) {
    const int64_t column0 = column_of_unit(u);
    const bool odd = (lane & 1) != 0;
    const float keep_scale = p.g.keep_scale;
    const uint32_t threshold = p.g.threshold;
#pragma unroll
    for (int e = 0; e < 32; ++e) sum[e] = 0.0f;
    // keyed_at(key_j, the lane's base quad) = key_j + golden: one 64-bit product a unit, not a word.
    const uint64_t golden =
        lora_sm90a_layout::keyed_at(0, lora_sm90a_layout::lane_base_quad(warp, lane, static_cast<int64_t>(m0) + 64 * index,
                                                                         column0, p.in));
#pragma unroll
    for (int j = 0; j < COUNT; ++j) {
      wgmma_wait_pending(COUNT - 1 - j);
      fence_operand(acc[j]);
#pragma unroll
      for (int c = 0; c < kHalfColumns / 8; ++c) {
        const lora_sm90a_layout::PairFields f = pair_fields(
            lora_sm90a_layout::keep_word_at(p.g.mixed_key[j] + golden, lora_sm90a_layout::input_grad_quad_offset(c)), odd);
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // (row g, lower), (row g, upper), (row g + 8, lower), (row g + 8, upper)
          const bool keep = lora_sm90a_layout::field_keeps(e < 2 ? f.row_g : f.row_g8, e & 1, threshold);
          sum[4 * c + e] += keep ? acc[j][4 * c + e] * keep_scale : 0.0f;
        }
      }
    }
#pragma unroll
    for (int j = 0; j < COUNT; ++j) fence_operand(dxa[j]);
  }

  // Unit u's sum into dx: straight to global memory, or (staged) into its box, stored whole by the
  // copy engine.
  __device__ __forceinline__ void store_unit(int u) {
    const int64_t column0 = column_of_unit(u);
    if constexpr (STAGED) {
      uint8_t* box = smem + S::dx_box(stage_of<S::kStages>(u / 2), u % 2, index);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = 16 * warp + lane / 4 + 8 * h;  // the box's row (r % 8 == lane / 4: its swizzle)
#pragma unroll
        for (int c = 0; c < kHalfColumns / 8; ++c) {
          DX* at = reinterpret_cast<DX*>(box + r * kSwizzleRowBytes + ((c ^ (r % 8)) << 4) + 4 * (lane % 4));
          store_pair<DX, ADD>(at, sum[4 * c + 2 * h], sum[4 * c + 2 * h + 1]);
        }
      }
      fence_proxy_async_shared();
      warpgroup_sync(1 + index);
      if (storer) {
        tma_store_4d(dx_map, box, static_cast<int>(column0), m0 + 64 * index, 0, 0);
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
      }
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t row = static_cast<int64_t>(m0) + 64 * index + 16 * warp + lane / 4 + 8 * h;
        if (row >= p.M) continue;
        DX* dx_row = static_cast<DX*>(p.out) + row * p.in + column0 + 2 * (lane % 4);
#pragma unroll
        for (int c = 0; c < kHalfColumns / 8; ++c)
          store_pair<DX, ADD>(dx_row + 8 * c, sum[4 * c + 2 * h], sum[4 * c + 2 * h + 1]);
      }
    }
  }

  // Staged: step i's stage goes back once its boxes' stores have read them (the storer waits for
  // every store group it issued; the newest is the step's second box) and every thread of the
  // consumer is done with its A tiles (they synced in store_unit after their last products of the step).
  __device__ __forceinline__ void release_staged(int i) {
    if (!storer) return;
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    mbarrier_arrive(&bar.empty[stage_of<S::kStages>(i)]);
  }

  // Two units a step. Unit u + 1's products are issued before unit u's sum is stored, so the
  // stores (and with ADD the loads of dx) run beside the tensor cores. Per-thread dx: a stage is
  // let go of once both its units' products are done. Staged: once its second unit's box store
  // (issued in the next unit) and the one before it have read the boxes.
  __device__ void run(int steps) {
    const int units = 2 * steps;
    for (int u = 0; u < units; ++u) {
      if (u % 2 == 0) mbarrier_wait(&bar.full[stage_of<S::kStages>(u / 2)], parity_of<S::kStages>(u / 2));
      issue_unit(u);
      if (u > 0) store_unit(u - 1);
      // Staged, unit u - 1 the second of its step: both its step's boxes are now being stored.
      if constexpr (STAGED)
        if (u > 0 && (u - 1) % 2 == 1) release_staged((u - 1) / 2);
      sum_unit(u);
      if constexpr (!STAGED) {
        if (u % 2 == 1) mbarrier_arrive(&bar.empty[stage_of<S::kStages>(u / 2)]);
      }
    }
    if (units > 0) {
      store_unit(units - 1);
      if constexpr (STAGED) release_staged(steps - 1);  // also: no store still reads shared memory at exit
    }
  }
};

template <class T, class DX, bool ADD, int COUNT, bool STAGED>
__global__ void __launch_bounds__(kThreads, 1)
    lora_input_grad_sm90a_kernel(const __grid_constant__ Maps maps, const __grid_constant__ Params p) {
  extern __shared__ uint8_t smem_raw[];
  using S = GradSmem<COUNT, STAGED>;
  uint8_t* smem = aligned_shared_1024(smem_raw);
  GradBarriers& bar = *reinterpret_cast<GradBarriers*>(smem + S::kBarriers);
  const int m0 = static_cast<int>(blockIdx.x) * kBlockRows;
  const Split split = block_split(p, kGradColumns);
  run_roles(
      [&] {
        mbarrier_init(&bar.dxa_full, 1);
        for (int s = 0; s < S::kStages; ++s) {
          mbarrier_init(&bar.full[s], 1);
          // Staged: each consumer's storer lets the stage go (release_staged); else every consumer thread.
          mbarrier_init(&bar.empty[s], STAGED ? kConsumers : 128 * kConsumers);
        }
      },
      [&] { produce_grad<COUNT, STAGED, ADD>(maps, p.g, smem, bar, m0, split.begin, split.steps); },
      [&] {
        GradConsumer<T, DX, ADD, COUNT, STAGED> c{smem, bar, p, maps.out, m0, split.begin};
        c.load_dxa();
        c.run(split.steps);
      });
}

// ---- the weight gradient: dA_i += dxa_iᵀ · dropout_i(x) ----
// One block per (128 columns of `in`, chunk of p.chunk_rows rows of M), the same 3
// warpgroups; consumer c owns columns 64c .. 64c + 63 of the block's 128 and every adapter's 64
// rows of dA there. Per 64-row step the producer brings x's rows (the two 64-column blocks) and
// each adapter's dxa columns into a ring; each consumer masks its block of x once per adapter
// into a buffer of its own (dropout applied where wgmma reads it: B comes from shared memory),
// then issues dA_i += dxa_iᵀ · masked x (m64n64k16, both operands MN-major: the tiles are
// row-major [rows, …] as the copy engine brought them). The masked buffers are double: step i + 1
// is masked while step i's products run. The chunk's sums go to the fp32 partial sums
// [chunk][Σ rank][in], which lora_fused_weight_grad_sum adds in chunk order, as for the mma
// kernel (the same scratch).
constexpr int kWeightColumns = 128;  // columns of `in` per block: a 64-column block per consumer
constexpr int kWeightStages = 3;     // with two masked buffers a consumer, within shared memory at 3 adapters
static_assert(lora_fused::kChunkRows % 64 == 0 && lora_fused::kMinChunkRows % 64 == 0);

template <int COUNT>
struct WeightSmem {
  static constexpr int kBlockBytes = 64 * kSwizzleRowBytes;  // 64 rows x 64 columns
  static constexpr int kXBytes = 2 * kBlockBytes;             // a step's 64 rows of the block's 128 columns
  static constexpr int kDxaBytes = kBlockBytes;               // a step's 64 rows of one adapter's dxa
  static constexpr int kStageBytes = kXBytes + COUNT * kDxaBytes;
  static constexpr int kRing = 0;
  // [buffer][consumer][adapter] masked x blocks
  static constexpr int kMasked = kRing + kWeightStages * kStageBytes;
  static constexpr int kBarriers = kMasked + 2 * kConsumers * COUNT * kBlockBytes;
};

struct WeightBarriers {
  uint64_t full[kWeightStages], empty[kWeightStages];
};

template <int COUNT>
constexpr size_t weight_smem_bytes() {
  return WeightSmem<COUNT>::kBarriers + sizeof(WeightBarriers) + 1024;
}

template <int COUNT>
__device__ void produce_weight(const Maps& maps, const CUtensorMap& dxa_map, const LoraFusedGroup& g, uint8_t* smem,
                               WeightBarriers& bar, int c0, int row0, int steps) {
  using S = WeightSmem<COUNT>;
  for (int i = 0; i < steps; ++i) {
    const int s = stage_of<kWeightStages>(i), row = row0 + 64 * i;
    uint8_t* stage = smem + S::kRing + s * S::kStageBytes;
    mbarrier_wait(&bar.empty[s], parity_of<kWeightStages>(i) ^ 1u);
    mbarrier_arrive_expect_tx(&bar.full[s], S::kStageBytes);
#pragma unroll
    for (int cb = 0; cb < 2; ++cb)
      tma_load_4d(stage + cb * S::kBlockBytes, maps.rows, &bar.full[s], c0 + kBoxColumns * cb, row, 0, 0);
#pragma unroll
    for (int j = 0; j < COUNT; ++j)
      tma_load_4d(stage + S::kXBytes + j * S::kDxaBytes, dxa_map, &bar.full[s], g.first[j], row, 0, 0);
  }
}

template <class T, int COUNT>
struct WeightConsumer {
  using S = WeightSmem<COUNT>;
  uint8_t* smem;
  WeightBarriers& bar;
  const Params& p;
  const int c0, row0;
  const int index = static_cast<int>(threadIdx.x) / 128 - 1;  // 0 or 1: the block's column half
  const int thread = static_cast<int>(threadIdx.x) % 128;
  float acc[COUNT][32] = {};

  __device__ uint8_t* stage(int i) const { return smem + S::kRing + stage_of<kWeightStages>(i) * S::kStageBytes; }
  __device__ uint8_t* masked(int i, int j) const {
    return smem + S::kMasked + (((i & 1) * kConsumers + index) * COUNT + j) * S::kBlockBytes;
  }

  // This consumer's 64 x 64 block of step i's x (landed), masked per adapter into masked(i, j):
  // 16-byte chunks (8 elements, two mask quads) at the same swizzled places.
  __device__ __forceinline__ void mask_block(int i) {
    mbarrier_wait(&bar.full[stage_of<kWeightStages>(i)], parity_of<kWeightStages>(i));
    const uint8_t* x_block = stage(i) + index * S::kBlockBytes;
    for (int idx = thread; idx < 64 * 8; idx += 128) {
      const int row = idx / 8, chunk = idx % 8;  // logical 16-byte chunk of the row
      const int offset = row * kSwizzleRowBytes + (chunk ^ (row % 8)) * 16;
      const uint4 raw = *reinterpret_cast<const uint4*>(x_block + offset);
      const int64_t e = (static_cast<int64_t>(row0) + 64 * i + row) * p.in + c0 + 64 * index + 8 * chunk;
      const uint32_t words[4] = {scaled_pair<T>(raw.x, p.g.keep_scale), scaled_pair<T>(raw.y, p.g.keep_scale),
                                 scaled_pair<T>(raw.z, p.g.keep_scale), scaled_pair<T>(raw.w, p.g.keep_scale)};
      const uint64_t golden = lora_sm90a_layout::keyed_at(0, e >> 2);  // one product for every adapter's two words
#pragma unroll
      for (int j = 0; j < COUNT; ++j) {
        const uint64_t w0 = lora_sm90a_layout::keep_word_at(p.g.mixed_key[j] + golden, 0),
                       w1 = lora_sm90a_layout::keep_word_at(p.g.mixed_key[j] + golden, 1);
        uint32_t out[4];
#pragma unroll
        for (int q = 0; q < 4; ++q)
          out[q] = dropped_pair(words[q], lora_sm90a_layout::chunk_pair_fields(w0, w1, q), p.g.threshold);
        *reinterpret_cast<uint4*>(masked(i, j) + offset) = make_uint4(out[0], out[1], out[2], out[3]);
      }
    }
    fence_proxy_async_shared();  // the masked blocks, written by these threads, are read by wgmma
  }

  // Step i's products (its masked blocks written by every thread of the warpgroup), committed.
  __device__ __forceinline__ void issue(int i) {
#pragma unroll
    for (int j = 0; j < COUNT; ++j) fence_operand(acc[j]);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < COUNT; ++j) {
      // dxa_iᵀ: the dxa tile's 64 rows are the k steps, its 64 columns the M rows of dA.
      const uint64_t a = opaque(descriptor_mn_major(stage(i) + S::kXBytes + j * S::kDxaBytes, S::kBlockBytes));
      const uint64_t b = opaque(descriptor_mn_major(masked(i, j), S::kBlockBytes));
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wgmma_m64n64k16_ss_mn_major<T>(acc[j], advanced(a, kk * 16 * kSwizzleRowBytes),
                                       advanced(b, kk * 16 * kSwizzleRowBytes));
    }
    wgmma_commit();
  }

  // Step i's products done: its stage goes back to the producer.
  __device__ __forceinline__ void finish(int i) {
    wgmma_wait<0>();
#pragma unroll
    for (int j = 0; j < COUNT; ++j) fence_operand(acc[j]);
    mbarrier_arrive(&bar.empty[stage_of<kWeightStages>(i)]);
  }

  // Step i + 1 is masked while step i's products run. Before step i + 1's products, the warpgroup
  // syncs: every thread's masking is done; before a buffer is masked into again (step i + 2), step
  // i's products that read it are done (finish(i), then the sync before issue(i + 1)).
  __device__ void run(int steps) {
    if (steps == 0) return;
    mask_block(0);
    warpgroup_sync(1 + index);
    issue(0);
    for (int i = 1; i < steps; ++i) {
      mask_block(i);
      finish(i - 1);
      warpgroup_sync(1 + index);
      issue(i);
    }
    finish(steps - 1);
  }

  // acc[j] (dA rows 16w + g (+ 8) of adapter j, columns 8c + 2t (+ 1) of this consumer's 64) into
  // this chunk's partial sums.
  __device__ void store(float* partial) const {
    const int warp = thread / 32, lane = thread % 32;
    const int64_t total = p.g.total_rank;
    float* chunk = partial + static_cast<int64_t>(blockIdx.y) * total * p.in;
#pragma unroll
    for (int j = 0; j < COUNT; ++j)
#pragma unroll
      for (int c = 0; c < 8; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const lora_sm90a_layout::Pair at = lora_sm90a_layout::accumulator_pair(warp, lane, c, h);
          float* out = chunk + (p.g.first[j] + at.row) * p.in + c0 + 64 * index + at.column;
          *reinterpret_cast<float2*>(out) = make_float2(acc[j][4 * c + 2 * h], acc[j][4 * c + 2 * h + 1]);
        }
  }
};

template <class T, int COUNT, int BLOCKS>
__global__ void __launch_bounds__(kThreads, BLOCKS)
    lora_weight_grad_sm90a_kernel(const __grid_constant__ Maps maps, const __grid_constant__ CUtensorMap dxa_map,
                                  const __grid_constant__ Params p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = aligned_shared_1024(smem_raw);
  WeightBarriers& bar = *reinterpret_cast<WeightBarriers*>(smem + WeightSmem<COUNT>::kBarriers);
  const int c0 = static_cast<int>(blockIdx.x) * kWeightColumns;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * p.chunk_rows;
  const int64_t rows = p.M - row0 < p.chunk_rows ? p.M - row0 : p.chunk_rows;
  const int steps = static_cast<int>((rows + 63) / 64);
  run_roles<consumer_registers(BLOCKS)>([&] { init_ring(bar.full, bar.empty); },
            [&] { produce_weight<COUNT>(maps, dxa_map, p.g, smem, bar, c0, static_cast<int>(row0), steps); },
            [&] {
              WeightConsumer<T, COUNT> c{smem, bar, p, c0, static_cast<int>(row0)};
              c.run(steps);
              c.store(static_cast<float*>(p.out));
            });
}

// The weight-gradient kernel's blocks an SM for a group of `count` adapters (consumer_registers);
// two of one adapter fit an SM's 228 KiB of shared memory (each also reserves 1 KiB).
constexpr int weight_blocks_an_sm(int count) { return count == 1 ? 2 : 1; }
static_assert(2 * (weight_smem_bytes<1>() + 1024) <= 228 * 1024);

template <class Fn>
void with_count(int count, Fn&& fn) {
  switch (count) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    default: break;
  }
  throw std::logic_error("cuda::lora_fused_sm90a: a group of " + std::to_string(count) + " adapters");
}

}  // namespace

bool lora_down_sm90a_takes(KType type, int64_t in, const LoraFusedGroup& g) {
  if ((type != KType::BF16 && type != KType::F16) || in <= 0 || in % kStepColumns != 0) return false;
  if (g.count < 1 || g.count > kMaxCount || g.total_rank != kRank * g.count) return false;
  for (int i = 0; i < g.count; ++i)
    if (g.rank[i] != kRank || g.first[i] != kRank * i || g.A[i] == nullptr) return false;
  return in <= (int64_t{1} << 30);
}

bool lora_down_sm90a_copies_to(const void* x_copy, int64_t stride, int64_t in) {
  return reinterpret_cast<uintptr_t>(x_copy) % 16 == 0 && stride >= in && stride % 8 == 0;
}

const std::string& lora_fused_sm90a_unavailable() {
  static const std::string why =
      sm90a_unavailable(reinterpret_cast<const void*>(lora_down_sm90a_kernel<__nv_bfloat16, __nv_bfloat16, 3>));
  return why;
}

void lora_down_sm90a(void* xa, KType xa_type, const void* x, KType type, const LoraFusedGroup& g, int64_t M,
                     int64_t in, float* workspace, cudaStream_t stream, void* x_copy, int64_t x_copy_stride) {
  if (!lora_down_sm90a_takes(type, in, g) || xa_type != type)
    throw std::logic_error("cuda::lora_down_sm90a: needs x, A and xa of one 16-bit type, 1 to 3 adapters of rank 64 "
                           "and in % 64 == 0");
  if (M < 0 || M > (int64_t{1} << 30)) throw std::logic_error("cuda::lora_down_sm90a: unsupported row count");
  if (M == 0) return;
  const int64_t per = lora_fused::down_k_per_split(M, in), splits = lora_fused::down_splits(M, in);
  if (splits > 1 && workspace == nullptr) throw std::logic_error("cuda::lora_down_sm90a: no workspace for the split");
  Maps maps{};
  maps.rows = head_tensor_map(x, 1, M, 1, in, kBlockRows);
  for (int j = 0; j < lora_fused::kMaxAdapters; ++j) maps.a[j] = head_tensor_map(g.A[j < g.count ? j : 0], 1, kRank, 1, in, kRank);
  if (x_copy != nullptr) {
    if (!lora_down_sm90a_copies_to(x_copy, x_copy_stride, in))
      throw std::logic_error("cuda::lora_down_sm90a: x's copy needs a 16-byte aligned block with a row stride of at "
                             "least `in`, a multiple of 8");
    maps.out = matrix_tensor_map(x_copy, M, in, x_copy_stride, kBlockRows);
  }
  Params p{splits > 1 ? static_cast<void*>(workspace) : xa, M, in, per, g};
  p.copy_x = x_copy != nullptr;
  const dim3 grid(static_cast<unsigned>((M + kBlockRows - 1) / kBlockRows), static_cast<unsigned>(splits));
  auto launch = [&](auto tag, auto count) {
    using T = decltype(tag);
    constexpr int COUNT = decltype(count)::value;
    const auto kernel = lora_down_sm90a_kernel<T, T, COUNT>;
    const size_t smem = smem_bytes<COUNT>();
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) != cudaSuccess)
      check_launch("lora_down_sm90a (shared memory attribute)");
    kernel<<<grid, kThreads, smem, stream>>>(maps, p);
  };
  with_count(g.count, [&](auto count) {
    if (type == KType::BF16)
      launch(__nv_bfloat16{}, count);
    else
      launch(__half{}, count);
  });
  check_launch("lora_down_sm90a");
  if (splits > 1) lora_fused_split_sum(xa, xa_type, workspace, static_cast<int>(splits), M * g.total_rank, stream);
}

bool lora_input_grad_sm90a_takes(KType type, int64_t in, const LoraFusedGroup& g) {
  return lora_down_sm90a_takes(type, in, g) && in % kGradColumns == 0;
}

void lora_input_grad_sm90a(void* dx, KType dx_type, bool accumulate, const void* dxa, KType type,
                           const LoraFusedGroup& g, int64_t M, int64_t in, cudaStream_t stream) {
  if (!lora_input_grad_sm90a_takes(type, in, g) || (dx_type != type && dx_type != KType::F32))
    throw std::logic_error("cuda::lora_input_grad_sm90a: needs dxa and A of one 16-bit type, dx of that type or F32, 1 "
                           "to 3 adapters of rank 64 and in % 128 == 0");
  if (M < 0 || M > (int64_t{1} << 30)) throw std::logic_error("cuda::lora_input_grad_sm90a: unsupported row count");
  if (M == 0) return;
  const int64_t row_tiles = (M + kBlockRows - 1) / kBlockRows, steps = in / kGradColumns;
  const int64_t want = kGradTargetBlocks / row_tiles;  // whole waves: 8192 rows give 64 x 2 blocks
  const int64_t splits_wanted = want < 1 ? 1 : (want > steps ? steps : want);
  const int64_t per = (steps + splits_wanted - 1) / splits_wanted * kGradColumns, splits = (in + per - 1) / per;
  // dx of the operands' type and 16-byte aligned goes through the copy engine (the staged path).
  const bool staged = dx_type == type && reinterpret_cast<uintptr_t>(dx) % 16 == 0;
  Maps maps{};
  maps.rows = head_tensor_map(dxa, 1, M, 1, g.total_rank, kBlockRows);
  for (int j = 0; j < lora_fused::kMaxAdapters; ++j)
    maps.a[j] = head_tensor_map(g.A[j < g.count ? j : 0], 1, kRank, 1, in, kRank);
  if (staged) maps.out = head_tensor_map(dx, 1, M, 1, in, 64);
  const Params p{dx, M, in, per, g};
  const dim3 grid(static_cast<unsigned>(row_tiles), static_cast<unsigned>(splits));
  auto launch = [&](auto tag, auto dx_tag, auto count, auto staged_tag) {
    using T = decltype(tag);
    using DX = decltype(dx_tag);
    constexpr int COUNT = decltype(count)::value;
    constexpr bool STAGED = decltype(staged_tag)::value;
    const auto kernel = accumulate ? lora_input_grad_sm90a_kernel<T, DX, true, COUNT, STAGED>
                                   : lora_input_grad_sm90a_kernel<T, DX, false, COUNT, STAGED>;
    const size_t smem = grad_smem_bytes<COUNT, STAGED>();
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) != cudaSuccess)
      check_launch("lora_input_grad_sm90a (shared memory attribute)");
    kernel<<<grid, kThreads, smem, stream>>>(maps, p);
  };
  with_count(g.count, [&](auto count) {
    auto with_dx = [&](auto tag) {
      using T = decltype(tag);
      if (dx_type == KType::F32)
        launch(tag, float{}, count, std::false_type{});
      else if (staged)
        launch(tag, T{}, count, std::true_type{});
      else
        launch(tag, T{}, count, std::false_type{});
    };
    if (type == KType::BF16)
      with_dx(__nv_bfloat16{});
    else
      with_dx(__half{});
  });
  check_launch("lora_input_grad_sm90a");
}

bool lora_weight_grad_sm90a_takes(KType type, int64_t in, const LoraFusedGroup& g) {
  return lora_down_sm90a_takes(type, in, g) && in % kWeightColumns == 0;
}

void lora_weight_grad_sm90a(float* const* dA, const void* dxa, const void* x, KType type, const LoraFusedGroup& g,
                            int64_t M, int64_t in, float* workspace, cudaStream_t stream) {
  if (!lora_weight_grad_sm90a_takes(type, in, g))
    throw std::logic_error("cuda::lora_weight_grad_sm90a: needs x, dxa and A of one 16-bit type, 1 to 3 adapters of "
                           "rank 64 and in % 128 == 0");
  if (M < 0 || M > (int64_t{1} << 30)) throw std::logic_error("cuda::lora_weight_grad_sm90a: unsupported row count");
  if (M == 0) return;
  if (workspace == nullptr) throw std::logic_error("cuda::lora_weight_grad_sm90a: no workspace");
  const int64_t chunks = lora_fused::weight_grad_chunks(M, in);
  Maps maps{};
  maps.rows = head_tensor_map(x, 1, M, 1, in, 64);
  const CUtensorMap dxa_map = head_tensor_map(dxa, 1, M, 1, g.total_rank, 64);
  Params p{workspace, M, in, kWeightColumns, g};
  p.chunk_rows = lora_fused::weight_grad_chunk_rows(M, in);
  const dim3 grid(static_cast<unsigned>(in / kWeightColumns), static_cast<unsigned>(chunks));
  auto launch = [&](auto tag, auto count) {
    using T = decltype(tag);
    constexpr int COUNT = decltype(count)::value;
    const auto kernel = lora_weight_grad_sm90a_kernel<T, COUNT, weight_blocks_an_sm(COUNT)>;
    const size_t smem = weight_smem_bytes<COUNT>();
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) != cudaSuccess)
      check_launch("lora_weight_grad_sm90a (shared memory attribute)");
    kernel<<<grid, kThreads, smem, stream>>>(maps, dxa_map, p);
  };
  with_count(g.count, [&](auto count) {
    if (type == KType::BF16)
      launch(__nv_bfloat16{}, count);
    else
      launch(__half{}, count);
  });
  check_launch("lora_weight_grad_sm90a");
  lora_fused_weight_grad_sum(dA, workspace, g, static_cast<int>(chunks), in, stream);
}

}  // namespace fsdpq::cuda
