#include "train/exact_sum.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

namespace fsdpq {

namespace {
constexpr int kFractionBits = 32;
constexpr double kLimit = 2147483648.0;  // 2^31: |sum| below it fits int64 in units of 2^-32
}  // namespace

void ExactSum::add(double term) {
  if (!std::isfinite(term)) {
    ++state_[1];
    return;
  }
  if (!(std::fabs(term) < kLimit))
    throw std::overflow_error(fmt::format("ExactSum: a term of {} is beyond the ±2^31 it sums exactly", term));
  state_[0] += std::llround(std::ldexp(term, kFractionBits));
}

double ExactSum::value() const {
  if (state_[1] != 0) return std::nan("");
  return std::ldexp(static_cast<double>(state_[0]), -kFractionBits);
}

}  // namespace fsdpq
