// Token embedding on the GPU: the row gather and its deterministic scatter-add gradient
// (src/ops/embedding.cpp). Ids are I32 on the device; the op checks them first with
// embedding_first_bad_id (one small synchronisation), so the kernels below only see valid ids.
#pragma once
#include <cstdint>

#include "kernels/kernel_types.cuh"

namespace fsdpq::cuda {

// The first position n with ids[n] outside [0, vocab), or -1; *bad_id receives ids[n]. flag: one
// device int32 of scratch. Waits for the stream (the answer comes back to the host).
int64_t embedding_first_bad_id(const int32_t* ids, int64_t n, int64_t vocab, int32_t* flag, int32_t* bad_id,
                               cudaStream_t stream);

// out[n, :] = table[ids[n], :], out [N, C], table [V, C].
void embedding_forward(void* out, KType out_type, const int32_t* ids, const void* table, KType table_type, int64_t N,
                       int64_t C, cudaStream_t stream);

// dtable[ids[n], :] += dout[n, :] in fp32. Each thread owns one column and adds the tokens in order,
// like the CPU, so the result is bit-identical to the CPU's and deterministic (no atomics).
void embedding_backward(float* dtable, const int32_t* ids, const void* dout, KType dout_type, int64_t N, int64_t C,
                        cudaStream_t stream);

}  // namespace fsdpq::cuda
