// Whether a memory-bound pass overlaps a base GEMM on another stream while the GPU sits at its
// power cap, before anyone builds a step around it (two half batches through a layer, one's
// elementwise passes beside the other's GEMMs). The 7B step without checkpointing spends ~150 ms of
// ~445 outside its base GEMMs on the H100, mostly memory-bound passes (bench/RESULTS.md, stop 49);
// cuBLAS's GEMMs take every SM, so a kernel on a side stream gets only what their last wave leaves
// (the adapter stream gained 1.2%). Here, for the gate/up forward GEMM (y = x Wᵀ, N 11008, K 4096,
// bf16) and a SwiGLU-shaped pass (h = silu(g) · u over [M, 11008], bf16: 3 bytes moved for 2 per
// element read), each sustained so the clocks settle:
//   alone: the GEMM; the pass;
//   one stream: the GEMM then the pass;
//   two streams: the GEMM beside the pass, each pair joined before the next;
//   two streams, the GEMM told to use SMs − k (cuBLASLt's SM count target) and the pass given k
//   SMs' worth of resident blocks: whether giving the pass whole SMs beats sharing the tail.
// Prints ms a pair and the saving against one stream.
//   nvcc -O2 -std=c++17 -arch=sm_90 bench/overlap_probe.cu -lcublasLt -o build/overlap_probe
//   build/overlap_probe [M=8192] [seconds per row=1.5]
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_bench.cuh"

