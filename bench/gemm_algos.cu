// Which cuBLASLt algorithm runs a 7B layer's base GEMMs fastest while the GPU sits at its power cap.
// The 7B step is power-bound on the H100 (nvidia-smi: 690 W of 700, SM clock ~1635 of 1980 MHz,
// "SW power cap"), so an algorithm's speed at full clocks (what cuBLAS's heuristics rank by) need
// not be its speed in the step. For each shape of the layer (forward y = x Wᵀ, input gradient
// dx = dy W; M tokens, bf16 in and out, fp32 accumulation) this times cublasGemmEx's default and
// each algorithm cublasLtMatmulAlgoGetHeuristic offers, each run back to back for a sustained
// interval so the clocks settle, and prints TFLOP/s.
//   nvcc -O2 -std=c++17 -arch=sm_90 bench/gemm_algos.cu -lcublasLt -lcublas -o build/gemm_algos
//   build/gemm_algos [M=8192] [seconds per algorithm=1.5] [algorithms=8] [wide | db]
// (wide: the input gradients with a folded group's adapter columns; db: LoRA's dB products.)
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

// A cuBLASLt algorithm's configuration, as one line.
std::string describe(const cublasLtMatmulAlgo_t& algo) {
  int id = 0, tile = 0, stages = 0, splitk = 0, cluster = 0;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster, sizeof(cluster),
                                       &written);
  char text[128];
  std::snprintf(text, sizeof text, "algo %d tile %d stages %d splitk %d cluster %d", id, tile, stages, splitk, cluster);
  return text;
}

// body(index, heuristic result) for each algorithm cuBLASLt's heuristic offers (at most `wanted`)
// for the product described by desc and the three layouts (C and D alike); destroys all four after.
template <class F>
void for_each_lt_algorithm(cublasLtHandle_t lt, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                           cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, size_t workspace_bytes, int wanted,
                           F&& body) {
  cublasLtMatmulPreference_t pref;
  CHECK_BLAS(cublasLtMatmulPreferenceCreate(&pref));
  CHECK_BLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                                  sizeof(workspace_bytes)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(wanted);
  int found = 0;
  CHECK_BLAS(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, wanted, results.data(), &found));
  for (int i = 0; i < found; ++i) body(i, results[i]);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
}

// LoRA's dB = s · dyᵀ · xa (fp32 [out, r], added to), a skinny product bound by its read of dy
// [M, out]: cublasGemmEx's default and each cuBLASLt algorithm, in GB/s of dy and xa read.
void probe_lora_db(long M, double seconds, int wanted, cublasHandle_t blas, cublasLtHandle_t lt, void* workspace,
                   size_t workspace_bytes, cudaStream_t stream) {
  const long r = 64;
  for (long out : {4096L, 11008L}) {
    __nv_bfloat16 *dy, *xa;
    float* dB;
    CHECK_CUDA(cudaMalloc(&dy, M * out * 2));
    CHECK_CUDA(cudaMalloc(&xa, M * r * 2));
    CHECK_CUDA(cudaMalloc(&dB, out * r * 4));
    bench::fill<<<1024, 256, 0, stream>>>(dy, M * out, 4);
    bench::fill<<<1024, 256, 0, stream>>>(xa, M * r, 5);
    CHECK_CUDA(cudaMemsetAsync(dB, 0, out * r * 4, stream));
    const double bytes = 2.0 * (M * out + M * r);
    const float alpha = 0.25f, beta = 1.0f;
    // Column-major: dBᵀ [r, out] (ld r) = xaᵀ [r, M] (xa row-major, ld r) · dy [M, out] (row-major: [out, M], op T).
    auto gemm_ex = [&] {
      CHECK_BLAS(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_T, (int)r, (int)out, (int)M, &alpha, xa, CUDA_R_16BF, (int)r,
                              dy, CUDA_R_16BF, (int)out, &beta, dB, CUDA_R_32F, (int)r, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    };
    double ms = bench::sustained_ms(gemm_ex, seconds, stream);
    std::printf("dB [%ld, %ld] over M %ld: cublasGemmEx default %.4f ms, %.0f GB/s\n", out, r, M, ms, bytes / ms / 1e6);
    std::fflush(stdout);
    cublasLtMatmulDesc_t desc;
    CHECK_BLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_t = CUBLAS_OP_T;
    CHECK_BLAS(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_t, sizeof(op_t)));
    cublasLtMatrixLayout_t la, lb, lc;
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, r, M, r));
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, out, M, out));
    CHECK_BLAS(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, r, out, r));
    for_each_lt_algorithm(lt, desc, la, lb, lc, workspace_bytes, wanted,
                          [&](int i, const cublasLtMatmulHeuristicResult_t& result) {
                            auto run = [&] {
                              CHECK_BLAS(cublasLtMatmul(lt, desc, &alpha, xa, la, dy, lb, &beta, dB, lc, dB, lc,
                                                        &result.algo, workspace, workspace_bytes, stream));
                            };
                            const double t = bench::sustained_ms(run, seconds, stream);
                            std::printf("  lt #%d (%s): %.4f ms, %.0f GB/s\n", i, describe(result.algo).c_str(), t,
                                        bytes / t / 1e6);
                            std::fflush(stdout);
                          });
    CHECK_CUDA(cudaFree(dy));
    CHECK_CUDA(cudaFree(xa));
    CHECK_CUDA(cudaFree(dB));
  }
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
  // "wide": the input gradients with the folded adapters' columns of W_cat (N = in + K_j), for
  // d(xa) computed inside the base GEMM, beside the plain ones (slower in the step: stop 51,
  // docs/architecture.md).
  const std::vector<Shape> wide = {
      {"q dx", M, 4096, 4096, false, 0.0f},        {"q dx wide", M, 4096 + 64, 4096, false, 0.0f},
      {"k dx wide (+=)", M, 4096 + 128, 4096, false, 1.0f}, {"v dx wide (+=)", M, 4096 + 192, 4096, false, 1.0f},
      {"gate dx", M, 4096, 11008, false, 0.0f},    {"gate dx wide", M, 4096 + 64, 11008, false, 0.0f},
      {"up dx wide (+=)", M, 4096 + 128, 11008, false, 1.0f}, {"down dx wide", M, 11008 + 64, 4096, false, 0.0f},
  };
  const std::string mode = argc > 4 ? argv[4] : "";
  if (mode != "" && mode != "wide" && mode != "db") {
    std::fprintf(stderr, "gemm_algos: the mode is wide or db, not %s\n", mode.c_str());
    return 2;
  }
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

  if (mode == "db") {
    probe_lora_db(M, seconds, wanted, blas, lt, workspace, workspace_bytes, stream);
    return 0;
  }
  for (const Shape& s : mode == "wide" ? wide : shapes) {
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
    for_each_lt_algorithm(lt, desc, la, lb, lc, workspace_bytes, wanted,
                          [&](int i, const cublasLtMatmulHeuristicResult_t& result) {
                            auto run = [&] {
                              CHECK_BLAS(cublasLtMatmul(lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc,
                                                        &result.algo, workspace, workspace_bytes, stream));
                            };
                            std::printf("  lt #%d (%s, waves %.2f): %.1f TFLOP/s\n", i, describe(result.algo).c_str(),
                                        result.wavesCount, sustained_tflops(run, flops, seconds, stream));
                            std::fflush(stdout);
                          });
    CHECK_CUDA(cudaFree(A));
    CHECK_CUDA(cudaFree(B));
    CHECK_CUDA(cudaFree(C));
  }
  return 0;
}
