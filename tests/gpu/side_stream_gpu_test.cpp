// Side streams on the GPU (backend/side_stream.h): a block freed by work queued on a side stream
// goes back to the caching allocator's pool (the compute stream's) only once the compute stream
// has joined the side stream after the release, or the side stream has passed it; before that the
// compute stream could be handed memory the side stream still reads.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "backend/cuda_backend.h"
#include "backend/side_stream.h"
#include "gpu/op_parity.h"

namespace fsdpq {
namespace {

constexpr size_t kBytes = 4 << 20;

void* block_of(const Tensor& t) { return t.view().data; }
Tensor new_block() { return Tensor::empty(Shape{static_cast<int64_t>(kBytes)}, DType::U8, Device::CUDA); }

// Holds a side stream at a host function until release() (or, so a failing test cannot hang,
// ten seconds): the releases queued after it cannot have passed meanwhile.
class HeldStream {
 public:
  explicit HeldStream(SideStream& side) {
    const OnSideStream on_side(side);
    cuda::check(cudaLaunchHostFunc(cuda::stream(), &HeldStream::wait, &released_), "launch host function");
    timer_ = std::thread([this] {
      std::unique_lock lock(mutex_);
      woken_.wait_for(lock, std::chrono::seconds(10), [this] { return released_.load(); });
      released_.store(true);
    });
  }
  ~HeldStream() {
    release();
    timer_.join();
  }
  void release() {
    {
      const std::lock_guard lock(mutex_);
      released_.store(true);
    }
    woken_.notify_all();
  }

 private:
  static void wait(void* flag) {
    while (!static_cast<std::atomic<bool>*>(flag)->load()) std::this_thread::yield();
  }
  std::atomic<bool> released_{false};
  std::mutex mutex_;
  std::condition_variable woken_;
  std::thread timer_;
};

// Two blocks of one size the only ones in the pool (other tests' cached blocks returned first, so
// nothing else of that size is handed out); returns them. No device allocation is needed after this
// while a stream is held (cudaMalloc and cudaFree may wait for every stream).
std::pair<void*, void*> two_cached_blocks() {
  cuda_empty_cache();
  Tensor a = new_block(), b = new_block();
  return {block_of(a), block_of(b)};
}

TEST(GpuSideStream, ABlockFreedThereIsReusedOnlyAfterTheComputeStreamJoins) {
  test::use_gpu();
  SideStream side(Device::CUDA);
  const auto [first, second] = two_cached_blocks();
  HeldStream held(side);
  void* freed_there = nullptr;
  {
    const OnSideStream on_side(side);
    Tensor t = new_block();  // the side stream would write it here
    freed_there = block_of(t);
  }
  ASSERT_TRUE(freed_there == first || freed_there == second);
  Tensor other = new_block();
  EXPECT_NE(block_of(other), freed_there) << "handed out while the side stream may still use it";
  side.mark().compute_waits();
  Tensor after_join = new_block();
  EXPECT_EQ(block_of(after_join), freed_there) << "the join did not return it to the pool";
  held.release();
  cuda_synchronize();
}

TEST(GpuSideStream, ABlockFreedThereIsReusedOnceTheSideStreamPassedIt) {
  test::use_gpu();
  SideStream side(Device::CUDA);
  two_cached_blocks();
  void* freed_there = nullptr;
  Tensor other;  // (held, so the pool has no other block of the size)
  {
    HeldStream held(side);
    {
      const OnSideStream on_side(side);
      Tensor t = new_block();
      freed_there = block_of(t);
    }
    other = new_block();
    EXPECT_NE(block_of(other), freed_there);
    held.release();
    side.mark().host_wait();  // passed, but never joined
  }
  Tensor after = new_block();
  EXPECT_EQ(block_of(after), freed_there);
}

}  // namespace
}  // namespace fsdpq
