// The fused LoRA group products on the GPU (kernels/lora_fused.cuh): which groups they take, their
// scratch, and the launch. ops/lora.cpp derives the mask and holds the CPU reference.
#include "kernels/lora_fused.cuh"
#include "kernels/lora_fused_sm90a.cuh"

#include <atomic>
#include <vector>

#include "ops/cuda/kernel_args.h"
#include "ops/cuda_ops.h"

namespace fsdpq::cuda_ops {
namespace {

static_assert(cuda::kLoraFusedMaxAdapters == static_cast<int>(kMaxLoraGroup));

std::atomic<int64_t> runs{0}, hopper_down_runs{0}, hopper_input_grad_runs{0}, hopper_weight_grad_runs{0};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool is_16bit(DType d) { return d == DType::BF16 || d == DType::F16; }

// The kernels' description of a group, or nullopt-like (count 0) where they do not take it.
cuda::LoraFusedGroup fused_group(const TensorView& x, std::span<const LoraSite> sites, const LoraGroupMask& mask,
                                 std::initializer_list<const TensorView*> also_16bit) {
  cuda::LoraFusedGroup g;
  if (gpu_lora_kernels() != GpuLoraKernels::Fused || !is_16bit(x.dtype) || !aligned16(x.data)) return g;
  for (const TensorView* t : also_16bit)
    if (t->dtype != x.dtype || !aligned16(t->data)) return g;
  const int64_t in = x.shape.last();
  for (size_t i = 0; i < sites.size(); ++i) {
    const TensorView& A = sites[i].A;
    if (A.dtype != x.dtype || !aligned16(A.data) || A.shape[0] > cuda::kLoraFusedMaxRank) return cuda::LoraFusedGroup{};
    g.A[i] = A.data;
    g.rank[i] = static_cast<int>(A.shape[0]);
    g.first[i] = g.total_rank;
    g.mixed_key[i] = mask.mixed_keys[i];
    g.total_rank += g.rank[i];
  }
  g.count = static_cast<int>(sites.size());
  g.threshold = mask.threshold;
  g.keep_scale = mask.keep_scale;
  if (!cuda::lora_fused_supported(ktype("lora", x), in, g)) return cuda::LoraFusedGroup{};
  return g;
}

}  // namespace

bool lora_fused_forward(TensorView xa, const TensorView& x, std::span<const LoraSite> sites, const LoraGroupMask& mask,
                        const MatrixView* x_copy, bool* copied) {
  if (copied != nullptr) *copied = false;
  const cuda::LoraFusedGroup g = fused_group(x, sites, mask, {});
  if (g.count == 0) return false;
  const int64_t M = x.shape.rows(), in = x.shape.last();
  const int64_t floats = lora_fused::down_workspace_floats(M, in, g.total_rank);
  Tensor workspace = floats > 0 ? Tensor::empty(Shape{floats}, DType::F32, Device::CUDA) : Tensor();
  const cuda::KType type = ktype("lora_forward", x), xa_type = ktype("lora_forward", xa);
  float* scratch = floats > 0 ? workspace.data<float>() : nullptr;
  // On Hopper the wgmma kernel takes rank-64 groups of up to 3 (the same split and scratch).
  if (xa_type == type && cuda::lora_down_sm90a_takes(type, in, g) && cuda::lora_fused_sm90a_unavailable().empty()) {
    // It also copies x where asked (lora.h has checked the block's shape) and the block suits the
    // copy engine: x is read once for both.
    const bool copy = x_copy != nullptr && cuda::lora_down_sm90a_copies_to(x_copy->data(), x_copy->row_stride(), in);
    cuda::lora_down_sm90a(xa.data, xa_type, x.data, type, g, M, in, scratch, cuda::stream(),
                          copy ? x_copy->data() : nullptr, copy ? x_copy->row_stride() : 0);
    if (copy) *copied = true;
    ++hopper_down_runs;
  } else {
    cuda::lora_fused_down(xa.data, xa_type, x.data, type, g, M, in, scratch, cuda::stream());
  }
  ++runs;
  return true;
}

bool lora_fused_backward_input(TensorView dx, bool accumulate_dx, std::span<const TensorView> dAs,
                               const TensorView& dxa, const TensorView& x, std::span<const LoraSite> sites,
                               const LoraGroupMask& mask) {
  const cuda::LoraFusedGroup g = fused_group(x, sites, mask, {&dxa});
  if (g.count == 0) return false;
  const int64_t M = x.shape.rows(), in = x.shape.last();
  const cuda::KType type = ktype("lora_backward", x);
  const bool hopper = cuda::lora_fused_sm90a_unavailable().empty();
  if (!dAs.empty()) {
    Tensor workspace =
        Tensor::empty(Shape{lora_fused::weight_grad_workspace_floats(M, in, g.total_rank)}, DType::F32, Device::CUDA);
    std::vector<float*> grads;
    for (const TensorView& dA : dAs) grads.push_back(dA.as<float>());
    if (hopper && cuda::lora_weight_grad_sm90a_takes(type, in, g)) {
      cuda::lora_weight_grad_sm90a(grads.data(), dxa.data, x.data, type, g, M, in, workspace.data<float>(),
                                   cuda::stream());
      ++hopper_weight_grad_runs;
    } else {
      cuda::lora_fused_weight_grad(grads.data(), dxa.data, x.data, type, g, M, in, workspace.data<float>(),
                                   cuda::stream());
    }
  }
  if (dx.data != nullptr) {
    const cuda::KType dx_type = ktype("lora_backward", dx);
    // On Hopper the wgmma kernel takes rank-64 groups of up to 3 (dx of x's type or F32), and
    // writes dx without reading it where it is not accumulated into.
    if (hopper && (dx_type == type || dx_type == cuda::KType::F32) && cuda::lora_input_grad_sm90a_takes(type, in, g)) {
      cuda::lora_input_grad_sm90a(dx.data, dx_type, accumulate_dx, dxa.data, type, g, M, in, cuda::stream());
      ++hopper_input_grad_runs;
    } else {
      if (!accumulate_dx) fill_zero(dx);  // the mma kernel adds to dx
      cuda::lora_fused_input_grad(dx.data, dx_type, dxa.data, type, g, M, in, cuda::stream());
    }
  }
  ++runs;
  return true;
}

int64_t lora_fused_runs() { return runs.load(); }
bool hopper_lora_kernels_run() { return cuda::lora_fused_sm90a_unavailable().empty(); }
int64_t lora_down_sm90a_runs() { return hopper_down_runs.load(); }
int64_t lora_input_grad_sm90a_runs() { return hopper_input_grad_runs.load(); }
int64_t lora_weight_grad_sm90a_runs() { return hopper_weight_grad_runs.load(); }

}  // namespace fsdpq::cuda_ops
