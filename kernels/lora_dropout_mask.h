// The LoRA dropout mask (its definition is in ops/lora.h): element e of an adapter's input survives
// when the 16-bit field e % 4 of keep_word(mix64(key), e / 4) is at least the threshold
// round(p · 2^16). One hash word decides 4 consecutive elements, so the GPU hashes once per 4
// (docs/ops.md). The CPU op (src/ops/lora.cpp) and the kernels (kernels/lora_dropout.cu) both
// call these, so both devices drop the same elements. Plain C++17, for host and device code.
#pragma once
#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/splitmix64.h"

namespace fsdpq {

// The word that decides elements 4·quad … 4·quad + 3, for mixed_key = mix64(the dropout key).
FSDPQ_HOST_DEVICE_INLINE uint64_t keep_word(uint64_t mixed_key, int64_t quad) {
  return mix64(mixed_key + static_cast<uint64_t>(quad + 1) * kGolden64);
}

// Whether element 4·quad + lane survives, given its quad's word.
FSDPQ_HOST_DEVICE_INLINE bool keeps_lane(uint64_t word, int lane, uint32_t threshold) {
  return static_cast<uint32_t>((word >> (16 * lane)) & 0xFFFFu) >= threshold;
}

}  // namespace fsdpq