namespace {

// h = silu(g) · u, 8 elements a thread a turn (16-byte accesses), grid-stride: any grid covers it.
__global__ void swiglu_pass(__nv_bfloat16* h, const __nv_bfloat16* g, const __nv_bfloat16* u, long n8) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n8; i += (long)gridDim.x * blockDim.x) {
    const uint4 gv = reinterpret_cast<const uint4*>(g)[i], uv = reinterpret_cast<const uint4*>(u)[i];
    const __nv_bfloat16* ge = reinterpret_cast<const __nv_bfloat16*>(&gv);
    const __nv_bfloat16* ue = reinterpret_cast<const __nv_bfloat16*>(&uv);
    uint4 out;
    __nv_bfloat16* oe = reinterpret_cast<__nv_bfloat16*>(&out);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float x = __bfloat162float(ge[e]);
      oe[e] = __float2bfloat16(x / (1.0f + __expf(-x)) * __bfloat162float(ue[e]));
    }
    reinterpret_cast<uint4*>(h)[i] = out;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const long M = argc > 1 ? std::atol(argv[1]) : 8192;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 1.5;
  const long N = 11008, K = 4096;
  int sms = 0, device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  std::printf("%s, %d SMs: GEMM [%ld, %ld] x [%ld, %ld]^T, pass over [%ld, %ld]\n", prop.name, sms, M, K, N, K, M, N);

  cudaStream_t s1, s2;
  CHECK_CUDA(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t fork, join;
  CHECK_CUDA(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CHECK_CUDA(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  cublasLtHandle_t lt;
  CHECK_BLAS(cublasLtCreate(&lt));
  const size_t workspace_bytes = 64ull << 20;
  void* workspace;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));

  __nv_bfloat16 *x, *w, *y, *g, *u, *h;
  CHECK_CUDA(cudaMalloc(&x, M * K * 2));
  CHECK_CUDA(cudaMalloc(&w, N * K * 2));
  CHECK_CUDA(cudaMalloc(&y, M * N * 2));
  CHECK_CUDA(cudaMalloc(&g, M * N * 2));
  CHECK_CUDA(cudaMalloc(&u, M * N * 2));
  CHECK_CUDA(cudaMalloc(&h, M * N * 2));
  bench::fill<<<1024, 256, 0, s1>>>(x, M * K, 1);
  bench::fill<<<1024, 256, 0, s1>>>(w, N * K, 2);
  bench::fill<<<1024, 256, 0, s1>>>(g, M * N, 3);
  bench::fill<<<1024, 256, 0, s1>>>(u, M * N, 4);
  CHECK_CUDA(cudaStreamSynchronize(s1));

  // Row-major y [M, N] = x [M, K] · wᵀ: column-major yᵀ [N, M] = w' [N, K] (w as [K, N], op T) · xᵀ [K, M].
  const cublasOperation_t op_t = CUBLAS_OP_T;
  cublasLtMatrixLayout_t la, lb, lc;
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
  CHECK_BLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, M, N));
  const float alpha = 1.0f, beta = 0.0f;
  // A GEMM told to aim at `sm_target` SMs (0: all), with cuBLASLt's first heuristic for it.
  auto make_gemm = [&](int sm_target) {
    cublasLtMatmulDesc_t desc;
    CHECK_BLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
    if (sm_target > 0)
      CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &sm_target,
                                                sizeof(sm_target)));
    cublasLtMatmulPreference_t pref;
    CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                    sizeof(workspace_bytes)));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &result, &found));
    if (found == 0) {
      std::fprintf(stderr, "no cuBLASLt algorithm for SM target %d\n", sm_target);
      std::exit(1);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    return std::make_pair(desc, result.algo);
  };
  auto gemm_on = [&](const std::pair<cublasLtMatmulDesc_t, cublasLtMatmulAlgo_t>& gemm, cudaStream_t stream) {
    CHECK_BLAS(cublasLtMatmul(lt, gemm.first, &alpha, w, la, x, lb, &beta, y, lc, y, lc, &gemm.second, workspace,
                              workspace_bytes, stream));
  };
  const long n8 = M * N / 8;
  int pass_blocks_per_sm = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&pass_blocks_per_sm, swiglu_pass, 256, 0));
  auto pass_on = [&](int grid, cudaStream_t stream) {
    swiglu_pass<<<grid, 256, 0, stream>>>(h, g, u, n8);
    CHECK_CUDA(cudaGetLastError());
  };
  const int full_grid = sms * pass_blocks_per_sm;
  const double flops = 2.0 * M * N * K, bytes = 3.0 * M * N * 2;

  const auto gemm_all = make_gemm(0);
  const double gemm_ms = bench::sustained_ms([&] { gemm_on(gemm_all, s1); }, seconds, s1);
  const double pass_ms = bench::sustained_ms([&] { pass_on(full_grid, s1); }, seconds, s1);
  const double serial_ms = bench::sustained_ms(
      [&] {
        gemm_on(gemm_all, s1);
        pass_on(full_grid, s1);
      },
      seconds, s1);
  std::printf("GEMM alone %.4f ms (%.1f TFLOP/s); pass alone %.4f ms (%.0f GB/s); one stream %.4f ms a pair\n",
              gemm_ms, flops / gemm_ms / 1e9, pass_ms, bytes / pass_ms / 1e6, serial_ms);
  // Both streams: the pass forks off s1 before the GEMM and s1 waits for it after: one pair at a time.
  auto beside = [&](const std::pair<cublasLtMatmulDesc_t, cublasLtMatmulAlgo_t>& gemm, int grid) {
    CHECK_CUDA(cudaEventRecord(fork, s1));
    CHECK_CUDA(cudaStreamWaitEvent(s2, fork, 0));
    pass_on(grid, s2);
    gemm_on(gemm, s1);
    CHECK_CUDA(cudaEventRecord(join, s2));
    CHECK_CUDA(cudaStreamWaitEvent(s1, join, 0));
  };
  const double shared_ms = bench::sustained_ms([&] { beside(gemm_all, full_grid); }, seconds, s1);
  std::printf("two streams, all SMs each: %.4f ms a pair (%+.1f%% against one stream)\n", shared_ms,
              100.0 * (shared_ms - serial_ms) / serial_ms);
  for (int k : {8, 16, 24, 33, 44}) {
    if (k >= sms) continue;
    const auto gemm_part = make_gemm(sms - k);
    const double part_gemm_ms = bench::sustained_ms([&] { gemm_on(gemm_part, s1); }, seconds, s1);
    const double part_pass_ms = bench::sustained_ms([&] { pass_on(k * pass_blocks_per_sm, s1); }, seconds, s1);
    const double split_ms = bench::sustained_ms([&] { beside(gemm_part, k * pass_blocks_per_sm); }, seconds, s1);
    std::printf("GEMM on %d SMs %.4f ms alone, pass on %d SMs %.4f ms alone; beside each other %.4f ms a pair "
                "(%+.1f%% against one stream)\n",
                sms - k, part_gemm_ms, k, part_pass_ms, split_ms, 100.0 * (split_ms - serial_ms) / serial_ms);
    cublasLtMatmulDescDestroy(gemm_part.first);
    std::fflush(stdout);
  }
  cublasLtMatmulDescDestroy(gemm_all.first);
  return 0;
}
