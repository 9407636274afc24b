#include "ops/gemm.h"

#include "ops/parallel.h"
#include "ops/storage.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fsdpq {

namespace {

// Blocking (BLIS-style): C is computed in kMR x kNR tiles held in registers; A is packed into
// kMR-row micro-panels per (kMC x kKC) block (in L2), B into kNR-column micro-panels (a panel
// of kKC x kNR floats, 16 KiB, stays in L1/L2 while it meets every A micro-panel of the block).
constexpr int64_t kMR = 6;
constexpr int64_t kNR = 16;
constexpr int64_t kKC = 256;
constexpr int64_t kMC = 120;
constexpr int64_t kNC = 1024;
constexpr int64_t kMaxPackedBFloats = int64_t{4} << 20;  // 16 MiB of packed B per column block

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// c[kMR x kNR] (row stride ldc) += a_panel[kc x kMR]^T-ish times b_panel[kc x kNR]:
// for each p, c[i][j] += a[p * kMR + i] * b[p * kNR + j].
using MicroKernel = void (*)(int64_t kc, const float* a, const float* b, float* c, int64_t ldc);

typedef float f32x4 __attribute__((vector_size(16)));
inline f32x4 load4(const float* p) {
  f32x4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store4(float* p, f32x4 v) { std::memcpy(p, &v, sizeof v); }

// Portable (SSE / NEON through GCC vector types): eight columns at a time, so the 12 four-wide
// accumulators fit in 16 vector registers.
void micro_kernel_portable(int64_t kc, const float* a, const float* b, float* c, int64_t ldc) {
  for (int64_t half = 0; half < kNR; half += 8) {
    f32x4 acc[kMR][2];
#pragma GCC unroll 6
    for (int i = 0; i < kMR; ++i) {
      acc[i][0] = load4(c + i * ldc + half);
      acc[i][1] = load4(c + i * ldc + half + 4);
    }
    const float* ap = a;
    const float* bp = b + half;
    for (int64_t p = 0; p < kc; ++p, ap += kMR, bp += kNR) {
      const f32x4 b0 = load4(bp), b1 = load4(bp + 4);
#pragma GCC unroll 6
      for (int i = 0; i < kMR; ++i) {
        const f32x4 ai = {ap[i], ap[i], ap[i], ap[i]};
        acc[i][0] += ai * b0;
        acc[i][1] += ai * b1;
      }
    }
#pragma GCC unroll 6
    for (int i = 0; i < kMR; ++i) {
      store4(c + i * ldc + half, acc[i][0]);
      store4(c + i * ldc + half + 4, acc[i][1]);
    }
  }
}

#if defined(__x86_64__)
// AVX2 + FMA: the 6 x 16 tile is 12 ymm accumulators; picked at run time when the CPU has them.
__attribute__((target("avx2,fma"))) void micro_kernel_avx2(int64_t kc, const float* a, const float* b, float* c,
                                                            int64_t ldc) {
  __m256 acc[kMR][2];
#pragma GCC unroll 6
  for (int i = 0; i < kMR; ++i) {
    acc[i][0] = _mm256_loadu_ps(c + i * ldc);
    acc[i][1] = _mm256_loadu_ps(c + i * ldc + 8);
  }
  for (int64_t p = 0; p < kc; ++p, a += kMR, b += kNR) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 6
    for (int i = 0; i < kMR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + i);
      acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < kMR; ++i) {
    _mm256_storeu_ps(c + i * ldc, acc[i][0]);
    _mm256_storeu_ps(c + i * ldc + 8, acc[i][1]);
  }
}

bool cpu_has_avx2_fma() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return has;
}
#endif

std::atomic<bool> force_portable{false};

MicroKernel pick_micro_kernel() {
#if defined(__x86_64__)
  if (!force_portable.load() && cpu_has_avx2_fma()) return micro_kernel_avx2;
#endif
  return micro_kernel_portable;
}

