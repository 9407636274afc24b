// How an op picks its device: the ops' one dispatch point. Every op in src/ops checks its
// arguments, then asks runs_on_cuda; when the operands live on the GPU the op hands the call, as it
// came, to its CUDA implementation (ops/cuda_ops.h), else the CPU reference that follows runs:
//
//   if (runs_on_cuda(op, {out, a, b}))
//     if constexpr (kWithCuda) return cuda_ops::residual_add(out, a, b);
//   ... the CPU reference ...
//
// A build without CUDA has no CUDA tensors (Tensor cannot allocate one before cuda_init), so there
// runs_on_cuda never says yes: a CUDA operand met in such a build is its one error. The CUDA
// implementations (src/ops/cuda/) are compiled only with CUDA; `if constexpr` drops their calls
// from other builds (a call in a discarded statement needs no definition), so no op holds an #ifdef.
#pragma once
#include <initializer_list>

#include "backend/tensor.h"

namespace fsdpq {

#ifdef FSDPQ_WITH_CUDA
inline constexpr bool kWithCuda = true;
#else
inline constexpr bool kWithCuda = false;
#endif

// Whether the op runs on the CUDA backend: every operand with data is on CUDA (true) or every one
// is on the CPU (false); a mix is a logic_error naming the op and the operands, and so is a CUDA
// operand in a build without CUDA. Views without data (optional outputs) are ignored.
bool runs_on_cuda(const char* op, std::initializer_list<TensorView> operands);

}  // namespace fsdpq
