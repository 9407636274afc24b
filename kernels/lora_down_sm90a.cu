// The Hopper LoRA down product (kernels/lora_down_sm90a.cuh). One block per (128-row tile of x,
// split of the input width); 3 warpgroups with fixed roles, as the Hopper attention forward
// (kernels/attention_sm90a.cu) has them:
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

#include "kernels/hopper/mbarrier.cuh"
#include "kernels/hopper/sm90a_image.cuh"
#include "kernels/hopper/tensor_map.cuh"
#include "kernels/hopper/tma.cuh"
#include "kernels/hopper/warpgroup.cuh"
#include "kernels/hopper/wgmma.cuh"
#include "kernels/lora_down_layout.h"
#include "kernels/lora_down_sm90a.cuh"
#include "kernels/lora_dropout_mask.h"
#include "kernels/lora_fused_shape.h"
#include "kernels/mma_fragments.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "lora_down_sm90a.cu needs sm_90a (wgmma, setmaxnreg): CMakeLists.txt builds *_sm90a.cu for it alone"
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
constexpr int kProducerRegisters = 24, kConsumerRegisters = 240;
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

// The tensor maps of x and of each adapter's A (unused entries repeat adapter 0's).
struct Maps {
  CUtensorMap x;
  CUtensorMap a[lora_fused::kMaxAdapters];
};

struct Params {
  void* out;        // xa (XA) with one split, else the fp32 partial sums [splits][M][Σ rank]
  int64_t M, in;
  int64_t k_per_split;
  LoraFusedGroup g;
};

__device__ __forceinline__ int stage_of(int i) { return i % kStages; }
__device__ __forceinline__ uint32_t parity_of(int i) { return static_cast<uint32_t>(i / kStages) & 1u; }

// ---- the producer ----

template <int COUNT>
__device__ void produce(const Maps& maps, uint8_t* smem, Barriers& bar, int m0, int k_begin, int steps) {
  using S = Smem<COUNT>;
  for (int i = 0; i < steps; ++i) {
    const int s = stage_of(i), k = k_begin + i * kStepColumns;
    mbarrier_wait(&bar.empty[s], parity_of(i) ^ 1u);  // the phase in which the stage was last emptied
    mbarrier_arrive_expect_tx(&bar.full[s], S::kStepBytes);
    tma_load_4d(smem + S::kX + s * S::kXBytes, maps.x, &bar.full[s], k, m0, 0, 0);
#pragma unroll
    for (int j = 0; j < COUNT; ++j)
      tma_load_4d(smem + S::kA + (s * COUNT + j) * S::kABytes, maps.a[j], &bar.full[s], k, 0, 0, 0);
  }
}

// ---- a consumer warpgroup ----

// A register of x's A operand (two consecutive 16-bit elements, lower column in the lower bits)
// as an adapter's dropout leaves it: `fields` decide the two (kernels/lora_down_layout.h); a kept
// element times keep_scale and rounded to T, a dropped one 0, as the CPU's dropped copy holds them.
template <class T>
__device__ __forceinline__ uint32_t dropped_pair(uint32_t raw, uint32_t fields, uint32_t threshold, float keep_scale) {
  const T* v = reinterpret_cast<const T*>(&raw);
  const float lo = lora_down_layout::field_keeps(fields, 0, threshold) ? __fmul_rn(to_float(v[0]), keep_scale) : 0.0f;
  const float hi = lora_down_layout::field_keeps(fields, 1, threshold) ? __fmul_rn(to_float(v[1]), keep_scale) : 0.0f;
  return pack2<T>(lo, hi);
}

// The fields of this thread's pairs in rows g and g + 8 (quads quad_g, quad_g8): one hash per lane,
// the halves exchanged with the neighbouring lane (kernels/lora_down_layout.h).
__device__ __forceinline__ lora_down_layout::PairFields pair_fields(uint64_t mixed_key, int64_t quad_g, int64_t quad_g8,
                                                                    bool odd) {
  using namespace lora_down_layout;
  const Halves mine = split(keep_word(mixed_key, hashed_quad(quad_g, quad_g8, odd)), odd);
  return combine(mine.keep, __shfl_xor_sync(0xffffffffu, mine.give, 1), odd);
}

template <class T, class XA, int COUNT>
struct Consumer {
  using S = Smem<COUNT>;
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
  uint32_t masked[COUNT][kSlices * 4];  // the step's x rows as each adapter's A operand

