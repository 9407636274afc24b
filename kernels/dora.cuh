// DoRA's elementwise pieces on the GPU (ops/dora.h has their meaning and the CPU references):
// row norms of an fp32 block, the magnitude scale g = m / n, output columns scaled by g (+ an
// offset), and the magnitude's gradient, a column sum. Deterministic: every sum is taken by one
// block in a fixed order (no atomics), so a run repeats bit for bit.
#pragma once
#include <cstdint>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// norm[i] = sqrt(Σ_k P[i, k]²), P F32 [rows, in].
void dora_row_norms(float* norm, const float* P, int64_t rows, int64_t in, cudaStream_t stream);

// g[j] = m[j] / n[j], out elements.
void dora_magnitude_scale(float* g, const void* m, KType m_type, const float* n, int64_t out, cudaStream_t stream);
// norm[o] = sqrt(max(0, Σ_j w[o, j]² + Σ_k b[o, k]·(2s·g[o, k] + s²·h[o, k]))); w [out, in], b [out, r]
// of their types, g and h F32 [out, r].
void dora_norm_from_parts(float* norm, const void* w, KType w_type, const void* b, KType b_type, const float* g,
                          const float* h, int64_t out, int64_t in, int64_t r, float scaling, cudaStream_t stream);

// out[t, j] = (accumulate ? out[t, j] : 0) + in[t, j] · (g[j] + offset), rows × cols.
void dora_scale_columns(void* out, KType out_type, const void* in, KType in_type, const float* g, float offset,
                        bool accumulate, int64_t rows, int64_t cols, cudaStream_t stream);

// dm[j] += (Σ_t dy[t, j] · z[t, j]) / n[j], the rows summed in fp32.
void dora_magnitude_backward(float* dm, const void* dy, KType dy_type, const void* z, KType z_type, const float* n,
                             int64_t rows, int64_t cols, cudaStream_t stream);

}  // namespace fsdpq::cuda
