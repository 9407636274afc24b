// The NCCL transport on this machine's GPU (a world of one: NCCL allows one rank per GPU, and the
// lent machine has one; the multi-GPU runs are issue #7's): every operation on device buffers,
// host-buffer staging for the scalar helpers, and ordering after work on the input stream.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <vector>

#include "fsdp/nccl_communicator.h"
#include "gpu_test_support.h"

namespace fsdpq {
namespace {

struct MpiOnce {
  MpiOnce() {
    int up = 0;
    MPI_Initialized(&up);
    if (up) return;
    MPI_Init(nullptr, nullptr);
    std::atexit([] { MPI_Finalize(); });
  }
};

TEST(GpuNccl, EveryCollectiveOnOneRank) {
  static MpiOnce mpi;
  ASSERT_TRUE(nccl_available());
  auto c = make_nccl_communicator(MPI_COMM_WORLD, "world", 0);
  ASSERT_EQ(c->size(), 1);
  const size_t n = 4096;
  std::vector<float> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = 0.5f + static_cast<float>(i);
  float *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, n * sizeof(float)), cudaSuccess);
  // Queued on the default stream: the collective must wait for this copy.
  ASSERT_EQ(cudaMemcpyAsync(a, host.data(), n * sizeof(float), cudaMemcpyHostToDevice, nullptr), cudaSuccess);
  c->all_gather(a, b, n * sizeof(float)).wait();
  std::vector<float> back(n, 0);
  cudaMemcpy(back.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost);
  EXPECT_EQ(back, host);
  cudaMemset(b, 0, n * sizeof(float));
  c->reduce_scatter(a, b, n, CommType::F32, ReduceOp::Sum).wait();
  cudaMemcpy(back.data(), b, n * sizeof(float), cudaMemcpyDeviceToHost);
  EXPECT_EQ(back, host);
  c->all_reduce(a, n, CommType::F32, ReduceOp::Max).wait();
  cudaMemcpy(back.data(), a, n * sizeof(float), cudaMemcpyDeviceToHost);
  EXPECT_EQ(back, host);
  EXPECT_DOUBLE_EQ(c->all_reduce_sum(2.5), 2.5);  // a host scalar, staged
  EXPECT_TRUE(c->any(true));
  std::vector<uint8_t> bytes(33, 7);
  c->broadcast(bytes.data(), bytes.size(), 0).wait();
  EXPECT_EQ(bytes, std::vector<uint8_t>(33, 7));
  EXPECT_THROW(c->all_gather(a, b, 100), std::logic_error);
  c->barrier();
  cudaFree(a);
  cudaFree(b);
}

}  // namespace
}  // namespace fsdpq
