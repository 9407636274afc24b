#include "kernels/hopper/tensor_map.cuh"

#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace fsdpq::cuda::hopper {
namespace {

// cuTensorMapEncodeTiled is a driver API function; the runtime hands out its address, so fsdpq
// links no libcuda (the CPU build and machines without a driver never need it).
PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t err =
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found);
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || p == nullptr)
      throw std::runtime_error("the CUDA driver has no cuTensorMapEncodeTiled (" +
                               std::string(cudaGetErrorString(err)) + ")");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

}  // namespace

namespace {

// A 4-d map of 16-bit elements (dims innermost first, byte strides of dims 1..3) copied in boxes of
// kBoxColumns x `rows`, 128-byte swizzled; `what` names it in the error.
CUtensorMap encode(const void* base, const cuuint64_t (&dims)[4], const cuuint64_t (&strides)[3], int rows,
                   const std::string& what) {
  const cuuint32_t box[4] = {kBoxColumns, static_cast<cuuint32_t>(rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  CUtensorMap map{};
  // The data type only sets the element size here: the copies move bits.
  const CUresult r = encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims, strides,
                               box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("cuTensorMapEncodeTiled refused a " + what + " map with " + std::to_string(rows) +
                             "-row boxes (CUresult " + std::to_string(static_cast<int>(r)) + ")");
  return map;
}

}  // namespace

CUtensorMap head_tensor_map(const void* base, int64_t B, int64_t T, int64_t heads, int64_t D, int rows) {
  constexpr int64_t kElement = 2;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(T),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(B)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(heads * D * kElement), static_cast<cuuint64_t>(D * kElement),
                                 static_cast<cuuint64_t>(T * heads * D * kElement)};
  return encode(base, dims, strides, rows,
                "[" + std::to_string(B) + ", " + std::to_string(T) + ", " + std::to_string(heads) + ", " +
                    std::to_string(D) + "]");
}

CUtensorMap matrix_tensor_map(const void* base, int64_t rows, int64_t cols, int64_t row_stride, int box_rows) {
  constexpr int64_t kElement = 2;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows), 1, 1};
  const cuuint64_t stride = static_cast<cuuint64_t>(row_stride * kElement);
  const cuuint64_t strides[3] = {stride, stride * static_cast<cuuint64_t>(rows), stride * static_cast<cuuint64_t>(rows)};
  return encode(base, dims, strides, box_rows,
                "[" + std::to_string(rows) + ", " + std::to_string(cols) + "] (row stride " +
                    std::to_string(row_stride) + ")");
}

}  // namespace fsdpq::cuda::hopper
