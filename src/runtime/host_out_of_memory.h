// Host memory running out, as a user error (exit 2) rather than an internal one: how much was
// asked for, for what, while doing what, what the host has left and what to change.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include "util/error.h"

namespace fsdpq {

// Names what this thread allocates for until it goes ("loading the model"): the innermost one
// alive is what an out-of-memory message says the run was doing.
class HostMemoryPurpose {
 public:
  explicit HostMemoryPurpose(std::string what);
  ~HostMemoryPurpose();
  HostMemoryPurpose(const HostMemoryPurpose&) = delete;
  HostMemoryPurpose& operator=(const HostMemoryPurpose&) = delete;
};

// A user error (exit code 2), as the GPU's DeviceOutOfMemory is (backend/caching_allocator.h).
class HostOutOfMemory : public UserError {
 public:
  using UserError::UserError;
};

// "host out of memory allocating 12.00 GiB for a host tensor BF16[…] on CPU while loading the model:
// available to this process …. Lower batch_size or context_length, …".
std::string out_of_host_memory_message(size_t bytes, std::string_view what);
// The same for a bare std::bad_alloc, whose size and purpose are unknown.
std::string out_of_host_memory_message();

// Throws HostOutOfMemory with out_of_host_memory_message(bytes, what).
[[noreturn]] void fail_host_allocation(size_t bytes, std::string_view what);

}  // namespace fsdpq
