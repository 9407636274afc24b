// A sum of doubles whose bits do not depend on the order of its terms: each term is rounded to a
// multiple of 2^-32 and added as a 64-bit count of those units, which is exact and associative for
// sums below 2^31. The evaluation loss sums its batches with it, so that it has the same bits at
// any world size (batches go round-robin over the ranks) and after resuming onto another one.
// A term that is not finite makes the sum NaN, as adding it in double would (up to its sign).
#pragma once
#include <cstdint>

namespace fsdpq {

class ExactSum {
 public:
  void add(double term);
  // The sum, rounded once to double; NaN when a term was not finite.
  double value() const;
  // The state, two int64 values to all-reduce with ReduceOp::Sum: the units, the non-finite terms.
  int64_t* data() { return state_; }
  static constexpr int kValues = 2;

 private:
  int64_t state_[kValues] = {0, 0};
};

}  // namespace fsdpq
