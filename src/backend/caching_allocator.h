// A caching allocator for device memory (PyTorch's CUDACachingAllocator idea, much smaller):
// freed blocks are kept and reused for later requests of a similar size, so the training loop,
// which allocates the same activation and gradient shapes every step, stops calling cudaMalloc
// (slow and synchronising) after its first step. The raw allocator is injected, so the policy is
// tested on the CPU with a fake device.
//
// Sizes are rounded up to 512 B (≤ 1 MiB) or 2 MiB granules. A request takes the smallest cached
// block of at least its rounded size and at most 2× (+1 granule) of it — big enough not to miss,
// small enough not to waste. When the raw allocator fails, the cache is released and the request
// retried once; a second failure throws DeviceOutOfMemory with the numbers a user needs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "util/error.h"

namespace fsdpq {

struct MemoryStats {
  int64_t allocated = 0;       // bytes held by live tensors (rounded sizes)
  int64_t reserved = 0;        // bytes obtained from the device (live + cached)
  int64_t peak_allocated = 0;  // since construction or reset_peaks()
  int64_t peak_reserved = 0;
  int64_t device_allocations = 0;  // raw allocations made (cache misses)
  int64_t cache_hits = 0;
};

// "allocated 1.20 GiB (peak 3.40 GiB), reserved 4.00 GiB (peak 4.00 GiB)", like fsdp_qlora's memory lines.
std::string format_memory_stats(const MemoryStats& stats);

// A user error (exit code 2, no "internal error"): the message says what to change.
class DeviceOutOfMemory : public UserError {
 public:
  using UserError::UserError;
};

class CachingAllocator {
 public:
  // raw_allocate returns nullptr when the device is out of memory.
  using RawAllocate = std::function<void*(size_t bytes)>;
  using RawRelease = std::function<void(void* pointer)>;
  CachingAllocator(RawAllocate raw_allocate, RawRelease raw_release, std::string device_name);
  ~CachingAllocator();  // returns every cached block; live blocks are the owners' to free
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t bytes);
  void release(void* pointer);
  // Returns the cached (free) blocks to the device.
  void empty_cache();
  MemoryStats stats() const;
  void reset_peaks();

  static size_t rounded_size(size_t bytes);

 private:
  void release_cache_locked();

  RawAllocate raw_allocate_;
  RawRelease raw_release_;
  std::string device_name_;
  mutable std::mutex mutex_;
  std::multimap<size_t, void*> free_blocks_;     // size → block
  std::unordered_map<void*, size_t> live_sizes_;  // block → size
  MemoryStats stats_;
};

}  // namespace fsdpq
