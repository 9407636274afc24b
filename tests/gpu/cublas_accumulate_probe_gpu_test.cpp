// Diagnostic (FSDPQ_GPU_PERF=1): which cuBLAS configurations of the accumulating GEMM into a bf16
// output, C = A·B + C, keep a sub-ulp C as one rounding of the exact sum does. The layer adds the
// LoRA adapters' products to the base GEMM's through C (model/llama_layer.cpp), and
// GpuOpsMatmul.AccumulatingIntoBf16KeepsASubUlpAddendAsTheCpuDoes measured cuBLAS's default
// GemmEx dropping it (stop 37: kept 0.000 against the CPU's 1.033). Each configuration prints the
// kept share (1: rounded once; 0: the product rounded before C is added), at the test's small shape
// and at the 7B layer's, so the GEMM that keeps it (if any) can replace the default.
#include <cublasLt.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "backend/cuda_backend.h"
#include "gpu/op_parity.h"

namespace fsdpq {
namespace {

// cuBLASLt's entry points, loaded as the backend loads cuBLAS (dlopen: nothing links it).
struct LtApi {
  decltype(&cublasLtCreate) create = nullptr;
  decltype(&cublasLtMatmulDescCreate) desc_create = nullptr;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set = nullptr;
  decltype(&cublasLtMatrixLayoutCreate) layout_create = nullptr;
  decltype(&cublasLtMatmulPreferenceCreate) pref_create = nullptr;
  decltype(&cublasLtMatmulPreferenceSetAttribute) pref_set = nullptr;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic = nullptr;
  decltype(&cublasLtMatmulAlgoConfigGetAttribute) algo_get = nullptr;
  decltype(&cublasLtMatmul) matmul = nullptr;
  bool load() {
    void* lib = nullptr;
    for (const char* name : {"libcublasLt.so.13", "libcublasLt.so", "/usr/local/cuda/lib64/libcublasLt.so.13"})
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    if (lib == nullptr) return false;
    auto get = [&](auto& fn, const char* name) { fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name)); };
    get(create, "cublasLtCreate");
    get(desc_create, "cublasLtMatmulDescCreate");
    get(desc_set, "cublasLtMatmulDescSetAttribute");
    get(layout_create, "cublasLtMatrixLayoutCreate");
    get(pref_create, "cublasLtMatmulPreferenceCreate");
    get(pref_set, "cublasLtMatmulPreferenceSetAttribute");
    get(heuristic, "cublasLtMatmulAlgoGetHeuristic");
    get(algo_get, "cublasLtMatmulAlgoConfigGetAttribute");
    get(matmul, "cublasLtMatmul");
    return create && desc_create && desc_set && layout_create && pref_create && pref_set && heuristic && algo_get &&
           matmul;
  }
};

// out (row-major [M, N], bf16, device) (+)= x [M, K] · W [N, K]ᵀ (both bf16, device), as a variant runs it.
using Accumulate = std::function<void(void* out, const void* x, const void* W, int64_t M, int64_t N, int64_t K,
                                      bool accumulate)>;

// The kept share of a sub-ulp addend (tests/unit/ops_test_support.h) with `run` as the product.
double kept_share(const Accumulate& run, const test::SubUlpCase& c) {
  return test::kept_fraction_of_a_sub_ulp_addend(
      [](const TensorView& v) { return test::on_gpu(v); }, [](const TensorView& v) { return test::values_of(v); },
      [&](TensorView out, const TensorView& x, const TensorView& W, bool accumulate) {
        run(out.data, x.data, W.data, c.M, c.N, c.K, accumulate);
      },
      c);
}

// cublasGemmEx as cublas_gemm.cpp calls it (row-major C = x·Wᵀ is column-major Cᵀ = W·xᵀ), with a
// compute type of choice.
Accumulate gemm_ex(cublasComputeType_t compute) {
  return [compute](void* out, const void* x, const void* W, int64_t M, int64_t N, int64_t K, bool accumulate) {
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cuda::check_cublas(cuda::cublas_api().gemm_ex(cuda::cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N),
                                                  static_cast<int>(M), static_cast<int>(K), &alpha, W, CUDA_R_16BF,
                                                  static_cast<int>(K), x, CUDA_R_16BF, static_cast<int>(K), &beta, out,
                                                  CUDA_R_16BF, static_cast<int>(N), compute, CUBLAS_GEMM_DEFAULT),
                       "probe GemmEx");
  };
}

