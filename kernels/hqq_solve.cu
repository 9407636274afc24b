#include <mutex>
#include <stdexcept>

#include "kernels/hqq_solve.cuh"
#include "kernels/hqq_solver.h"

namespace fsdpq::cuda {
namespace {

constexpr int kPowers = 0x7c01;  // every finite non-negative half, and +inf
__device__ float shrink_powers[kPowers];

// The half solver's arithmetic (kernels/hqq_solver.h): each operation in fp32, rounded to half to
// nearest even; the shrink power from the same table the CPU uses; torch.round is rintf.
struct HalfArithmetic {
  __device__ float round(float x) const { return __half2float(__float2half_rn(x)); }
  __device__ float shrink_power(float a) const {  // a: a non-negative half value, inf or NaN
    const unsigned bits = __half_as_ushort(__float2half_rn(a));
    return shrink_powers[bits < 0x7c00u ? bits : 0x7c00u];
  }
  __device__ float nearest_even(float v) const { return rintf(v); }
};

constexpr int kIterations = hqq_math::kSolverIterations;
constexpr int kThreads = static_cast<int>(kHqqSolveBlockGroups);  // a thread per group, a CUDA block per statistics block

__global__ void __launch_bounds__(kThreads)
    hqq_solve_kernel(const float* __restrict__ values, int64_t groups, int n_bits, int updates,
                     float* __restrict__ scales, float* __restrict__ zeros, double* __restrict__ block_errors) {
  __shared__ double errors[kIterations][kThreads];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kThreads, g = first + threadIdx.x;
  double mine[kIterations] = {};
  if (g < groups) {
    float v[hqq_math::kGroupSize];
    const float4* source = reinterpret_cast<const float4*>(values + g * hqq_math::kGroupSize);
    for (int j = 0; j < hqq_math::kGroupSize / 4; ++j) {
      const float4 q = source[j];
      v[4 * j] = q.x, v[4 * j + 1] = q.y, v[4 * j + 2] = q.z, v[4 * j + 3] = q.w;
    }
    const HalfArithmetic arithmetic;
    const hqq_math::Start solved = hqq_math::solve_group(v, hqq_math::group_start(v, n_bits, arithmetic), n_bits,
                                                         updates, arithmetic, block_errors ? mine : nullptr);
    scales[g] = solved.scale;
    zeros[g] = solved.zero;
  }
  if (block_errors == nullptr) return;
  for (int i = 0; i < kIterations; ++i) errors[i][threadIdx.x] = mine[i];
  __syncthreads();
  if (threadIdx.x < kIterations) {
    const int64_t count = groups - first < kThreads ? groups - first : kThreads;
    double sum = 0.0;  // in group order, as the CPU adds each group's errors to its block's
    for (int64_t k = 0; k < count; ++k) sum += errors[threadIdx.x][k];
    block_errors[blockIdx.x * static_cast<int64_t>(kIterations) + threadIdx.x] = sum;
  }
}

void upload_shrink_powers(const float* host) {
  static std::mutex mutex;
  static int uploaded_to = -1;  // the device the table was copied to
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) throw std::runtime_error("cuda::hqq_solve: no current CUDA device");
  const std::lock_guard<std::mutex> lock(mutex);
  if (uploaded_to == device) return;
  if (cudaMemcpyToSymbol(shrink_powers, host, sizeof(float) * kPowers) != cudaSuccess)
    throw std::runtime_error("cuda::hqq_solve: copying the shrink-power table to the GPU failed");
  uploaded_to = device;
}

}  // namespace

void hqq_solve(const float* values, int64_t groups, int n_bits, int updates, const float* host_shrink_powers,
               float* scales, float* zeros, double* block_errors, cudaStream_t stream) {
  if (groups == 0) return;
  if (values == nullptr || scales == nullptr || zeros == nullptr || host_shrink_powers == nullptr)
    throw std::logic_error("cuda::hqq_solve: a null operand");
  if (updates < 0 || updates > kIterations)
    throw std::logic_error("cuda::hqq_solve: updates must lie in [0, 20]");
  if (reinterpret_cast<uintptr_t>(values) % 16 != 0) throw std::logic_error("cuda::hqq_solve: values not 16-byte aligned");
  upload_shrink_powers(host_shrink_powers);
  const auto blocks = static_cast<unsigned>((groups + kThreads - 1) / kThreads);
  hqq_solve_kernel<<<blocks, kThreads, 0, stream>>>(values, groups, n_bits, updates, scales, zeros, block_errors);
  check_launch("hqq_solve");
}

}  // namespace fsdpq::cuda
