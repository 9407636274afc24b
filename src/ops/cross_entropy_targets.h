// Which label each row of the fused cross entropy scores, and the check that every scored label is
// in the vocabulary: shared by the CPU reference (ops/cross_entropy.cpp) and the CUDA
// implementation (ops/cuda/cross_entropy.cpp), which checks a host copy of the labels.
#pragma once
#include <cstdint>

#include "ops/cross_entropy.h"
#include "util/error.h"

namespace fsdpq {

// The label row t is scored against: labels[b, t + 1], or ignore for the last position.
inline int32_t shifted_target(const int32_t* labels, int64_t row, int64_t T) {
  const int64_t t = row % T;
  return t + 1 < T ? labels[row + 1] : kIgnoreIndex;
}

// Every scored label is in [0, V) or the ignore index (host labels); else a UserError.
inline void check_label_range(const int32_t* label, int64_t rows, int64_t T, int64_t V) {
  for (int64_t row = 0; row < rows; ++row) {
    const int32_t target = shifted_target(label, row, T);
    if (target != kIgnoreIndex && (target < 0 || target >= V))
      fail("label {} at batch {} position {} is outside the vocabulary of {} tokens (and is not the ignore index {})",
           target, row / T, row % T + 1, V, kIgnoreIndex);
  }
}

}  // namespace fsdpq