// gemm_ex(COMPUTE_32F) with CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION on the handle for the
// call, the handle's mode restored after: cuBLAS's documented remedy for reductions into a
// lower-precision output. Measured at stop 38 (H200): it keeps nothing (0.000), at the same speed.
Accumulate gemm_ex_accumulator_type_reduction() {
  return [](void* out, const void* x, const void* W, int64_t M, int64_t N, int64_t K, bool accumulate) {
    const cuda::CublasApi& api = cuda::cublas_api();
    cublasMath_t saved;
    cuda::check_cublas(api.get_math_mode(cuda::cublas(), &saved), "probe GetMathMode");
    cuda::check_cublas(api.set_math_mode(cuda::cublas(), static_cast<cublasMath_t>(
                                                              CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
                       "probe SetMathMode");
    gemm_ex(CUBLAS_COMPUTE_32F)(out, x, W, M, N, K, accumulate);
    cuda::check_cublas(api.set_math_mode(cuda::cublas(), saved), "probe SetMathMode back");
  };
}

// cublasLtMatmul with the heuristic's choice number `pick` under a reduction-scheme mask; D written
// in place (C = D) or into a separate buffer copied back (out of place). `what` gets the algorithm's
// split-K count and reduction scheme.
Accumulate lt_matmul(const LtApi& lt, cublasLtHandle_t handle, int pick, uint32_t reduction_mask, bool in_place,
                     std::string* what) {
  return [&lt, handle, pick, reduction_mask, in_place, what](void* out, const void* x, const void* W, int64_t M,
                                                              int64_t N, int64_t K, bool accumulate) {
    auto ok = [](cublasStatus_t s, const char* step) { cuda::check_cublas(s, step); };
    cublasLtMatmulDesc_t desc;
    ok(lt.desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    ok(lt.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "transa");
    ok(lt.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "transb");
    cublasLtMatrixLayout_t a, b, c;
    ok(lt.layout_create(&a, CUDA_R_16BF, static_cast<uint64_t>(K), static_cast<uint64_t>(N), K), "layout a");
    ok(lt.layout_create(&b, CUDA_R_16BF, static_cast<uint64_t>(K), static_cast<uint64_t>(M), K), "layout b");
    ok(lt.layout_create(&c, CUDA_R_16BF, static_cast<uint64_t>(N), static_cast<uint64_t>(M), N), "layout c");
    cublasLtMatmulPreference_t pref;
    ok(lt.pref_create(&pref), "pref");
    const uint64_t workspace_bytes = 64u << 20;
    ok(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes)), "ws");
    ok(lt.pref_set(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &reduction_mask, sizeof(reduction_mask)), "mask");
    cublasLtMatmulHeuristicResult_t results[8];
    int found = 0;
    ok(lt.heuristic(handle, desc, a, b, c, c, pref, 8, results, &found), "heuristic");
    if (found <= pick) {
      *what = "no such algorithm";
      throw std::runtime_error("probe: the heuristic offered " + std::to_string(found) + " algorithms");
    }
    const cublasLtMatmulAlgo_t& algo = results[pick].algo;
    int32_t splits = 0;
    uint32_t scheme = 0;
    size_t written = 0;
    lt.algo_get(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits), &written);
    lt.algo_get(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme), &written);
    *what = fmt::format("split-K {}, reduction scheme {}", splits, scheme);
    Tensor workspace = Tensor::empty(Shape{static_cast<int64_t>(workspace_bytes)}, DType::BF16, Device::CUDA);
    Tensor separate = in_place ? Tensor() : Tensor::empty(Shape{M, N}, DType::BF16, Device::CUDA);
    void* d = in_place ? out : separate.view().data;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    ok(lt.matmul(handle, desc, &alpha, W, a, x, b, &beta, out, c, d, c, &algo, workspace.view().data, workspace_bytes,
                 cuda::stream()),
       "matmul");
    if (!in_place)
      cuda::check(cudaMemcpyAsync(out, d, static_cast<size_t>(M * N) * 2, cudaMemcpyDeviceToDevice, cuda::stream()),
                  "copy back");
    cuda::check(cudaStreamSynchronize(cuda::stream()), "probe sync");
  };
}

