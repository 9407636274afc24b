// splitmix64's finalizer and increment, the one definition of each. mix64 is a bijection of 64-bit
// words with full avalanche; kGolden64 (2^64 / φ) is splitmix64's step. Every hash that turns a key
// and a counter into random-looking bits uses them: the LoRA dropout mask (host and GPU), LoRA
// init, the per-step dropout keys, the checkpoint checksum and the file digest. Plain C++17, for
// host and device code alike.
#pragma once
#include <cstdint>

#include "kernels/host_device.h"

namespace fsdpq {

inline constexpr uint64_t kGolden64 = 0x9E3779B97F4A7C15ull;

FSDPQ_HOST_DEVICE_INLINE constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace fsdpq
