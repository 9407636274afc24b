// What the standalone GPU probes in bench/ (gemm_algos.cu, overlap_probe.cu) share: error checks
// that exit with the file and line, a random bf16 fill, and a sustained timer that lets the
// clocks settle under the power cap before it measures. Header-only: each probe builds with one
// nvcc line (in its header).
#pragma once
#include <cublas_api.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK_CUDA(x)                                                                \
  do {                                                                               \
    cudaError_t e = (x);                                                             \
    if (e != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)
#define CHECK_BLAS(x)                                                                     \
  do {                                                                                    \
    cublasStatus_t status_ = (x);                                                         \
    if (status_ != CUBLAS_STATUS_SUCCESS) {                                               \
      std::fprintf(stderr, "%s:%d cublas status %d\n", __FILE__, __LINE__, (int)status_); \
      std::exit(1);                                                                       \
    }                                                                                     \
  } while (0)

namespace bench {

// p[i] uniform in [-0.05, 0.05), from a hash of i and the seed.
__global__ void fill(__nv_bfloat16* p, long n, unsigned seed) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = __float2bfloat16(((h & 0xFFFF) / 65536.0f - 0.5f) * 0.1f);
  }
}

// ms per call of `run` (which queues on `stream`), sustained: a third of the interval untimed,
// the rest timed in batches of 10.
template <class F>
double sustained_ms(F&& run, double seconds, cudaStream_t stream) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  float ms = 0;
  CHECK_CUDA(cudaEventRecord(a, stream));
  while (ms < seconds * 1e3 / 3) {
    for (int i = 0; i < 10; ++i) run();
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  }
  long calls = 0;
  ms = 0;
  CHECK_CUDA(cudaEventRecord(a, stream));
  while (ms < seconds * 1e3 * 2 / 3) {
    for (int i = 0; i < 10; ++i) run();
    calls += 10;
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  }
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  return ms / calls;
}

}  // namespace bench
