// Tiled causal attention. Every kernel uses 256 threads as a 16 x 16 grid (tx, ty) and square
// tiles of BT query rows x BT key rows; thread (tx, ty) owns score entries (ty + 16i, tx + 16j)
// and output entries (row ty + 16i, column tx + 16j). Panels hold D rounded up to 4 columns (the
// extra ones zero) so the dot products read float4s; their row stride is an odd number of float4s,
// which makes those reads broadcasts or conflict-free. BT = 64 for D ≤ 128, 32 above, which
// keeps the shared memory of the backward below 227 KB at D = 256.
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/attention.cuh"

namespace fsdpq::cuda {
namespace {

constexpr int kThreads = 256;


// a . b over four lanes, in lane order (the pad lanes are zero).
__device__ __forceinline__ float dot4(float4 a, float4 b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

struct Dims {
  int B, T, H, KV, D;
  int dp;       // D rounded up to a multiple of 4 (columns D.. are zero in the panels)
  int ld;       // row stride of a [BT, dp] panel in shared memory: an odd number of float4s
  float scale;  // 1 / sqrt(D), as the CPU computes it
};

int padded_dim(int D) { return (D + 3) / 4 * 4; }
int panel_stride(int dp) { return (dp / 4) % 2 == 1 ? dp : dp + 4; }

// Rows [t0, t0 + BT) of head `head` of a [B, T, heads, D] tensor into a [BT, ld] panel (zeros
// past T and in columns D..dp).
template <int BT>
__device__ __forceinline__ void load_panel(float* panel, const void* x, KType type, const Dims& d, int b, int t0,
                                           int heads, int head) {
  for (int idx = threadIdx.x; idx < BT * d.dp; idx += kThreads) {
    const int r = idx / d.dp, c = idx - r * d.dp;
    const int t = t0 + r;
    panel[r * d.ld + c] = t < d.T && c < d.D
                              ? load_any(x, type, ((static_cast<int64_t>(b) * d.T + t) * heads + head) * d.D + c)
                              : 0.0f;
  }
}

// ---- forward: one block per (query tile, h, b) ----
// acc[i][j] += Σ_key w[ty + 16i][key] · panel[key][tx + 16j] over a tile's BT keys, w a
// [BT][BT + 1] tile in shared memory and the panel's columns past D read as 0: the forward's P V
// and the dq kernel's dS K.
template <int BT, int RI, int DC>
__device__ __forceinline__ void add_tile_product(float (&acc)[RI][DC], const float* w_s, const float* panel,
                                                 const Dims& d, int ty, int tx) {
  for (int key = 0; key < BT; ++key) {
    float wv[RI], pv[DC];
#pragma unroll
    for (int i = 0; i < RI; ++i) wv[i] = w_s[(ty + 16 * i) * (BT + 1) + key];
#pragma unroll
    for (int j = 0; j < DC; ++j) {
      const int c = tx + 16 * j;
      pv[j] = c < d.D ? panel[key * d.ld + c] : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < RI; ++i)
#pragma unroll
      for (int j = 0; j < DC; ++j) acc[i][j] += wv[i] * pv[j];
  }
}

template <int BT, int DC>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(void* out, KType out_type, float* lse, const void* q, KType q_type, const void* k,
                             KType k_type, const void* v, KType v_type, Dims d) {
  constexpr int RI = BT / 16;         // score rows / cols per thread
  constexpr int TPR = kThreads / BT;  // threads per row in the softmax update
  extern __shared__ float4 smem4[];  // float4: 16-byte aligned
  float* smem = reinterpret_cast<float*>(smem4);
  float* q_s = smem;                   // [BT, ld]
  float* kv_s = q_s + BT * d.ld;       // [BT, ld]: the K tile, then the V tile
  float* s_s = kv_s + BT * d.ld;       // [BT, BT + 1]: scores, then probabilities
  float* m_s = s_s + BT * (BT + 1);    // running max per row
  float* l_s = m_s + BT;               // running sum per row
  float* a_s = l_s + BT;               // this tile's rescale factor per row
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (d.H / d.KV);
  const int q0 = qt * BT;

  load_panel<BT>(q_s, q, q_type, d, b, q0, d.H, h);
  if (threadIdx.x < BT) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.0f;
  }
  float acc[RI][DC];
#pragma unroll
  for (int i = 0; i < RI; ++i)
#pragma unroll
    for (int j = 0; j < DC; ++j) acc[i][j] = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {  // causal: key tiles up to the diagonal one
    const int k0 = kt * BT;
    __syncthreads();  // the previous V tile is no longer read
    load_panel<BT>(kv_s, k, k_type, d, b, k0, d.KV, kvh);
    __syncthreads();
    float s[RI][RI] = {};
    for (int c = 0; c < d.dp; c += 4) {
      float4 qv[RI], kv[RI];
#pragma unroll
      for (int i = 0; i < RI; ++i) qv[i] = *reinterpret_cast<const float4*>(q_s + (ty + 16 * i) * d.ld + c);
#pragma unroll
      for (int j = 0; j < RI; ++j) kv[j] = *reinterpret_cast<const float4*>(kv_s + (tx + 16 * j) * d.ld + c);
#pragma unroll
      for (int i = 0; i < RI; ++i)
#pragma unroll
        for (int j = 0; j < RI; ++j) s[i][j] += dot4(qv[i], kv[j]);
    }
#pragma unroll
    for (int i = 0; i < RI; ++i)
#pragma unroll
      for (int j = 0; j < RI; ++j) {
        const int t = q0 + ty + 16 * i, key = k0 + tx + 16 * j;
        // Rows past T keep finite scores (key 0 is always visible), so nothing becomes NaN.
        s_s[(ty + 16 * i) * (BT + 1) + tx + 16 * j] = key <= t && key < d.T ? s[i][j] * d.scale : -INFINITY;
      }
    __syncthreads();
    {
      const int row = threadIdx.x / TPR, part = threadIdx.x % TPR;
      float* srow = s_s + row * (BT + 1);
      float mx = -INFINITY;
      for (int c = part; c < BT; c += TPR) mx = fmaxf(mx, srow[c]);
#pragma unroll
      for (int off = TPR / 2; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_old = m_s[row];
      const float m_new = fmaxf(m_old, mx);  // finite: every row sees key 0 in tile 0
      float sum = 0.0f;
      for (int c = part; c < BT; c += TPR) {
        const float p = expf(srow[c] - m_new);
        srow[c] = p;
        sum += p;
      }
#pragma unroll
      for (int off = TPR / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      __syncwarp();
      if (part == 0) {
        const float alpha = expf(m_old - m_new);  // 0 on the first tile
        l_s[row] = l_s[row] * alpha + sum;
        m_s[row] = m_new;
        a_s[row] = alpha;
      }
    }
    __syncthreads();  // P and alpha are ready, the K tile is no longer read
    load_panel<BT>(kv_s, v, v_type, d, b, k0, d.KV, kvh);
    __syncthreads();
#pragma unroll
    for (int i = 0; i < RI; ++i) {
      const float alpha = a_s[ty + 16 * i];
#pragma unroll
      for (int j = 0; j < DC; ++j) acc[i][j] *= alpha;
    }
    add_tile_product<BT>(acc, s_s, kv_s, d, ty, tx);  // acc += P V
  }
  // m_s / l_s were last written before the barrier that preceded the V tile load.
#pragma unroll
  for (int i = 0; i < RI; ++i) {
    const int r = ty + 16 * i, t = q0 + r;
    if (t >= d.T) continue;
    const float inv = 1.0f / l_s[r];
    const int64_t base = ((static_cast<int64_t>(b) * d.T + t) * d.H + h) * d.D;
#pragma unroll
    for (int j = 0; j < DC; ++j) {
      const int c = tx + 16 * j;
      if (c < d.D) store_any(out, out_type, base + c, acc[i][j] * inv);
    }
  }
  if (threadIdx.x < BT && q0 + static_cast<int>(threadIdx.x) < d.T)
    lse[(static_cast<int64_t>(b) * d.H + h) * d.T + q0 + threadIdx.x] = m_s[threadIdx.x] + logf(l_s[threadIdx.x]);
}

// ---- backward, step 1: drow[b, h, t] = dout[b, t, h, :] . out[b, t, h, :] (one warp per row) ----
__global__ void __launch_bounds__(kThreads)
    attention_drow_kernel(float* drow, const void* dout, KType dout_type, const void* out, KType out_type, Dims d) {
  const int64_t rows = static_cast<int64_t>(d.B) * d.T * d.H;  // in [b, t, h] order
  const int lane = threadIdx.x % 32;
  for (int64_t row = (blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x) / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * (kThreads / 32)) {
    float sum = 0.0f;
    for (int c = lane; c < d.D; c += 32)
      sum += load_any(dout, dout_type, row * d.D + c) * load_any(out, out_type, row * d.D + c);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    if (lane == 0) {
      const int64_t h = row % d.H, bt = row / d.H, t = bt % d.T, b = bt / d.T;
      drow[(b * d.H + h) * d.T + t] = sum;
    }
  }
}

// Two score-shaped products of a block at once, over the head dimension: s[i][j] += a_i · b_j
// and t[i][j] += c_i · e_j, with rows i of panels a, c at ty + 16i and rows j of b, e at tx + 16j
// (the dq kernel: Q Kᵀ and dO Vᵀ; the dk/dv kernel: K Qᵀ and V dOᵀ). I_FIRST: row i's float4 is
// dot4's first operand (dq) or its second (dk/dv), as each kernel has always multiplied them.
template <int RI, bool I_FIRST>
__device__ __forceinline__ void score_products(float (&s)[RI][RI], float (&t)[RI][RI], const float* a, const float* c,
                                               const float* b, const float* e, const Dims& d, int ty, int tx) {
  for (int col = 0; col < d.dp; col += 4) {
    float4 av[RI], cv[RI], bv[RI], ev[RI];
#pragma unroll
    for (int i = 0; i < RI; ++i) {
      av[i] = *reinterpret_cast<const float4*>(a + (ty + 16 * i) * d.ld + col);
      cv[i] = *reinterpret_cast<const float4*>(c + (ty + 16 * i) * d.ld + col);
    }
#pragma unroll
    for (int j = 0; j < RI; ++j) {
      bv[j] = *reinterpret_cast<const float4*>(b + (tx + 16 * j) * d.ld + col);
      ev[j] = *reinterpret_cast<const float4*>(e + (tx + 16 * j) * d.ld + col);
    }
#pragma unroll
    for (int i = 0; i < RI; ++i)
#pragma unroll
      for (int j = 0; j < RI; ++j) {
        s[i][j] += I_FIRST ? dot4(av[i], bv[j]) : dot4(bv[j], av[i]);
        t[i][j] += I_FIRST ? dot4(cv[i], ev[j]) : dot4(ev[j], cv[i]);
      }
  }
}

// ---- backward, step 2: dq, one block per (query tile, h, b), looping over key tiles ----
template <int BT, int DC>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(void* dq, KType dq_type, const void* dout, KType dout_type, const void* q, KType q_type,
                        const void* k, KType k_type, const void* v, KType v_type, const float* lse,
                        const float* drow, Dims d) {
  constexpr int RI = BT / 16;
  extern __shared__ float4 smem4[];  // float4: 16-byte aligned
  float* smem = reinterpret_cast<float*>(smem4);
  float* q_s = smem;
  float* do_s = q_s + BT * d.ld;
  float* k_s = do_s + BT * d.ld;
  float* v_s = k_s + BT * d.ld;
  float* ds_s = v_s + BT * d.ld;       // [BT, BT + 1]
  float* lse_s = ds_s + BT * (BT + 1);
  float* drow_s = lse_s + BT;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int qt = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int kvh = h / (d.H / d.KV);
  const int q0 = qt * BT;

  load_panel<BT>(q_s, q, q_type, d, b, q0, d.H, h);
  load_panel<BT>(do_s, dout, dout_type, d, b, q0, d.H, h);
  if (threadIdx.x < BT) {
    const int t = q0 + threadIdx.x;
    const int64_t at = (static_cast<int64_t>(b) * d.H + h) * d.T + t;
    lse_s[threadIdx.x] = t < d.T ? lse[at] : 0.0f;
    drow_s[threadIdx.x] = t < d.T ? drow[at] : 0.0f;
  }
  float acc[RI][DC];
#pragma unroll
  for (int i = 0; i < RI; ++i)
#pragma unroll
    for (int j = 0; j < DC; ++j) acc[i][j] = 0.0f;

  for (int kt = 0; kt <= qt; ++kt) {
    const int k0 = kt * BT;
    __syncthreads();  // the previous tiles are no longer read
    load_panel<BT>(k_s, k, k_type, d, b, k0, d.KV, kvh);
    load_panel<BT>(v_s, v, v_type, d, b, k0, d.KV, kvh);
    __syncthreads();
    float s[RI][RI] = {}, dp[RI][RI] = {};  // [query ty + 16i][key tx + 16j]
    score_products<RI, true>(s, dp, q_s, do_s, k_s, v_s, d, ty, tx);
#pragma unroll
    for (int i = 0; i < RI; ++i)
#pragma unroll
      for (int j = 0; j < RI; ++j) {
        const int r = ty + 16 * i, t = q0 + r, key = k0 + tx + 16 * j;
        // dS = P * (dP - rowsum(dO * O)) * scale, with P = exp(s * scale - lse) recomputed.
        const float p = key <= t && t < d.T && key < d.T ? expf(s[i][j] * d.scale - lse_s[r]) : 0.0f;
        ds_s[r * (BT + 1) + tx + 16 * j] = p * (dp[i][j] - drow_s[r]) * d.scale;
      }
    __syncthreads();
    add_tile_product<BT>(acc, ds_s, k_s, d, ty, tx);  // dq += dS K
  }
#pragma unroll
  for (int i = 0; i < RI; ++i) {
    const int t = q0 + ty + 16 * i;
    if (t >= d.T) continue;
    const int64_t base = ((static_cast<int64_t>(b) * d.T + t) * d.H + h) * d.D;
#pragma unroll
    for (int j = 0; j < DC; ++j) {
      const int c = tx + 16 * j;
      if (c < d.D) store_any(dq, dq_type, base + c, acc[i][j]);
    }
  }
}

// ---- backward, step 3: dk, dv, one block per (key tile, kv head, b), looping over the group's
// query heads (in order) and the query tiles at or after the key tile ----
template <int BT, int DC>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(void* dk, KType dk_type, void* dv, KType dv_type, const void* dout, KType dout_type,
                          const void* q, KType q_type, const void* k, KType k_type, const void* v, KType v_type,
                          const float* lse, const float* drow, Dims d) {
  constexpr int RI = BT / 16;
  extern __shared__ float4 smem4[];  // float4: 16-byte aligned
  float* smem = reinterpret_cast<float*>(smem4);
  float* k_s = smem;
  float* v_s = k_s + BT * d.ld;
  float* q_s = v_s + BT * d.ld;
  float* do_s = q_s + BT * d.ld;
  float* p_s = do_s + BT * d.ld;       // [BT keys, BT + 1]
  float* ds_s = p_s + BT * (BT + 1);   // [BT keys, BT + 1]
  float* lse_s = ds_s + BT * (BT + 1);
  float* drow_s = lse_s + BT;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  const int kt = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int group = d.H / d.KV;
  const int k0 = kt * BT;
  const int q_tiles = (d.T + BT - 1) / BT;

  load_panel<BT>(k_s, k, k_type, d, b, k0, d.KV, kvh);
  load_panel<BT>(v_s, v, v_type, d, b, k0, d.KV, kvh);
  float dk_acc[RI][DC], dv_acc[RI][DC];
#pragma unroll
  for (int i = 0; i < RI; ++i)
#pragma unroll
    for (int j = 0; j < DC; ++j) dk_acc[i][j] = dv_acc[i][j] = 0.0f;

  for (int h = kvh * group; h < (kvh + 1) * group; ++h)
    for (int qt = kt; qt < q_tiles; ++qt) {
      const int q0 = qt * BT;
      __syncthreads();  // the previous query tiles are no longer read
      load_panel<BT>(q_s, q, q_type, d, b, q0, d.H, h);
      load_panel<BT>(do_s, dout, dout_type, d, b, q0, d.H, h);
      if (threadIdx.x < BT) {
        const int t = q0 + threadIdx.x;
        const int64_t at = (static_cast<int64_t>(b) * d.H + h) * d.T + t;
        lse_s[threadIdx.x] = t < d.T ? lse[at] : 0.0f;
        drow_s[threadIdx.x] = t < d.T ? drow[at] : 0.0f;
      }
      __syncthreads();
      float s[RI][RI] = {}, dp[RI][RI] = {};  // [key ty + 16i][query tx + 16j]
      score_products<RI, false>(s, dp, k_s, v_s, q_s, do_s, d, ty, tx);
#pragma unroll
      for (int i = 0; i < RI; ++i)
#pragma unroll
        for (int j = 0; j < RI; ++j) {
          const int key = k0 + ty + 16 * i, r = tx + 16 * j, t = q0 + r;
          const float p = key <= t && t < d.T && key < d.T ? expf(s[i][j] * d.scale - lse_s[r]) : 0.0f;
          p_s[(ty + 16 * i) * (BT + 1) + r] = p;
          ds_s[(ty + 16 * i) * (BT + 1) + r] = p * (dp[i][j] - drow_s[r]) * d.scale;
        }
      __syncthreads();
      for (int r = 0; r < BT; ++r) {  // dv += Pᵀ dO, dk += dSᵀ Q
        float pv[RI], dsv[RI], dov[DC], qv[DC];
#pragma unroll
        for (int i = 0; i < RI; ++i) {
          pv[i] = p_s[(ty + 16 * i) * (BT + 1) + r];
          dsv[i] = ds_s[(ty + 16 * i) * (BT + 1) + r];
        }
#pragma unroll
        for (int j = 0; j < DC; ++j) {
          const int c = tx + 16 * j;
          dov[j] = c < d.D ? do_s[r * d.ld + c] : 0.0f;
          qv[j] = c < d.D ? q_s[r * d.ld + c] : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < RI; ++i)
#pragma unroll
          for (int j = 0; j < DC; ++j) {
            dv_acc[i][j] += pv[i] * dov[j];
            dk_acc[i][j] += dsv[i] * qv[j];
          }
      }
    }
#pragma unroll
  for (int i = 0; i < RI; ++i) {
    const int key = k0 + ty + 16 * i;
    if (key >= d.T) continue;
    const int64_t base = ((static_cast<int64_t>(b) * d.T + key) * d.KV + kvh) * d.D;
#pragma unroll
    for (int j = 0; j < DC; ++j) {
      const int c = tx + 16 * j;
      if (c >= d.D) continue;
      store_any(dk, dk_type, base + c, dk_acc[i][j]);
      store_any(dv, dv_type, base + c, dv_acc[i][j]);
    }
  }
}

size_t forward_smem(int BT, int ld) { return sizeof(float) * (2 * BT * ld + BT * (BT + 1) + 3 * BT); }
size_t dq_smem(int BT, int ld) { return sizeof(float) * (4 * BT * ld + BT * (BT + 1) + 2 * BT); }
size_t dkdv_smem(int BT, int ld) { return sizeof(float) * (4 * BT * ld + 2 * BT * (BT + 1) + 2 * BT); }

// Calls fn(BT, DC) as template constants for the head dimension.
template <class Fn>
void with_tile_config(int D, Fn&& fn) {
  if (D <= 64)
    fn(std::integral_constant<int, 64>{}, std::integral_constant<int, 4>{});
  else if (D <= 128)
    fn(std::integral_constant<int, 64>{}, std::integral_constant<int, 8>{});
  else
    fn(std::integral_constant<int, 32>{}, std::integral_constant<int, 16>{});
}

Dims make_dims(const char* what, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D) {
  if (B < 0 || T < 0 || H < 0 || KV <= 0 || H % KV != 0 || D < 1 || D > kAttentionMaxHeadDim || T > (1 << 30) ||
      B > 65535 || H > 65535)
    throw std::logic_error(std::string(what) + ": unsupported sizes (need KV > 0, H % KV == 0, 1 <= D <= 256)");
  const int dp = padded_dim(static_cast<int>(D));
  Dims d{static_cast<int>(B), static_cast<int>(T), static_cast<int>(H), static_cast<int>(KV), static_cast<int>(D),
         dp, panel_stride(dp), 1.0f / std::sqrt(static_cast<float>(D))};
  return d;
}

template <class Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) !=
      cudaSuccess)
    check_launch("attention (shared memory attribute)");
}

}  // namespace