// Packs rows [i0, i0 + mc) x depth [p0, p0 + kc) of A into kMR-row micro-panels, converted to
// fp32 and zero-padded to a multiple of kMR rows: panel r holds element (i, p) at [p * kMR + i].
template <class S>
void pack_a_typed(float* dst, const MatrixOperand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc) {
  const S* src = static_cast<const S*>(a.data);
  for (int64_t ir = 0; ir < mc; ir += kMR) {
    float* panel = dst + ir * kc;
    const int64_t rows = std::min(kMR, mc - ir);
    if (a.col_stride == 1) {  // rows are contiguous: read along them
      for (int64_t i = 0; i < kMR; ++i) {
        if (i < rows) {
          const S* row = src + (i0 + ir + i) * a.row_stride + p0;
          for (int64_t p = 0; p < kc; ++p) panel[p * kMR + i] = to_f32(row[p]);
        } else {
          for (int64_t p = 0; p < kc; ++p) panel[p * kMR + i] = 0.0f;
        }
      }
    } else {  // a transposed operand: columns are contiguous
      for (int64_t p = 0; p < kc; ++p) {
        const S* column = src + (p0 + p) * a.col_stride + (i0 + ir) * a.row_stride;
        for (int64_t i = 0; i < kMR; ++i) panel[p * kMR + i] = i < rows ? to_f32(column[i * a.row_stride]) : 0.0f;
      }
    }
  }
}

// Packs depth [p0, p0 + kc) x columns [j0, j0 + kNR) of B into one micro-panel: element (p, j)
// at [p * kNR + j], zero-padded past column `cols`.
template <class S>
void pack_b_panel_typed(float* panel, const MatrixOperand& b, int64_t p0, int64_t kc, int64_t j0, int64_t cols) {
  const S* src = static_cast<const S*>(b.data);
  if (b.col_stride == 1) {
    for (int64_t p = 0; p < kc; ++p) {
      const S* row = src + (p0 + p) * b.row_stride + j0;
      for (int64_t j = 0; j < kNR; ++j) panel[p * kNR + j] = j < cols ? to_f32(row[j]) : 0.0f;
    }
  } else {  // a transposed operand (e.g. W^T in the forward): walk each column along its contiguous depth
    for (int64_t j = 0; j < kNR; ++j) {
      if (j < cols) {
        const S* column = src + (j0 + j) * b.col_stride + p0 * b.row_stride;
        for (int64_t p = 0; p < kc; ++p) panel[p * kNR + j] = to_f32(column[p * b.row_stride]);
      } else {
        for (int64_t p = 0; p < kc; ++p) panel[p * kNR + j] = 0.0f;
      }
    }
  }
}

void pack_a(float* dst, const MatrixOperand& a, int64_t i0, int64_t mc, int64_t p0, int64_t kc) {
  with_storage(a.dtype, "gemm", [&](auto tag) { pack_a_typed<decltype(tag)>(dst, a, i0, mc, p0, kc); });
}

void pack_b_panel(float* panel, const MatrixOperand& b, int64_t p0, int64_t kc, int64_t j0, int64_t cols) {
  with_storage(b.dtype, "gemm", [&](auto tag) { pack_b_panel_typed<decltype(tag)>(panel, b, p0, kc, j0, cols); });
}

// Writes a finished fp32 tile into C: C = (accumulate ? C : 0) + scale * tile, rounded once.
template <class S>
void store_tile_typed(const MatrixOutput& c, const float* tile, int64_t tile_stride, int64_t i0, int64_t rows,
                      int64_t j0, int64_t cols, bool accumulate, float scale) {
  S* dst = static_cast<S*>(c.data);
  for (int64_t i = 0; i < rows; ++i) {
    S* row = dst + (i0 + i) * c.stride() + j0;
    const float* t = tile + i * tile_stride;
    if (accumulate)
      for (int64_t j = 0; j < cols; ++j) row[j] = from_f32<S>(to_f32(row[j]) + scale * t[j]);
    else
      for (int64_t j = 0; j < cols; ++j) row[j] = from_f32<S>(scale * t[j]);
  }
}

void store_tile(const MatrixOutput& c, const float* tile, int64_t tile_stride, int64_t i0, int64_t rows, int64_t j0,
                int64_t cols, bool accumulate, float scale) {
  with_storage(c.dtype, "gemm", [&](auto tag) {
    store_tile_typed<decltype(tag)>(c, tile, tile_stride, i0, rows, j0, cols, accumulate, scale);
  });
}

void check_float(const char* name, DType dtype) {
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
    throw std::logic_error(fmt::format("gemm: {} is {}; expected F32, BF16 or F16", name, dtype_name(dtype)));
}

}  // namespace

void gemm_force_portable_kernel(bool force) { force_portable.store(force); }

const char* gemm_kernel_name() { return pick_micro_kernel() == micro_kernel_portable ? "portable" : "avx2-fma"; }

