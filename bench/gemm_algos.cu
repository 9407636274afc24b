// Which cuBLASLt algorithm runs a 7B layer's base GEMMs fastest while the GPU sits at its power cap.
// The 7B step is power-bound on the H100 (nvidia-smi: 690 W of 700, SM clock ~1635 of 1980 MHz,
// "SW power cap"), so an algorithm's speed at full clocks (what cuBLAS's heuristics rank by) need
// not be its speed in the step. For each shape of the layer (forward y = x Wᵀ, input gradient
// dx = dy W; M tokens, bf16 in and out, fp32 accumulation) this times cublasGemmEx's default and
// each algorithm cublasLtMatmulAlgoGetHeuristic offers, each run back to back for a sustained
// interval so the clocks settle, and prints TFLOP/s.
//   nvcc -O2 -std=c++17 -arch=sm_90 bench/gemm_algos.cu -lcublasLt -lcublas -o build/gemm_algos
//   build/gemm_algos [M=8192] [seconds per algorithm=1.5] [algorithms=8]
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda_bench.cuh"

namespace {

// Row-major C[M, N] = A[M, K] · op(B), op(B) = Bᵀ with B [N, K] (forward) or B with B [K, N]
// (input gradient). In cuBLAS's column-major terms: Cᵀ[N, M] = op'(B) · Aᵀ.
struct Shape {
  const char* name;
  long M, N, K;
  bool b_transposed;  // forward: B is [N, K]
  float beta;         // 1: accumulate into C (the input gradients of a group after the first)
};

template <class F>
double sustained_tflops(F&& run, double flops, double seconds, cudaStream_t stream) {
  return flops / (bench::sustained_ms(run, seconds, stream) * 1e-3) / 1e12;
}

}  // namespace

int main(int argc, char** argv) {
  const long M = argc > 1 ? std::atol(argv[1]) : 8192;
  const double seconds = argc > 2 ? std::atof(argv[2]) : 1.5;
  const int wanted = argc > 3 ? std::atoi(argv[3]) : 8;
  const std::vector<Shape> shapes = {
      {"q/k/v/o forward", M, 4096, 4096, true, 0.0f},
      {"gate/up forward", M, 11008, 4096, true, 0.0f},
      {"down forward", M, 4096, 11008, true, 0.0f},
      {"q/k/v/o dx (+=)", M, 4096, 4096, false, 1.0f},
      {"gate/up dx (+=)", M, 4096, 11008, false, 1.0f},
      {"down dx", M, 11008, 4096, false, 0.0f},
  };
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreate(&stream));
  cublasHandle_t blas;
  CHECK_BLAS(cublasCreate(&blas));
  CHECK_BLAS(cublasSetStream(blas, stream));
  cublasLtHandle_t lt;
  CHECK_BLAS(cublasLtCreate(&lt));
  const size_t workspace_bytes = 64ull << 20;
  void* workspace;
  CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  CHECK_BLAS(cublasSetWorkspace(blas, workspace, workspace_bytes));

  for (const Shape& s : shapes) {
    __nv_bfloat16 *A, *B, *C;
    CHECK_CUDA(cudaMalloc(&A, s.M * s.K * 2));
    CHECK_CUDA(cudaMalloc(&B, s.N * s.K * 2));
    CHECK_CUDA(cudaMalloc(&C, s.M * s.N * 2));
    bench::fill<<<1024, 256, 0, stream>>>(A, s.M * s.K, 1);
    bench::fill<<<1024, 256, 0, stream>>>(B, s.N * s.K, 2);
    bench::fill<<<1024, 256, 0, stream>>>(C, s.M * s.N, 3);
    const double flops = 2.0 * s.M * s.N * s.K;
    const float alpha = 1.0f, beta = s.beta;
    // Column-major: Cᵀ [N, M] (ld N) = op(B') [N, K] · Aᵀ [K, M] (ld K). Forward: B' = B [N, K]
    // row-major = [K, N] column-major (ld K), op = T. Input gradient: B [K, N] row-major = [N, K]
    // column-major (ld N), op = N.
    const cublasOperation_t op_b = s.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int ldb = s.b_transposed ? (int)s.K : (int)s.N;
    auto gemm_ex = [&] {
      CHECK_BLAS(cublasGemmEx(blas, op_b, CUBLAS_OP_N, (int)s.N, (int)s.M, (int)s.K, &alpha, B, CUDA_R_16BF, ldb, A,
                              CUDA_R_16BF, (int)s.K, &beta, C, CUDA_R_16BF, (int)s.N, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    };
    std::printf("%-18s M %ld N %ld K %ld: cublasGemmEx default %.1f TFLOP/s\n", s.name, s.M, s.N, s.K,
                sustained_tflops(gemm_ex, flops, seconds, stream));
    std::fflush(stdout);

    cublasLtMatmulDesc_t desc;
    CHECK_BLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)));
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, s.b_transposed ? s.K : s.N, s.b_transposed ? s.N : s.K, ldb));
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, s.K, s.M, s.K));
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, s.N, s.M, s.N));
    cublasLtMatmulPreference_t pref;
    CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                    sizeof(workspace_bytes)));
    std::vector<cublasLtMatmulHeuristicResult_t> results(wanted);
    int found = 0;
    CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, wanted, results.data(), &found));
    for (int i = 0; i < found; ++i) {
      const cublasLtMatmulAlgo_t algo = results[i].algo;
      auto run = [&] {
        CHECK_BLAS(cublasLtMatmul(lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc, &algo, workspace,
                                  workspace_bytes, stream));
      };
      int id = 0, tile = 0, stages = 0, splitk = 0, cluster = 0;
      size_t written = 0;
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written);
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &written);
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &written);
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &written);
      cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster),
                                           &written);
      std::printf("  lt #%d (algo %d tile %d stages %d splitk %d cluster %d, waves %.2f): %.1f TFLOP/s\n", i, id,
                  tile, stages, splitk, cluster, results[i].wavesCount,
                  sustained_tflops(run, flops, seconds, stream));
      std::fflush(stdout);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(lc);
    cublasLtMatmulDescDestroy(desc);
    CHECK_CUDA(cudaFree(A));
    CHECK_CUDA(cudaFree(B));
    CHECK_CUDA(cudaFree(C));
  }
  return 0;
}