void attention_forward(void* out, KType out_type, float* lse, const void* q, KType q_type, const void* k,
                       KType k_type, const void* v, KType v_type, int64_t B, int64_t T, int64_t H, int64_t KV,
                       int64_t D, cudaStream_t stream) {
  const Dims d = make_dims("cuda::attention_forward", B, T, H, KV, D);
  if (B == 0 || T == 0 || H == 0) return;
  with_tile_config(d.D, [&](auto bt, auto dc) {
    constexpr int BT = decltype(bt)::value, DC = decltype(dc)::value;
    const size_t smem = forward_smem(BT, d.ld);
    allow_smem(attention_forward_kernel<BT, DC>, smem);
    const dim3 grid(static_cast<unsigned>((d.T + BT - 1) / BT), static_cast<unsigned>(d.H),
                    static_cast<unsigned>(d.B));
    attention_forward_kernel<BT, DC><<<grid, kThreads, smem, stream>>>(out, out_type, lse, q, q_type, k, k_type, v,
                                                                      v_type, d);
  });
  check_launch("attention_forward");
}

void attention_backward(void* dq, KType dq_type, void* dk, KType dk_type, void* dv, KType dv_type,
                        const void* dout, KType dout_type, const void* q, KType q_type, const void* k,
                        KType k_type, const void* v, KType v_type, const void* out, KType out_type,
                        const float* lse, float* drow, int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D,
                        cudaStream_t stream) {
  const Dims d = make_dims("cuda::attention_backward", B, T, H, KV, D);
  if (B == 0 || T == 0) return;
  if (H > 0) {
    attention_drow_kernel<<<blocks_for(B * T * H * 32, kThreads), kThreads, 0, stream>>>(drow, dout, dout_type, out,
                                                                                      out_type, d);
    check_launch("attention_backward (rowsum dout*out)");
  }
  with_tile_config(d.D, [&](auto bt, auto dc) {
    constexpr int BT = decltype(bt)::value, DC = decltype(dc)::value;
    const unsigned tiles = static_cast<unsigned>((d.T + BT - 1) / BT);
    if (H > 0) {
      const size_t smem = dq_smem(BT, d.ld);
      allow_smem(attention_dq_kernel<BT, DC>, smem);
      attention_dq_kernel<BT, DC><<<dim3(tiles, static_cast<unsigned>(d.H), static_cast<unsigned>(d.B)), kThreads,
                                    smem, stream>>>(dq, dq_type, dout, dout_type, q, q_type, k, k_type, v, v_type,
                                                    lse, drow, d);
      check_launch("attention_backward (dq)");
    }
    // With H == 0 the group is empty and the kernel writes zeros, as the CPU does.
    const size_t smem = dkdv_smem(BT, d.ld);
    allow_smem(attention_dkdv_kernel<BT, DC>, smem);
    attention_dkdv_kernel<BT, DC><<<dim3(tiles, static_cast<unsigned>(d.KV), static_cast<unsigned>(d.B)), kThreads,
                                    smem, stream>>>(dk, dk_type, dv, dv_type, dout, dout_type, q, q_type, k, k_type,
                                                    v, v_type, lse, drow, d);
    check_launch("attention_backward (dk, dv)");
  });
}

}  // namespace fsdpq::cuda