TEST(GpuCublasAccumulateProbe, WhichConfigurationsKeepASubUlpAddend) {
  test::use_gpu();
  if (!test::perf_mode()) GTEST_SKIP() << "FSDPQ_GPU_PERF=1 prints the probe";
  struct ProbeShape {
    const char* name;
    test::SubUlpCase c;  // addend a quarter to an eighth of the sums' bf16 spacing
  };
  const ProbeShape shapes[] = {{"96x160x512", {96, 160, 512, 0.25f}},
                               {"8192x4096x4096", {8192, 4096, 4096, 2.0f}},
                               {"512x4096x4096", {512, 4096, 4096, 2.0f}}};
  auto report = [](const std::string& variant, const ProbeShape& s, const Accumulate& run, const std::string* what) {
    try {
      const double kept = kept_share(run, s.c);
      std::printf("PROBE %-50s %-16s kept %.3f%s\n", variant.c_str(), s.name, kept,
                  what != nullptr ? (" (" + *what + ")").c_str() : "");
    } catch (const std::exception& e) {
      std::printf("PROBE %-50s %-16s failed: %s\n", variant.c_str(), s.name, e.what());
    }
  };
  for (const ProbeShape& s : shapes) {
    report("GemmEx COMPUTE_32F (fsdpq's)", s, gemm_ex(CUBLAS_COMPUTE_32F), nullptr);
    report("GemmEx COMPUTE_32F_PEDANTIC", s, gemm_ex(CUBLAS_COMPUTE_32F_PEDANTIC), nullptr);
    report("GemmEx COMPUTE_32F, DISALLOW_REDUCED_PRECISION_REDUCTION", s, gemm_ex_accumulator_type_reduction(), nullptr);
  }
  LtApi lt;
  if (!lt.load()) {
    std::printf("PROBE cuBLASLt: not loadable here\n");
    return;
  }
  cublasLtHandle_t handle;
  cuda::check_cublas(lt.create(&handle), "cublasLtCreate");
  const uint32_t all = CUBLASLT_REDUCTION_SCHEME_MASK, no_output_type = all & ~CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
  const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
  for (const ProbeShape& s : shapes)
    for (int pick = 0; pick < 4; ++pick)
      for (const auto& [mask, mask_name] : {std::pair{all, "any reduction"}, std::pair{no_output_type, "no output-type reduction"},
                                            std::pair{none, "no split-K reduction"}})
        for (bool in_place : {true, false}) {
          std::string what;
          report(fmt::format("Lt algo {} {} {}", pick, mask_name, in_place ? "C = D" : "C != D"), s,
                 lt_matmul(lt, handle, pick, mask, in_place, &what), &what);
        }
}

// Speed of the in-place accumulate each way at the 7B layer's shapes (q/k/v/o: 4096 out; gate/up:
// 11008; down: K 11008), 8192 tokens: what the settings cost (stop 38, H200: PEDANTIC ~32 TFLOP/s
// against ~780, the math mode nothing).
TEST(GpuCublasAccumulateProbe, Speed) {
  test::use_gpu();
  if (!test::perf_mode()) GTEST_SKIP() << "FSDPQ_GPU_PERF=1 prints the timings";
  const int64_t M = 8192;
  for (const auto& [N, K] : {std::pair<int64_t, int64_t>{4096, 4096}, {11008, 4096}, {4096, 11008}}) {
    const Tensor x = test::on_gpu(test::random_tensor(Shape{M, K}, DType::BF16, 81).view());
    const Tensor W = test::on_gpu(test::random_tensor(Shape{N, K}, DType::BF16, 82).view());
    Tensor y = test::on_gpu(test::random_tensor(Shape{M, N}, DType::BF16, 83).view());
    for (const auto& [run, name] : {std::pair{gemm_ex(CUBLAS_COMPUTE_32F), "COMPUTE_32F"},
                                    std::pair{gemm_ex_accumulator_type_reduction(), "COMPUTE_32F, DISALLOW_REDUCED_PRECISION_REDUCTION"},
                                    std::pair{gemm_ex(CUBLAS_COMPUTE_32F_PEDANTIC), "COMPUTE_32F_PEDANTIC"}})
      test::report_perf(fmt::format("accumulating GemmEx {} {}x{}x{}", name, M, N, K), 0, 2.0 * M * N * K,
                        [&] { run(y.view().data, x.view().data, W.view().data, M, N, K, true); });
  }
}

}  // namespace
}  // namespace fsdpq
