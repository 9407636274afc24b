#include "kernels/rows.cuh"

#include <stdexcept>

namespace fsdpq::cuda {
namespace {

constexpr int kThreads = 256;

// One block per copied row, its threads across the row in units of U (16 bytes where both bases
// and the row length allow, else 4 or 2): coalesced loads and stores, nothing converted.
template <class U>
__global__ void copy_rows_kernel(char* __restrict__ dst, const int32_t* __restrict__ dst_rows,
                                 const char* __restrict__ src, const int32_t* __restrict__ src_rows,
                                 int64_t units) {
  const int64_t j = blockIdx.x;
  const int64_t d = dst_rows ? dst_rows[j] : j, s = src_rows ? src_rows[j] : j;
  U* out = reinterpret_cast<U*>(dst) + d * units;
  const U* in = reinterpret_cast<const U*>(src) + s * units;
  for (int64_t i = threadIdx.x; i < units; i += blockDim.x) out[i] = in[i];
}

bool aligned(const void* p, int64_t row_bytes, int64_t unit) {
  return reinterpret_cast<uintptr_t>(p) % unit == 0 && row_bytes % unit == 0;
}

}  // namespace

void copy_rows(void* dst, const int32_t* dst_rows, const void* src, const int32_t* src_rows, int64_t R,
               int64_t row_bytes, cudaStream_t stream) {
  if (R <= 0 || row_bytes <= 0) return;
  if (R > 0x7fffffff) throw std::logic_error("copy_rows: too many rows for one grid");
  if (row_bytes % 2 != 0) throw std::logic_error("copy_rows: rows must be whole 16-bit elements");
  auto launch = [&](auto unit_tag) {
    using U = decltype(unit_tag);
    copy_rows_kernel<U><<<static_cast<unsigned>(R), kThreads, 0, stream>>>(
        static_cast<char*>(dst), dst_rows, static_cast<const char*>(src), src_rows,
        row_bytes / static_cast<int64_t>(sizeof(U)));
  };
  if (aligned(dst, row_bytes, 16) && aligned(src, row_bytes, 16)) launch(uint4{});
  else if (aligned(dst, row_bytes, 4) && aligned(src, row_bytes, 4)) launch(uint32_t{});
  else launch(uint16_t{});
  check_launch("copy_rows");
}

}  // namespace fsdpq::cuda
