// Row selection: copying chosen rows of a matrix into a compact one and back. The loss head runs
// its GEMMs over the rows that score only (model/llama_lm_head.cpp) and puts their gradients back.
// A pure copy (no conversion): src and dst share a dtype, and every value keeps its bits.
#pragma once
#include "backend/tensor.h"

namespace fsdpq {

// out[j, :] = src[rows[j], :] for j < R = rows.numel(). src [N, C], out [R, C] of src's dtype;
// rows: I32 on the operands' device, each in [0, N). The rows are the caller's to build: the CPU
// checks them (a logic_error), the GPU trusts them.
void gather_rows(TensorView out, const TensorView& src, const TensorView& rows);

// dst[rows[j], :] = src[j, :] for j < R = rows.numel(); dst's other rows are left as they are.
// dst [N, C], src [R, C] of dst's dtype; rows distinct, each in [0, N) (checked as above).
void scatter_rows(TensorView dst, const TensorView& rows, const TensorView& src);

}  // namespace fsdpq
