// The fused LoRA group products on the GPU (kernels/lora_fused.cuh): which groups they take, their
// scratch, and the launch. ops/lora.cpp derives the mask and holds the CPU reference.
#include "kernels/lora_fused.cuh"
#include "kernels/lora_fused_sm90a.cuh"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "ops/cuda/kernel_args.h"
#include "ops/cuda_ops.h"
#include "ops/elementwise.h"

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

// ---- rank-64 slots: the Hopper kernels for any rank ----
// The Hopper kernels take adapters of rank 64, up to 3 a launch; other ranks would take the mma
// kernels (multiples of 16, a group's Σ rank up to 256) or the separate products. Instead, adapter
// i of rank r_i runs as ceil(r_i / 64) slots of 64 rows of A, the last one's rows past r_i zero;
// every slot keeps its adapter's mask key, so the slots of a rank over 64 drop the same elements,
// as one adapter does. The group's xa, dxa and dA move to and from the slots' own buffers by small
// copies (M · Σ r elements; the kernels' work is M · in a slot). Zero rows of A give zero columns of
// xa, and zero columns of dxa add nothing to dx or to the real rows of dA.
struct Slot {
  int adapter;   // the site it is a part of
  int64_t row0;  // its first row of the adapter's A (and column of the adapter's xa)
  int64_t rows;  // 64, or fewer for the last slot of a rank that is not a multiple of 64
};

constexpr int64_t kSlotRank = 64;
constexpr int kSlotsALaunch = 3;

