#include "kernels/embedding.cuh"

#include <stdexcept>
#include <string>

namespace fsdpq::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kColumnThreads = 64;  // small blocks: the backward's parallelism is the column count
constexpr int32_t kNoBadId = 0x7f7f7f7f;  // what a 0x7f byte memset leaves; above any position we flag

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(err));
  }
}

// atomicMin on an int (not a float reduction): the smallest bad position wins, whatever the order.
__global__ void find_bad_id_kernel(const int32_t* ids, int64_t n, int64_t vocab, int32_t* flag) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t id = ids[i];
    if (id < 0 || id >= vocab) atomicMin(flag, static_cast<int32_t>(i));
  }
}

// One block per token row, threads across the columns (coalesced).
template <class TT, class OT>
__global__ void embedding_forward_kernel(OT* out, const int32_t* ids, const TT* table, int64_t C) {
  const int64_t n = blockIdx.x;
  const TT* row = table + static_cast<int64_t>(ids[n]) * C;
  OT* out_row = out + n * C;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) out_row[c] = from_float<OT>(to_float(row[c]));
}

// Thread c owns column c and adds the tokens in order. The loads of four tokens are issued before
// their read-modify-writes (a repeated id makes the writes depend on each other, not the loads).
template <class GT>
__global__ void embedding_backward_kernel(float* __restrict__ grad, const int32_t* __restrict__ ids,
                                          const GT* __restrict__ dout, int64_t N, int64_t C) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  int64_t n = 0;
  for (; n + 4 <= N; n += 4) {
    int32_t id[4];
    float v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      id[k] = ids[n + k];
      v[k] = to_float(dout[(n + k) * C + c]);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      float* g = grad + static_cast<int64_t>(id[k]) * C + c;
      *g = __fadd_rn(*g, v[k]);
    }
  }
  for (; n < N; ++n) {
    float* g = grad + static_cast<int64_t>(ids[n]) * C + c;
    *g = __fadd_rn(*g, to_float(dout[n * C + c]));
  }
}

}  // namespace

int64_t embedding_first_bad_id(const int32_t* ids, int64_t n, int64_t vocab, int32_t* flag, int32_t* bad_id,
                               cudaStream_t stream) {
  if (n <= 0) return -1;
  if (n >= kNoBadId) throw std::logic_error("embedding: too many ids for the bad-id flag");
  check(cudaMemsetAsync(flag, 0x7f, sizeof(int32_t), stream), "embedding flag memset");
  find_bad_id_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(ids, n, vocab, flag);
  check_launch("embedding_find_bad_id");
  int32_t position = kNoBadId;
  check(cudaMemcpyAsync(&position, flag, sizeof(int32_t), cudaMemcpyDeviceToHost, stream), "embedding flag copy");
  check(cudaStreamSynchronize(stream), "embedding flag synchronize");
  if (position == kNoBadId) return -1;
  check(cudaMemcpyAsync(bad_id, ids + position, sizeof(int32_t), cudaMemcpyDeviceToHost, stream), "embedding id copy");
  check(cudaStreamSynchronize(stream), "embedding id synchronize");
  return position;
}

void embedding_forward(void* out, KType out_type, const int32_t* ids, const void* table, KType table_type, int64_t N,
                       int64_t C, cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  if (N > 0x7fffffff) throw std::logic_error("embedding_forward: too many tokens for one grid");
  with_ktype(table_type, [&](auto t_tag) {
    with_ktype(out_type, [&](auto o_tag) {
      using TT = decltype(t_tag);
      using OT = decltype(o_tag);
      embedding_forward_kernel<TT, OT><<<static_cast<unsigned>(N), C >= 1024 ? 256 : 128, 0, stream>>>(
          static_cast<OT*>(out), ids, static_cast<const TT*>(table), C);
    });
  });
  check_launch("embedding_forward");
}

void embedding_backward(float* dtable, const int32_t* ids, const void* dout, KType dout_type, int64_t N, int64_t C,
                        cudaStream_t stream) {
  if (N <= 0 || C <= 0) return;
  const unsigned blocks = static_cast<unsigned>((C + kColumnThreads - 1) / kColumnThreads);
  with_ktype(dout_type, [&](auto tag) {
    using GT = decltype(tag);
    embedding_backward_kernel<GT><<<blocks, kColumnThreads, 0, stream>>>(dtable, ids, static_cast<const GT*>(dout), N, C);
  });
  check_launch("embedding_backward");
}

}  // namespace fsdpq::cuda
