#include "backend/caching_allocator.h"

#include <fmt/format.h>

#include <algorithm>

#include "util/strings.h"

namespace fsdpq {
namespace {

constexpr size_t kSmallGranule = 512;
constexpr size_t kSmallLimit = size_t{1} << 20;
constexpr size_t kLargeGranule = size_t{2} << 20;

std::string gib(int64_t bytes) { return human_bytes(static_cast<double>(bytes)); }

}  // namespace

std::string format_memory_stats(const MemoryStats& s) {
  return fmt::format("allocated {} (peak {}), reserved {} (peak {})", gib(s.allocated), gib(s.peak_allocated),
                     gib(s.reserved), gib(s.peak_reserved));
}

size_t CachingAllocator::rounded_size(size_t bytes) {
  if (bytes == 0) bytes = 1;
  const size_t granule = bytes <= kSmallLimit ? kSmallGranule : kLargeGranule;
  return (bytes + granule - 1) / granule * granule;
}

CachingAllocator::CachingAllocator(RawAllocate raw_allocate, RawRelease raw_release, std::string device_name)
    : raw_allocate_(std::move(raw_allocate)), raw_release_(std::move(raw_release)), device_name_(std::move(device_name)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  release_cache_locked();
}

void* CachingAllocator::allocate(size_t bytes) {
  const size_t size = rounded_size(bytes);
  const size_t granule = size <= kSmallLimit ? kSmallGranule : kLargeGranule;
  std::lock_guard lock(mutex_);
  auto fit = free_blocks_.lower_bound(size);
  if (fit != free_blocks_.end() && fit->first <= 2 * size + granule) {
    void* block = fit->second;
    const size_t block_size = fit->first;
    free_blocks_.erase(fit);
    live_sizes_[block] = block_size;
    stats_.allocated += static_cast<int64_t>(block_size);
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    ++stats_.cache_hits;
    return block;
  }
  void* block = raw_allocate_(size);
  if (block == nullptr) {
    // Cached blocks of the wrong sizes may be what stands in the way.
    release_cache_locked();
    block = raw_allocate_(size);
  }
  if (block == nullptr)
    throw DeviceOutOfMemory(fmt::format(
        "{} out of memory allocating {}: {}. Lower batch_size or context_length, turn on "
        "use_gradient_checkpointing or use_cpu_offload, or use more GPUs (fsdpq plan estimates what fits)",
        device_name_, gib(static_cast<int64_t>(size)), format_memory_stats(stats_)));
  live_sizes_[block] = size;
  stats_.allocated += static_cast<int64_t>(size);
  stats_.reserved += static_cast<int64_t>(size);
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
  ++stats_.device_allocations;
  return block;
}

void CachingAllocator::release(void* pointer) {
  if (pointer == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_sizes_.find(pointer);
  if (it == live_sizes_.end()) throw std::logic_error("CachingAllocator::release: pointer was not allocated here");
  stats_.allocated -= static_cast<int64_t>(it->second);
  free_blocks_.emplace(it->second, pointer);
  live_sizes_.erase(it);
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  release_cache_locked();
}

void CachingAllocator::release_cache_locked() {
  for (auto& [size, block] : free_blocks_) {
    raw_release_(block);
    stats_.reserved -= static_cast<int64_t>(size);
  }
  free_blocks_.clear();
}

MemoryStats CachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peaks() {
  std::lock_guard lock(mutex_);
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
}

}  // namespace fsdpq
