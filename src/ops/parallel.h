// When an op's loop is worth splitting over OpenMP threads. Small calls run on the calling
// thread: a parallel region costs microseconds on an idle machine and whole scheduler time
// slices on an oversubscribed one (shared CI cores), far more than tiny loops take.
#pragma once
#include <cstdint>

namespace fsdpq {

// `work` is roughly the number of scalar operations the loop does.
inline bool worth_parallel(int64_t work) { return work >= (int64_t{1} << 16); }

}  // namespace fsdpq
