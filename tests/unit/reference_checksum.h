// The checksum the reference scripts (tests/reference/hqq_reference.py and nf4_reference.py) record
// for each array: what the HQQ and NF4 reference tests compare fsdpq's bytes with.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kernels/splitmix64.h"

namespace fsdpq::test {

// The scripts' checksum(): the sum of mix64(word_j + j * golden) modulo 2^64 over the bytes'
// little-endian 8-byte words (the last zero padded), as 16 hex digits.
inline std::string reference_checksum(const void* data, size_t bytes) {
  std::vector<uint8_t> padded(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + bytes);
  padded.resize((bytes + 7) / 8 * 8, 0);
  uint64_t total = 0;
  for (size_t j = 0; j < padded.size() / 8; ++j) {
    uint64_t word;
    std::memcpy(&word, padded.data() + 8 * j, 8);
    total += mix64(word + static_cast<uint64_t>(j) * kGolden64);
  }
  return fmt::format("{:016x}", total);
}

}  // namespace fsdpq::test