  // Step i's x rows masked per adapter (the stage has landed).
  __device__ __forceinline__ void mask_step(int i) {
    const uint8_t* x_rows = smem + S::kX + stage_of(i) * S::kXBytes + index * S::kConsumerRows;
    const int64_t step_column = static_cast<int64_t>(k_begin) + static_cast<int64_t>(i) * kStepColumns;
    const bool odd = (t4 & 1) != 0;
#pragma unroll
    for (int kk = 0; kk < kSlices; ++kk) {
      uint32_t raw[4];
      mma_fragments::ldmatrix_x4(raw, x_rows + lora_down_layout::ldmatrix_offset(warp, lane, kk));
      // raw[2h], raw[2h + 1]: rows g and g + 8 of the same columns.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const lora_down_layout::Pair at = lora_down_layout::fragment_pair(warp, lane, kk, 2 * h);
        const int64_t row = static_cast<int64_t>(m0) + 64 * index + at.row, column = step_column + at.column;
        const int64_t quad_g = (row * p.in + column) >> 2, quad_g8 = ((row + 8) * p.in + column) >> 2;
#pragma unroll
        for (int j = 0; j < COUNT; ++j) {
          const lora_down_layout::PairFields f = pair_fields(p.g.mixed_key[j], quad_g, quad_g8, odd);
          masked[j][4 * kk + 2 * h] = dropped_pair<T>(raw[2 * h], f.row_g, p.g.threshold, p.g.keep_scale);
          masked[j][4 * kk + 2 * h + 1] = dropped_pair<T>(raw[2 * h + 1], f.row_g8, p.g.threshold, p.g.keep_scale);
        }
      }
    }
  }

  // Step i's products, issued and committed (not waited for).
  __device__ __forceinline__ void issue_step(int i) {
    const uint8_t* a_tiles = smem + S::kA + stage_of(i) * COUNT * S::kABytes;
#pragma unroll
    for (int j = 0; j < COUNT; ++j) fence_operand(acc[j]);
#pragma unroll
    for (int j = 0; j < COUNT; ++j) fence_operand(masked[j]);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < COUNT; ++j) {
      const uint64_t a = opaque(descriptor_k_major(a_tiles + j * S::kABytes));
#pragma unroll
      for (int kk = 0; kk < kSlices; ++kk) {
        const uint32_t slice[4] = {masked[j][4 * kk], masked[j][4 * kk + 1], masked[j][4 * kk + 2],
                                   masked[j][4 * kk + 3]};
        wgmma_m64n64k16_rs_k_major<T>(acc[j], slice, advanced(a, kk * 32));
      }
    }
    wgmma_commit();
  }

  __device__ void run(int steps) {
    for (int i = 0; i < steps; ++i) {
      mbarrier_wait(&bar.full[stage_of(i)], parity_of(i));
      mask_step(i);
      issue_step(i);
      wgmma_wait<0>();
#pragma unroll
      for (int j = 0; j < COUNT; ++j) fence_operand(acc[j]);
#pragma unroll
      for (int j = 0; j < COUNT; ++j) fence_operand(masked[j]);
      mbarrier_arrive(&bar.empty[stage_of(i)]);
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
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t{1023});
  Barriers& bar = *reinterpret_cast<Barriers*>(smem + Smem<COUNT>::kBarriers);
  const int m0 = static_cast<int>(blockIdx.x) * kBlockRows;
  const int64_t k_begin = static_cast<int64_t>(blockIdx.y) * p.k_per_split;
  const int64_t k_end = k_begin + p.k_per_split < p.in ? k_begin + p.k_per_split : p.in;
  const int steps = static_cast<int>((k_end - k_begin) / kStepColumns);
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&bar.full[s], 1);
      mbarrier_init(&bar.empty[s], 128 * kConsumers);
    }
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    release_registers<kProducerRegisters>();
    if (threadIdx.x == 0) produce<COUNT>(maps, smem, bar, m0, static_cast<int>(k_begin), steps);
  } else {
    claim_registers<kConsumerRegisters>();
    Consumer<T, XA, COUNT> c{smem, bar, p, m0, static_cast<int>(k_begin)};
    c.run(steps);
    c.store(gridDim.y > 1);
  }
}

template <class Fn>
void with_count(int count, Fn&& fn) {
  switch (count) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    default: break;
  }
  throw std::logic_error("cuda::lora_down_sm90a: a group of " + std::to_string(count) + " adapters");
}

}  // namespace

bool lora_down_sm90a_takes(KType type, int64_t in, const LoraFusedGroup& g) {
  if ((type != KType::BF16 && type != KType::F16) || in <= 0 || in % kStepColumns != 0) return false;
  if (g.count < 1 || g.count > kMaxCount || g.total_rank != kRank * g.count) return false;
  for (int i = 0; i < g.count; ++i)
    if (g.rank[i] != kRank || g.first[i] != kRank * i || g.A[i] == nullptr) return false;
  return in <= (int64_t{1} << 30);
}

const std::string& lora_down_sm90a_unavailable() {
  static const std::string why =
      sm90a_unavailable(reinterpret_cast<const void*>(lora_down_sm90a_kernel<__nv_bfloat16, __nv_bfloat16, 3>));
  return why;
}

void lora_down_sm90a(void* xa, KType xa_type, const void* x, KType type, const LoraFusedGroup& g, int64_t M,
                     int64_t in, float* workspace, cudaStream_t stream) {
  if (!lora_down_sm90a_takes(type, in, g) || xa_type != type)
    throw std::logic_error("cuda::lora_down_sm90a: needs x, A and xa of one 16-bit type, 1 to 3 adapters of rank 64 "
                           "and in % 64 == 0");
  if (M < 0 || M > (int64_t{1} << 30)) throw std::logic_error("cuda::lora_down_sm90a: unsupported row count");
  if (M == 0) return;
  const int64_t per = lora_fused::down_k_per_split(M, in), splits = lora_fused::down_splits(M, in);
  if (splits > 1 && workspace == nullptr) throw std::logic_error("cuda::lora_down_sm90a: no workspace for the split");
  Maps maps{};
  maps.x = head_tensor_map(x, 1, M, 1, in, kBlockRows);
  for (int j = 0; j < lora_fused::kMaxAdapters; ++j) maps.a[j] = head_tensor_map(g.A[j < g.count ? j : 0], 1, kRank, 1, in, kRank);
  const Params p{splits > 1 ? static_cast<void*>(workspace) : xa, M, in, per, g};
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

}  // namespace fsdpq::cuda
