// The caching allocator's policy on a fake device (a byte budget), so it is tested without a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

#include "backend/caching_allocator.h"

namespace fsdpq {
namespace {

// A device with `capacity` bytes: allocations beyond it fail (return nullptr), as cudaMalloc does.
struct FakeDevice {
  size_t capacity, used = 0;
  int allocations = 0, releases = 0;
  std::set<void*> live;
  std::unordered_map<void*, size_t> sizes;

  CachingAllocator allocator() {
    return CachingAllocator(
        [this](size_t bytes) -> void* {
          if (used + bytes > capacity) return nullptr;
          void* p = std::malloc(bytes);
          used += bytes;
          sizes[p] = bytes;
          live.insert(p);
          ++allocations;
          return p;
        },
        [this](void* p) {
          used -= sizes.at(p);
          live.erase(p);
          ++releases;
          std::free(p);
        },
        "fake GPU");
  }
};

TEST(CachingAllocator, RoundsToGranules) {
  EXPECT_EQ(CachingAllocator::rounded_size(0), 512u);
  EXPECT_EQ(CachingAllocator::rounded_size(1), 512u);
  EXPECT_EQ(CachingAllocator::rounded_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::rounded_size(1 << 20), size_t{1} << 20);
  EXPECT_EQ(CachingAllocator::rounded_size((1 << 20) + 1), size_t{2} << 20);
  EXPECT_EQ(CachingAllocator::rounded_size((size_t{5} << 20) + 7), size_t{6} << 20);
}

TEST(CachingAllocator, ReusesFreedBlocksOfSimilarSizeAndCountsBytes) {
  FakeDevice device{size_t{64} << 20};
  CachingAllocator a = device.allocator();
  void* p = a.allocate(3000);  // 3072 B
  EXPECT_EQ(a.stats().allocated, 3072);
  a.release(p);
  EXPECT_EQ(a.stats().allocated, 0);
  EXPECT_EQ(a.stats().reserved, 3072);
  void* q = a.allocate(2900);  // the same rounded size: the cached block comes back
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.stats().cache_hits, 1);
  EXPECT_EQ(device.allocations, 1);
  a.release(q);
  void* tiny = a.allocate(100);  // far smaller than the cached 3 KiB block (> 2x + granule): a new one
  EXPECT_NE(tiny, p);
  EXPECT_EQ(device.allocations, 2);
  a.release(tiny);
  const MemoryStats s = a.stats();
  EXPECT_EQ(s.peak_allocated, 3072);
  EXPECT_EQ(s.reserved, 3072 + 512);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved, 0);
  EXPECT_TRUE(device.live.empty());
}

TEST(CachingAllocator, ReleasesTheCacheAndRetriesBeforeGivingUp) {
  FakeDevice device{size_t{8} << 20};
  CachingAllocator a = device.allocator();
  void* p = a.allocate(size_t{6} << 20);
  a.release(p);
  void* q = a.allocate((size_t{3} << 20) + 1);  // rounds to 4 MiB: reuses the cached 6 MiB block (≤ 2x + granule)
  EXPECT_EQ(q, p);
  a.release(q);
  void* small = a.allocate(size_t{1} << 20);  // 1 MiB: 6 MiB is too big to hand out; the device has 2 MiB left
  a.release(small);
  void* big = a.allocate(size_t{7} << 20);  // 8 MiB rounded: fits only once the cached 7 MiB go back
  EXPECT_EQ(device.used, size_t{8} << 20);
  EXPECT_EQ(a.stats().reserved, int64_t{8} << 20);
  try {
    a.allocate(size_t{2} << 20);
    FAIL() << "expected DeviceOutOfMemory";
  } catch (const UserError& e) {  // DeviceOutOfMemory: reported as the user's to fix, exit code 2
    EXPECT_NE(dynamic_cast<const DeviceOutOfMemory*>(&e), nullptr);
    const std::string what = e.what();
    EXPECT_NE(what.find("fake GPU out of memory allocating 2.00 MiB: allocated 8.00 MiB"), std::string::npos) << what;
  }
  a.release(big);
}

TEST(CachingAllocator, RejectsForeignPointersAndFormatsStats) {
  FakeDevice device{size_t{1} << 20};
  CachingAllocator a = device.allocator();
  int x = 0;
  EXPECT_THROW(a.release(&x), std::logic_error);
  MemoryStats s;
  s.allocated = int64_t{3} << 29;  // 1.5 GiB
  s.peak_allocated = int64_t{2} << 30;
  s.reserved = int64_t{4} << 30;
  s.peak_reserved = int64_t{4} << 30;
  EXPECT_EQ(format_memory_stats(s), "allocated 1.50 GiB (peak 2.00 GiB), reserved 4.00 GiB (peak 4.00 GiB)");
}

}  // namespace
}  // namespace fsdpq