std::atomic<bool>& rank_slots_setting() {
  static std::atomic<bool> enabled = [] {
    const char* v = std::getenv("FSDPQ_LORA_RANK_SLOTS");  // runtime/environment.cpp checks the value
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return enabled;
}

bool rank_slots_enabled() { return rank_slots_setting().load(); }

// The slots of the group where they are to run: the Hopper kernels present, 16-bit operands of one
// type, 16-byte aligned, `in` a multiple of `in_multiple`, and some adapter's rank not 64 (a group
// of rank-64 adapters takes the kernels as it is). Empty otherwise.
std::vector<Slot> rank_slots(const TensorView& x, std::span<const LoraSite> sites, int64_t in_multiple,
                             std::initializer_list<const TensorView*> also_16bit) {
  if (gpu_lora_kernels() != GpuLoraKernels::Fused || !rank_slots_enabled() || !is_16bit(x.dtype) ||
      !aligned16(x.data) || x.shape.last() % in_multiple != 0 || !cuda::lora_fused_sm90a_unavailable().empty())
    return {};
  for (const TensorView* t : also_16bit)
    if (t->dtype != x.dtype || !aligned16(t->data)) return {};
  bool all_64 = true;
  for (const LoraSite& site : sites) {
    if (site.A.dtype != x.dtype || !aligned16(site.A.data) || site.A.shape[0] < 1) return {};
    all_64 = all_64 && site.A.shape[0] == kSlotRank;
  }
  if (all_64 || sites.empty()) return {};
  std::vector<Slot> slots;
  for (size_t i = 0; i < sites.size(); ++i)
    for (int64_t row0 = 0; row0 < sites[i].A.shape[0]; row0 += kSlotRank)
      slots.push_back(Slot{static_cast<int>(i), row0, std::min(kSlotRank, sites[i].A.shape[0] - row0)});
  return slots;
}

// Each adapter's first column of the group's xa and dxa.
std::vector<int64_t> first_columns(std::span<const LoraSite> sites) {
  std::vector<int64_t> first;
  int64_t column = 0;
  for (const LoraSite& site : sites) first.push_back(std::exchange(column, column + site.A.shape[0]));
  return first;
}

// One launch's slots (at most kSlotsALaunch, from `begin`) as the kernels' group, with A of every
// partial slot padded into `padded` ([slots, 64, in], zero past its rows); a whole slot's A is its
// rows of the adapter's A itself.
struct SlotLaunch {
  cuda::LoraFusedGroup g;
  std::vector<Slot> slots;
  Tensor padded;
};

SlotLaunch slot_launch(std::span<const Slot> all, size_t begin, std::span<const LoraSite> sites,
                       const LoraGroupMask& mask, int64_t in) {
  SlotLaunch l;
  const size_t end = std::min(all.size(), begin + kSlotsALaunch);
  l.slots.assign(all.begin() + static_cast<std::ptrdiff_t>(begin), all.begin() + static_cast<std::ptrdiff_t>(end));
  const DType dtype = sites[0].A.dtype;
  const bool any_partial = std::any_of(l.slots.begin(), l.slots.end(), [](const Slot& s) { return s.rows < kSlotRank; });
  if (any_partial) {
    l.padded = Tensor::empty(Shape{static_cast<int64_t>(l.slots.size()), kSlotRank, in}, dtype, Device::CUDA);
    cuda_ops::fill_zero(l.padded.view());
  }
  std::vector<BlockCopy> copies;
  for (size_t k = 0; k < l.slots.size(); ++k) {
    const Slot& s = l.slots[k];
    const TensorView rows = sites[static_cast<size_t>(s.adapter)].A.slice_rows(s.row0, s.rows);
    const void* A = rows.data;
    if (s.rows < kSlotRank) {
      const TensorView slot = l.padded.view().reshaped(Shape{static_cast<int64_t>(l.slots.size()) * kSlotRank, in})
                                  .slice_rows(static_cast<int64_t>(k) * kSlotRank, s.rows);
      copies.push_back(BlockCopy{MatrixView(slot), MatrixView(rows)});
      A = slot.data;
    }
    l.g.A[k] = A;
    l.g.rank[k] = static_cast<int>(kSlotRank);
    l.g.first[k] = static_cast<int>(kSlotRank * static_cast<int64_t>(k));
    l.g.mixed_key[k] = mask.mixed_keys[static_cast<size_t>(s.adapter)];
  }
  if (!copies.empty()) cuda_ops::copy_blocks(copies);
  l.g.count = static_cast<int>(l.slots.size());
  l.g.total_rank = static_cast<int>(kSlotRank) * l.g.count;
  l.g.threshold = mask.threshold;
  l.g.keep_scale = mask.keep_scale;
  return l;
}

// The forward in slots: each launch's xa into a buffer of its own, its slots' columns then copied
// into the group's xa; x copied (where asked) by the first launch.
bool slot_forward(TensorView xa, const TensorView& x, std::span<const LoraSite> sites, const LoraGroupMask& mask,
                  const MatrixView* x_copy, bool* copied) {
  const std::vector<Slot> slots = rank_slots(x, sites, 64, {&xa});
  if (slots.empty()) return false;
  const int64_t M = x.shape.rows(), in = x.shape.last();
  const cuda::KType type = ktype("lora_forward", x);
  const std::vector<int64_t> first = first_columns(sites);
  for (size_t begin = 0; begin < slots.size(); begin += kSlotsALaunch) {
    const SlotLaunch l = slot_launch(slots, begin, sites, mask, in);
    const int64_t floats = lora_fused::down_workspace_floats(M, in, l.g.total_rank);
    Tensor workspace = floats > 0 ? Tensor::empty(Shape{floats}, DType::F32, Device::CUDA) : Tensor();
    Tensor out = Tensor::empty(Shape{M, l.g.total_rank}, x.dtype, Device::CUDA);
    const bool copy = begin == 0 && x_copy != nullptr &&
                      cuda::lora_down_sm90a_copies_to(x_copy->data(), x_copy->row_stride(), in);
    cuda::lora_down_sm90a(out.view().data, type, x.data, type, l.g, M, in, floats > 0 ? workspace.data<float>() : nullptr,
                          cuda::stream(), copy ? x_copy->data() : nullptr, copy ? x_copy->row_stride() : 0);
    if (copy && copied != nullptr) *copied = true;
    std::vector<BlockCopy> copies;
    for (size_t k = 0; k < l.slots.size(); ++k) {
      const Slot& s = l.slots[k];
      copies.push_back(BlockCopy{MatrixView(xa, first[static_cast<size_t>(s.adapter)] + s.row0, s.rows),
                                 MatrixView(out.view(), kSlotRank * static_cast<int64_t>(k), s.rows)});
    }
    cuda_ops::copy_blocks(copies);
    ++hopper_down_runs;
  }
  ++runs;
  return true;
}

// The backward's input part in slots: per launch, its slots' columns of dxa into a zero-padded
// buffer of its own; dA through fp32 buffers of 64 rows a slot, added into each adapter's rows;
// dx written or added by the first launch as asked, added by the rest.
bool slot_backward_input(TensorView dx, bool accumulate_dx, std::span<const TensorView> dAs, const TensorView& dxa,
                         const TensorView& x, std::span<const LoraSite> sites, const LoraGroupMask& mask) {
  const std::vector<Slot> slots = rank_slots(x, sites, 128, {&dxa});
  if (slots.empty()) return false;
  const int64_t M = x.shape.rows(), in = x.shape.last();
  const cuda::KType type = ktype("lora_backward", x);
  if (dx.data != nullptr) {
    const cuda::KType dx_type = ktype("lora_backward", dx);
    if (dx_type != type && dx_type != cuda::KType::F32) return false;
  }
  const std::vector<int64_t> first = first_columns(sites);
  for (size_t begin = 0; begin < slots.size(); begin += kSlotsALaunch) {
    const SlotLaunch l = slot_launch(slots, begin, sites, mask, in);
    Tensor padded_dxa = Tensor::empty(Shape{M, l.g.total_rank}, dxa.dtype, Device::CUDA);
    cuda_ops::fill_zero(padded_dxa.view());
    std::vector<BlockCopy> copies;
    for (size_t k = 0; k < l.slots.size(); ++k) {
      const Slot& s = l.slots[k];
      copies.push_back(BlockCopy{MatrixView(padded_dxa.view(), kSlotRank * static_cast<int64_t>(k), s.rows),
                                 MatrixView(dxa, first[static_cast<size_t>(s.adapter)] + s.row0, s.rows)});
    }
    cuda_ops::copy_blocks(copies);
    if (!dAs.empty()) {
      Tensor workspace = Tensor::empty(Shape{lora_fused::weight_grad_workspace_floats(M, in, l.g.total_rank)},
                                       DType::F32, Device::CUDA);
      Tensor slot_grads = Tensor::empty(Shape{l.g.total_rank, in}, DType::F32, Device::CUDA);
      cuda_ops::fill_zero(slot_grads.view());
      std::vector<float*> grads;
      for (size_t k = 0; k < l.slots.size(); ++k)
        grads.push_back(slot_grads.data<float>() + kSlotRank * static_cast<int64_t>(k) * in);
      cuda::lora_weight_grad_sm90a(grads.data(), padded_dxa.view().data, x.data, type, l.g, M, in,
                                   workspace.data<float>(), cuda::stream());
      for (size_t k = 0; k < l.slots.size(); ++k) {
        const Slot& s = l.slots[k];
        cuda_ops::accumulate(dAs[static_cast<size_t>(s.adapter)].slice_rows(s.row0, s.rows),
                             slot_grads.view().slice_rows(kSlotRank * static_cast<int64_t>(k), s.rows));
      }
      ++hopper_weight_grad_runs;
    }
    if (dx.data != nullptr) {
      const bool accumulate_here = accumulate_dx || begin > 0;
      cuda::lora_input_grad_sm90a(dx.data, ktype("lora_backward", dx), accumulate_here, padded_dxa.view().data, type,
                                  l.g, M, in, cuda::stream());
      ++hopper_input_grad_runs;
    }
  }
  ++runs;
  return true;
}

}  // namespace

