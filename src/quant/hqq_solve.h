// HQQ's solver over many groups at once (quant/hqq.h has one group's pieces): on the GPU when this
// process drives one (cuda_init has run) and the solver is the float16 one, else on the CPU's cores.
// Both give the same bits (kernels/hqq_solver.h states the computation once for both;
// tests/gpu/hqq_gpu_test.cpp compares them), so where a weight is quantised never changes its bytes.
// The GPU turns the HQQ model load from tens of minutes of CPU time (a 7B model's 6.5 G values, 20
// iterations each) into seconds; hqq_solver_work() tells how long the solver took.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "quant/hqq.h"

namespace fsdpq {

enum class HqqSolverDevice { kAuto, kCpu, kGpu };

struct HqqSolved {
  std::vector<HqqGroup> groups;  // one per group: the solver's scale and zero point
  // With block errors asked for: kHqqSolverIterations sums per block of kHqqBlockGroups consecutive
  // groups of the request (the last block may be shorter), [block * 20 + i] = the sum in group order
  // of each group's error before update i (0 past `updates`).
  std::vector<double> block_errors;
};

// Writes group g's 64 values as fp32 to `out`, for g in [0, count) of a request; called from several
// threads at once. The solver reads its groups through it as it goes (the CPU into each thread's
// own 64 floats, the GPU into its page-locked chunk), so a caller whose values are elsewhere or in
// another dtype makes no fp32 copy of a whole weight first: at 7B, making those copies on the host
// took longer than the GPU's solving (issue #25).
using HqqGroupReader = std::function<void(int64_t g, float* out)>;

// Solves `count` groups: each group's start (hqq_group_start) and `updates` proximal updates
// (hqq_solve_group). kAuto takes the GPU where it can (see above) unless FSDPQ_HQQ_SOLVER says cpu
// or gpu; kGpu insists on the GPU (an error without one).
HqqSolved hqq_solve_groups(const HqqGroupReader& read, int64_t count, int n_bits, int updates,
                           HqqSolverPrecision precision, bool block_errors,
                           HqqSolverDevice device = HqqSolverDevice::kAuto);
// The same for groups whose values lie one after another in `values` (count * 64 floats).
HqqSolved hqq_solve_groups(const float* values, int64_t count, int n_bits, int updates, HqqSolverPrecision precision,
                           bool block_errors, HqqSolverDevice device = HqqSolverDevice::kAuto);

// The solver's work in this process so far, for the load's report.
struct HqqSolverWork {
  int64_t groups = 0;       // groups solved (a group solved twice counts twice)
  double seconds = 0.0;     // wall time in hqq_solve_groups, reading the values and copies included
  int64_t gpu_groups = 0;   // of those, solved on the GPU
};
HqqSolverWork hqq_solver_work();

}  // namespace fsdpq