void gemm(const MatrixOutput& c, const MatrixOperand& a, const MatrixOperand& b, bool accumulate, float scale) {
  const int64_t M = c.rows, N = c.cols, K = a.cols;
  if (a.rows != M || b.rows != K || b.cols != N)
    throw std::logic_error(fmt::format("gemm: A [{}, {}] times B [{}, {}] does not give C [{}, {}]", a.rows, a.cols,
                                       b.rows, b.cols, M, N));
  check_float("A", a.dtype);
  check_float("B", b.dtype);
  check_float("C", c.dtype);
  if (c.stride() < N)
    throw std::logic_error(fmt::format("gemm: C's row stride {} is below its {} columns", c.stride(), N));
  if (M == 0 || N == 0) return;

  const MicroKernel kernel = pick_micro_kernel();
  const int64_t threads = std::max(1, omp_get_max_threads());
  const int64_t k_blocks = std::max<int64_t>(1, ceil_div(K, kKC));

  // Row blocks: a multiple of the thread count so the threads finish together.
  const int64_t row_blocks_wanted = round_up(ceil_div(M, kMC), threads);
  const int64_t mc = round_up(ceil_div(M, row_blocks_wanted), kMR);
  const int64_t row_blocks = ceil_div(M, mc);
  // Columns per packed B block, bounded so the packed panel stays a few MiB whatever K is.
  const int64_t nc_max = std::clamp((kMaxPackedBFloats / std::max<int64_t>(K, 1)) / kNR * kNR, kNR, kNC);
  std::vector<float> packed_b(static_cast<size_t>(k_blocks * kKC * round_up(std::min(nc_max, N), kNR)));

  for (int64_t jc = 0; jc < N; jc += nc_max) {
    const int64_t nc = std::min(nc_max, N - jc);
    const int64_t nc_padded = round_up(nc, kNR);
    const int64_t col_panels = nc_padded / kNR;
    // With fewer row blocks than threads (small M), split the columns too.
    int64_t col_splits = std::clamp(ceil_div(threads, row_blocks), int64_t{1}, col_panels);
    const int64_t panels_per_split = ceil_div(col_panels, col_splits);
    col_splits = ceil_div(col_panels, panels_per_split);
    const int64_t tasks = row_blocks * col_splits;

#pragma omp parallel if (worth_parallel(M * nc * std::max<int64_t>(K, 1)))
    {
#pragma omp for collapse(2) schedule(static)
      for (int64_t kb = 0; kb < k_blocks; ++kb)
        for (int64_t jp = 0; jp < col_panels; ++jp) {
          const int64_t p0 = kb * kKC, kc = std::min(kKC, K - p0);
          float* block = packed_b.data() + kb * kKC * nc_padded;
          pack_b_panel(block + jp * kNR * kc, b, p0, kc, jc + jp * kNR, std::min(kNR, nc - jp * kNR));
        }

      thread_local std::vector<float> packed_a, tile;
#pragma omp for schedule(dynamic)
      for (int64_t task = 0; task < tasks; ++task) {
        const int64_t i0 = (task / col_splits) * mc;
        const int64_t rows = std::min(mc, M - i0), rows_padded = round_up(rows, kMR);
        const int64_t jp0 = (task % col_splits) * panels_per_split;
        const int64_t jp1 = std::min(col_panels, jp0 + panels_per_split);
        const int64_t width = (jp1 - jp0) * kNR;
        packed_a.resize(static_cast<size_t>(rows_padded * kKC));
        tile.assign(static_cast<size_t>(rows_padded * width), 0.0f);

        // Depth blocks in order: every element of C sums its products in the same order
        // whatever the thread count.
        for (int64_t kb = 0; kb < k_blocks; ++kb) {
          const int64_t p0 = kb * kKC, kc = std::min(kKC, K - p0);
          if (kc <= 0) break;
          pack_a(packed_a.data(), a, i0, rows, p0, kc);
          const float* block = packed_b.data() + kb * kKC * nc_padded;
          for (int64_t jp = jp0; jp < jp1; ++jp)
            for (int64_t ir = 0; ir < rows_padded; ir += kMR)
              kernel(kc, packed_a.data() + ir * kc, block + jp * kNR * kc, tile.data() + ir * width + (jp - jp0) * kNR,
                     width);
        }
        const int64_t j0 = jc + jp0 * kNR;
        store_tile(c, tile.data(), width, i0, rows, j0, std::min(width, jc + nc - j0), accumulate, scale);
      }
    }
  }
}

}  // namespace fsdpq