bool lora_fused_forward(TensorView xa, const TensorView& x, std::span<const LoraSite> sites, const LoraGroupMask& mask,
                        const MatrixView* x_copy, bool* copied) {
  if (copied != nullptr) *copied = false;
  if (slot_forward(xa, x, sites, mask, x_copy, copied)) return true;
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
  if (slot_backward_input(dx, accumulate_dx, dAs, dxa, x, sites, mask)) return true;
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
      if (!accumulate_dx) cuda_ops::fill_zero(dx);  // the mma kernel adds to dx
      cuda::lora_fused_input_grad(dx.data, dx_type, dxa.data, type, g, M, in, cuda::stream());
    }
  }
  ++runs;
  return true;
}

bool lora_rank_slots() { return rank_slots_enabled(); }
void set_lora_rank_slots(bool on) { rank_slots_setting() = on; }

int64_t lora_fused_runs() { return runs.load(); }
bool hopper_lora_kernels_run() { return cuda::lora_fused_sm90a_unavailable().empty(); }
int64_t lora_down_sm90a_runs() { return hopper_down_runs.load(); }
int64_t lora_input_grad_sm90a_runs() { return hopper_input_grad_runs.load(); }
int64_t lora_weight_grad_sm90a_runs() { return hopper_weight_grad_runs.load(); }

}  // namespace fsdpq::cuda_ops
