#include "ops/lora.h"

#include "backend/cuda_backend.h"
#include "backend/section_times.h"

#include "ops/checks.h"
#include "ops/cuda_ops.h"
#include "ops/dispatch.h"
#include "ops/elementwise.h"
#include "ops/parallel.h"
#include "ops/matmul.h"
#include "ops/storage.h"
#include "util/error.h"
#include "kernels/lora_dropout_mask.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <vector>

namespace fsdpq {

namespace {

// 16 bits of one hash decide each element (kernels/lora_dropout_mask.h): p to 2^-16.
inline uint32_t drop_threshold(float probability) {
  return static_cast<uint32_t>(std::llround(static_cast<double>(probability) * 65536.0));
}

// For every element e of [0, n), in quads (one word per quad and key), parallel over the quads.
template <class Body>
void for_each_quad(int64_t n, Body&& body) {
  const int64_t quads = (n + 3) / 4;
#pragma omp parallel for if (worth_parallel(n)) schedule(static)
  for (int64_t q = 0; q < quads; ++q) body(q, 4 * q, std::min(n, 4 * q + 4));
}

bool dropout_active(const LoraParams& params) { return params.training && params.dropout > 0.0f; }

// The process's choice: set (FSDPQ_LORA_KERNELS fused or separate, or a test), or auto (nullopt).
std::optional<GpuLoraKernels>& gpu_lora_choice() {
  static std::optional<GpuLoraKernels> choice = []() -> std::optional<GpuLoraKernels> {
    const char* env = std::getenv("FSDPQ_LORA_KERNELS");  // runtime/environment.cpp checks the value
    if (env != nullptr && std::string_view(env) == "fused") return GpuLoraKernels::Fused;
    if (env != nullptr && std::string_view(env) == "separate") return GpuLoraKernels::Separate;
    return std::nullopt;  // unset or "auto"
  }();
  return choice;
}

// Auto: the fused kernels where the Hopper ones run (asked once CUDA is up), else separate.
GpuLoraKernels automatic_gpu_lora_kernels() {
  if constexpr (kWithCuda) {
    if (!cuda_initialized()) return GpuLoraKernels::Separate;
    static const GpuLoraKernels resolved =
        cuda_ops::hopper_lora_kernels_run() ? GpuLoraKernels::Fused : GpuLoraKernels::Separate;
    return resolved;
  }
  return GpuLoraKernels::Separate;
}

// A group's dropout masks: one mixed key per adapter, the probability's threshold and 1 / (1 - p).
struct GroupMask {
  std::array<uint64_t, kMaxLoraGroup> keys{};
  size_t count = 0;
  uint32_t threshold = 0;
  float keep_scale = 1.0f;
  explicit GroupMask(std::span<const LoraSite> sites)
      : count(sites.size()),
        threshold(drop_threshold(sites[0].params.dropout)),
        keep_scale(1.0f / (1.0f - sites[0].params.dropout)) {
    for (size_t i = 0; i < count; ++i) keys[i] = mix64(sites[i].params.dropout_key);
  }
  std::span<const uint64_t> mixed_keys() const { return {keys.data(), count}; }
  cuda_ops::LoraGroupMask for_gpu() const { return {mixed_keys(), threshold, keep_scale}; }
};

// outs[i] = x * keep_i / (1 - p), rounded to x's dtype, as adapter i sees its input: one pass over
// x for every adapter of a group, each with its own key.
void apply_dropout(std::span<const TensorView> outs, const TensorView& x, std::span<const LoraSite> sites) {
  const GroupMask mask(sites);
  const uint32_t threshold = mask.threshold;
  const float keep_scale = mask.keep_scale;
  const int64_t n = x.numel();
  const size_t count = sites.size();
  const std::array<uint64_t, kMaxLoraGroup>& keys = mask.keys;
  if (runs_on_cuda("lora_dropout", {x, outs[0]}))
    if constexpr (kWithCuda) return cuda_ops::lora_dropout_apply(outs, x, mask.mixed_keys(), threshold, keep_scale);
  with_storage(x.dtype, "lora_dropout", [&](auto tag) {
    using S = decltype(tag);
    const S* in = x.as<const S>();
    std::array<S*, kMaxLoraGroup> out{};
    for (size_t i = 0; i < count; ++i) out[i] = outs[i].as<S>();
    for_each_quad(n, [&](int64_t q, int64_t begin, int64_t end) {
      for (size_t i = 0; i < count; ++i) {
        const uint64_t word = keep_word(keys[i], q);
        for (int64_t e = begin; e < end; ++e)
          out[i][e] = keeps_lane(word, static_cast<int>(e - begin), threshold) ? from_f32<S>(to_f32(in[e]) * keep_scale) : from_f32<S>(0.0f);
      }
    });
  });
}

// What each adapter of a group multiplies by A: dropout(x) per adapter, or x itself for all when
// dropout is off (no copy, bit-exact).
struct AdapterInputs {
  std::vector<Tensor> storage;
  std::vector<TensorView> views;
};

AdapterInputs adapter_inputs(const TensorView& x, std::span<const LoraSite> sites) {
  AdapterInputs inputs;
  if (!dropout_active(sites[0].params)) {
    inputs.views.assign(sites.size(), x);
    return inputs;
  }
  ScopedSection section("lora: dropout copies");
  for (size_t i = 0; i < sites.size(); ++i) {
    inputs.storage.push_back(Tensor::empty(x.shape, x.dtype, x.device));
    inputs.views.push_back(inputs.storage.back().view());
  }
  apply_dropout(inputs.views, x, sites);
  return inputs;
}

// A gradient buffer's dtype, on any device (checks.h's check_dtype is for CPU implementations).
void check_f32(const char* op, const char* name, const TensorView& view) {
  check_that(view.dtype == DType::F32, "{}: {} is {}; expected F32", op, name, view.describe());
}

struct LoraDims {
  int64_t rows, in, out, rank;
};

LoraDims check_site(const char* op, const TensorView& x, const LoraSite& site) {
  const TensorView &A = site.A, &B = site.B;
  check_float(op, "A", A);
  check_float(op, "B", B);
  runs_on_cuda(op, {x, A, B});  // all on one device (the linear ops do the work)
  check_that(A.shape.rank == 2 && B.shape.rank == 2 && x.shape.rank >= 1,
             "{}: A {} and B {} must be matrices and x {} at least a vector", op, A.shape.to_string(),
             B.shape.to_string(), x.shape.to_string());
  LoraDims d{x.shape.rows(), A.shape[1], B.shape[0], A.shape[0]};
  check_that(x.shape.last() == d.in && B.shape[1] == d.rank,
             "{}: x {}, A {} [r, in] and B {} [out, r] do not fit together", op, x.shape.to_string(),
             A.shape.to_string(), B.shape.to_string());
  if (!(site.params.dropout >= 0.0f && site.params.dropout < 1.0f))
    fail("lora_dropout must be in [0, 1), got {}", site.params.dropout);
  return d;
}

// The group's dims per adapter and where each adapter's columns of xa begin; checks the group.
struct GroupDims {
  std::vector<LoraDims> site;
  std::vector<int64_t> first_column;
  int64_t total_rank = 0;
};

GroupDims check_group(const char* op, const TensorView& x, const TensorView& xa, std::span<const LoraSite> sites) {
  check_float(op, "x", x);
  check_float(op, "xa", xa);
  check_that(!sites.empty() && sites.size() <= kMaxLoraGroup, "{}: a group holds 1 to {} adapters, got {}", op,
             kMaxLoraGroup, sites.size());
  GroupDims g;
  for (const LoraSite& site : sites) {
    g.site.push_back(check_site(op, x, site));
    g.first_column.push_back(g.total_rank);
    g.total_rank += g.site.back().rank;
    check_that(site.params.dropout == sites[0].params.dropout && site.params.training == sites[0].params.training,
               "{}: the adapters of a group must share the dropout probability and the training flag", op);
  }
  runs_on_cuda(op, {x, xa});
  check_shape(op, "xa", xa, Shape{x.shape.rows(), g.total_rank});
  return g;
}

// The group's A matrices stacked into one [Σr, in] (A itself for a group of one), or an empty view
// when they cannot be: dropout gives each adapter its own input, and one GEMM needs one dtype.
struct StackedA {
  Tensor storage;
  TensorView view;
};

StackedA stack_a(std::span<const LoraSite> sites, const GroupDims& g) {
  StackedA stacked;
  if (dropout_active(sites[0].params)) return stacked;
  if (sites.size() == 1) {
    stacked.view = sites[0].A;
    return stacked;
  }
  for (const LoraSite& site : sites)
    if (site.A.dtype != sites[0].A.dtype) return stacked;
  stacked.storage = Tensor::empty(Shape{g.total_rank, g.site[0].in}, sites[0].A.dtype, sites[0].A.device);
  stacked.view = stacked.storage.view();
  for (size_t i = 0; i < sites.size(); ++i)
    copy_convert(stacked.view.slice_rows(g.first_column[i], g.site[i].rank), sites[i].A);
  return stacked;
}

// Runs `fused(mask)` (a fused GPU product of a group whose dropout is active) when x is on the GPU;
// false when x is not, or when the fused kernels do not take the group (the caller runs its own
// way then).
template <class Fused>
bool fused_on_gpu(const TensorView& x, Fused&& fused, std::span<const LoraSite> sites) {
  if (x.device != Device::CUDA || !dropout_active(sites[0].params)) return false;
  return fused(GroupMask(sites));
}

MatrixView columns_of(const TensorView& xa, const GroupDims& g, size_t i) {
  return MatrixView(xa, g.first_column[i], g.site[i].rank);
}

// For each adapter j of the mask in turn: dx += mask_j / (1 - p) ⊙ g_j, rounded to dx's dtype after
// each (every g_j of one float dtype, dx's size). One pass over dx; `overwrite`: dx starts at 0.
void accumulate_dropped(TensorView dx, std::span<const TensorView> gs, const GroupMask& mask, bool overwrite = false) {
  constexpr const char* op = "lora_backward";
  check_that(gs.size() == mask.count, "{}: {} gradients for {} masks", op, gs.size(), mask.count);
  for (const TensorView& g : gs) {
    check_float(op, "g", g);
    check_that(g.dtype == gs[0].dtype && g.numel() == dx.numel(), "{}: g {} must be {} elements of {}", op,
               g.describe(), dx.numel(), dtype_name(gs[0].dtype));
    runs_on_cuda(op, {dx, g});
  }
  const uint32_t threshold = mask.threshold;
  const float keep_scale = mask.keep_scale;
  const int64_t n = dx.numel();
  if (runs_on_cuda(op, {dx, gs[0]}))
    if constexpr (kWithCuda)
      return cuda_ops::lora_dropout_accumulate(dx, overwrite, gs, mask.mixed_keys(), threshold, keep_scale);
  with_storage(dx.dtype, op, [&](auto dx_tag) {
    using S = decltype(dx_tag);
    with_storage(gs[0].dtype, op, [&](auto g_tag) {
      using G = decltype(g_tag);
      S* out = dx.as<S>();
      for_each_quad(n, [&](int64_t q, int64_t begin, int64_t end) {
        if (overwrite)
          for (int64_t e = begin; e < end; ++e) out[e] = from_f32<S>(0.0f);
        for (size_t j = 0; j < gs.size(); ++j) {
          const G* g = gs[j].as<const G>();
          const uint64_t word = keep_word(mask.keys[j], q);
          for (int64_t e = begin; e < end; ++e)
            if (keeps_lane(word, static_cast<int>(e - begin), threshold))
              out[e] = from_f32<S>(to_f32(out[e]) + keep_scale * to_f32(g[e]));
        }
      });
    });
  });
}

// xa = dropout(x) · Aᵀ: one GEMM over the stacked A, the fused kernels (the masks applied inside the
// products), or one GEMM per adapter on its dropped copy of x.
// With x_copy, x is copied there too: by the Hopper down kernel from the tiles it loads where it
// runs, else by copy_block afterwards (the same values either way).
void down_products(TensorView xa, const TensorView& x, std::span<const LoraSite> sites, const GroupDims& g,
                   const MatrixView* x_copy = nullptr) {
  bool copied = false;
  {
    std::optional<ScopedSection> timed(std::in_place, "lora: x·Aᵀ");
    if (const StackedA stacked = stack_a(sites, g); stacked.view.data != nullptr) {
      linear_forward(xa, x, stacked.view);
    } else if (fused_on_gpu(x, [&](const GroupMask& mask) {
                 if constexpr (kWithCuda) return cuda_ops::lora_fused_forward(xa, x, sites, mask.for_gpu(), x_copy, &copied);
                 return false;
               }, sites)) {
    } else {
      timed.reset();  // the dropout copies are timed on their own
      const AdapterInputs inputs = adapter_inputs(x, sites);
      timed.emplace("lora: x·Aᵀ");
      for (size_t i = 0; i < sites.size(); ++i) linear_forward(columns_of(xa, g, i), inputs.views[i], sites[i].A);
    }
  }
  if (x_copy != nullptr && !copied) {
    const ScopedSection timed("lora: copy of x");
    copy_block(*x_copy, x);
  }
}

}  // namespace

float lora_scaling(const LoraParams& params, int64_t rank) { return params.alpha / static_cast<float>(rank); }

GpuLoraKernels gpu_lora_kernels() { return gpu_lora_choice().value_or(automatic_gpu_lora_kernels()); }
void set_gpu_lora_kernels(GpuLoraKernels kernels) { gpu_lora_choice() = kernels; }
void use_automatic_gpu_lora_kernels() { gpu_lora_choice().reset(); }

bool lora_dropout_keeps(uint64_t key, uint64_t index, float probability) {
  return keeps_lane(keep_word(mix64(key), static_cast<int64_t>(index / 4)), static_cast<int>(index % 4),
                    drop_threshold(probability));
}

void lora_dropout_forward(TensorView out, const TensorView& x, const LoraParams& params) {
  constexpr const char* op = "lora_dropout_forward";
  check_float(op, "x", x);
  check_that(out.dtype == x.dtype && out.shape == x.shape, "{}: out {} must be x's shape and dtype ({})", op,
             out.describe(), x.describe());
  runs_on_cuda(op, {out, x});
  if (!dropout_active(params)) return copy_convert(out, x);
  const LoraSite site{TensorView{}, TensorView{}, params};
  apply_dropout(std::span(&out, 1), x, std::span(&site, 1));
}

void lora_dropout_backward(TensorView dx, const TensorView& g, const LoraParams& params) {
  constexpr const char* op = "lora_dropout_backward";
  check_float(op, "dx", dx);
  check_f32(op, "g", g);
  check_that(g.numel() == dx.numel(), "{}: g {} and dx {} differ in size", op, g.describe(), dx.describe());
  runs_on_cuda(op, {dx, g});
  if (!dropout_active(params)) return add_scaled(dx, g, 1.0f);
  const LoraSite site{TensorView{}, TensorView{}, params};
  accumulate_dropped(dx, std::span(&g, 1), GroupMask(std::span(&site, 1)));
}

namespace {

void check_outputs(const char* op, std::span<const TensorView> ys, const TensorView& x,
                   std::span<const LoraSite> sites, const GroupDims& g) {
  check_that(ys.size() == sites.size(), "{}: {} outputs for {} adapters", op, ys.size(), sites.size());
  for (size_t i = 0; i < sites.size(); ++i) {
    check_float(op, "y", ys[i]);
    check_that(ys[i].shape.rows() == g.site[i].rows && ys[i].shape.last() == g.site[i].out,
               "{}: y {} does not match x {} and B {}", op, ys[i].shape.to_string(), x.shape.to_string(),
               sites[i].B.shape.to_string());
  }
}

// ys[i] (+)= scaling_i · xa_i · B_iᵀ: the B products, from the group's xa.
void up_products(std::span<const TensorView> ys, const TensorView& xa, std::span<const LoraSite> sites,
                 const GroupDims& g, bool accumulate_ys) {
  const ScopedSection timed("lora: xa·Bᵀ");
  for (size_t i = 0; i < sites.size(); ++i)
    linear_forward(ys[i], columns_of(xa, g, i), sites[i].B, accumulate_ys, lora_scaling(sites[i].params, g.site[i].rank));
}

}  // namespace

void lora_forward_group(std::span<const TensorView> ys, TensorView xa, const TensorView& x,
                        std::span<const LoraSite> sites, bool accumulate_ys) {
  constexpr const char* op = "lora_forward";
  const GroupDims g = check_group(op, x, xa, sites);
  check_outputs(op, ys, x, sites, g);
  down_products(xa, x, sites, g);
  up_products(ys, xa, sites, g, accumulate_ys);
}

void lora_up_group(std::span<const TensorView> ys, const TensorView& xa, const TensorView& x,
                   std::span<const LoraSite> sites, bool accumulate_ys) {
  constexpr const char* op = "lora_forward";
  const GroupDims g = check_group(op, x, xa, sites);
  check_outputs(op, ys, x, sites, g);
  up_products(ys, xa, sites, g, accumulate_ys);
}

void lora_down_group(TensorView xa, const TensorView& x, std::span<const LoraSite> sites) {
  down_products(xa, x, sites, check_group("lora_forward", x, xa, sites));
}

void lora_down_group(TensorView xa, const TensorView& x, std::span<const LoraSite> sites, const MatrixView& x_copy) {
  constexpr const char* op = "lora_forward";
  const GroupDims g = check_group(op, x, xa, sites);
  check_that(x_copy.dtype() == x.dtype && x_copy.device() == x.device && x_copy.rows() == x.shape.rows() &&
                 x_copy.cols() == x.shape.last(),
             "{}: x's copy (columns [{}, {}) of {}) must be x's shape and dtype ({})", op, x_copy.first_column,
             x_copy.first_column + x_copy.cols(), x_copy.tensor.describe(), x.describe());
  down_products(xa, x, sites, g, &x_copy);
}

void lora_backward_output(TensorView dxa, size_t i, TensorView dB, const TensorView& dy, const TensorView& x,
                          const TensorView& xa, std::span<const LoraSite> sites) {
  constexpr const char* op = "lora_backward";
  const GroupDims g = check_group(op, x, xa, sites);
  check_that(i < sites.size(), "{}: adapter {} of a group of {}", op, i, sites.size());
  check_float(op, "dy", dy);
  check_that(dy.shape.rows() == g.site[i].rows && dy.shape.last() == g.site[i].out,
             "{}: dy {} does not match x {} and B {}", op, dy.shape.to_string(), x.shape.to_string(),
             sites[i].B.shape.to_string());
  const float scaling = lora_scaling(sites[i].params, g.site[i].rank);
  if (dB.data != nullptr) {
    check_f32(op, "dB", dB);
    check_shape(op, "dB", dB, sites[i].B.shape);
    runs_on_cuda(op, {dB, dy, x});  // every operand on one device
    ScopedSection section("lora: dB");
    linear_backward_weight(dB, dy, columns_of(xa, g, i), /*accumulate=*/true, scaling);
  }
  if (dxa.data != nullptr) {
    check_f32(op, "dxa", dxa);
    check_shape(op, "dxa", dxa, xa.shape);
    runs_on_cuda(op, {dxa, dy, x});
    ScopedSection section("lora: dxa");
    linear_backward_input(columns_of(dxa, g, i), dy, sites[i].B, /*accumulate=*/false, scaling);
  }
}

void lora_backward_input(TensorView dx, std::span<const TensorView> dAs, const TensorView& dxa_f32,
                         const TensorView& x, const TensorView& xa, std::span<const LoraSite> sites,
                         bool accumulate_dx) {
  constexpr const char* op = "lora_backward";
  const GroupDims g = check_group(op, x, xa, sites);
  check_that(dAs.empty() || dAs.size() == sites.size(), "{}: {} dA for {} adapters", op, dAs.size(), sites.size());
  check_f32(op, "dxa", dxa_f32);
  check_shape(op, "dxa", dxa_f32, xa.shape);
  for (size_t i = 0; i < dAs.size(); ++i) {
    check_f32(op, "dA", dAs[i]);
    check_shape(op, "dA", dAs[i], sites[i].A.shape);
    runs_on_cuda(op, {dAs[i], dxa_f32, x});  // every operand on one device
  }
  if (dx.data != nullptr) {
    check_float(op, "dx", dx);
    check_that(dx.shape.rows() == x.shape.rows() && dx.shape.last() == x.shape.last(),
               "{}: dx {} does not match x {}", op, dx.shape.to_string(), x.shape.to_string());
    runs_on_cuda(op, {dx, dxa_f32, x});
  }
  if (dAs.empty() && dx.data == nullptr) return;
  const int64_t rows = x.shape.rows(), in = g.site[0].in;

  // d(xa) as the GEMMs against A read it: one copy where the device rounds it.
  Tensor dxa_rounded;
  const TensorView dxa = round_for_gemms(dxa_f32, {sites[0].A.dtype}, dxa_rounded);

  std::optional<ScopedSection> timed(std::in_place, "lora: dA, dx (stacked or fused)");
  if (const StackedA stacked = stack_a(sites, g); stacked.view.data != nullptr) {
    // dA += d(xa)ᵀ · x for the whole stack, and dx += d(xa) · A: one GEMM each.
    if (dAs.empty()) {
    } else if (sites.size() == 1) {
      linear_backward_weight(dAs[0], dxa, x, /*accumulate=*/true);
    } else {
      Tensor dA_stacked = Tensor::empty(Shape{g.total_rank, in}, DType::F32, x.device);
      linear_backward_weight(dA_stacked, dxa, x);
      for (size_t i = 0; i < sites.size(); ++i)
        accumulate(dAs[i], dA_stacked.view().slice_rows(g.first_column[i], g.site[i].rank));
    }
    if (dx.data != nullptr) linear_backward_input(dx, dxa, stacked.view, accumulate_dx);
    return;
  }

  // Both at once on the GPU, the masks applied inside the products.
  if (fused_on_gpu(x, [&](const GroupMask& mask) {
        if constexpr (kWithCuda)
          return cuda_ops::lora_fused_backward_input(dx, accumulate_dx, dAs, dxa, x, sites, mask.for_gpu());
        return false;
      }, sites))
    return;

  // Per adapter: dA += d(xa)ᵀ · dropout(x), the masks regenerated from the keys.
  timed.reset();  // the dropout copies are timed on their own
  if (!dAs.empty()) {
    const AdapterInputs inputs = adapter_inputs(x, sites);
    timed.emplace("lora: dA");
    for (size_t i = 0; i < sites.size(); ++i)
      linear_backward_weight(dAs[i], columns_of(dxa, g, i), inputs.views[i], /*accumulate=*/true);
  }
  timed.emplace("lora: dx");
  if (dx.data == nullptr) return;
  if (!dropout_active(sites[0].params)) {
    for (size_t i = 0; i < sites.size(); ++i)
      linear_backward_input(dx, columns_of(dxa, g, i), sites[i].A, accumulate_dx || i > 0);
    return;
  }
  // dx += mask_i / (1 - p) ⊙ (d(xa)_i · A_i) for every adapter: each product in x's dtype (as PEFT's
  // autograd rounds it), then one pass over dx for the whole group.
  std::vector<Tensor> products;
  std::vector<TensorView> views;
  for (size_t i = 0; i < sites.size(); ++i) {
    products.push_back(Tensor::empty(Shape{rows, in}, x.dtype, x.device));
    views.push_back(products.back().view());
    linear_backward_input(views.back(), columns_of(dxa, g, i), sites[i].A);
  }
  accumulate_dropped(dx, views, GroupMask(sites), /*overwrite=*/!accumulate_dx);
}

void lora_backward_group(TensorView dx, std::span<const LoraSiteGrads> grads, std::span<const TensorView> dys,
                         const TensorView& x, const TensorView& xa, std::span<const LoraSite> sites) {
  check_that(grads.size() == sites.size() && dys.size() == sites.size(),
             "lora_backward: {} gradients and {} dy for {} adapters", grads.size(), dys.size(), sites.size());
  Tensor dxa = Tensor::empty(xa.shape, DType::F32, x.device);
  std::vector<TensorView> dAs;
  for (size_t i = 0; i < sites.size(); ++i) {
    lora_backward_output(dxa, i, grads[i].dB, dys[i], x, xa, sites);
    dAs.push_back(grads[i].dA);
  }
  lora_backward_input(dx, dAs, dxa, x, xa, sites);
}

void lora_forward(TensorView y, TensorView xa, const TensorView& x, const TensorView& A, const TensorView& B,
                  const LoraParams& params) {
  const LoraSite site{A, B, params};
  lora_forward_group(std::span(&y, 1), xa, x, std::span(&site, 1));
}

void lora_backward(TensorView dx, TensorView dA, TensorView dB, const TensorView& dy, const TensorView& x,
                   const TensorView& xa, const TensorView& A, const TensorView& B, const LoraParams& params) {
  const LoraSite site{A, B, params};
  const LoraSiteGrads grads{dA, dB};
  lora_backward_group(dx, std::span(&grads, 1), std::span(&dy, 1), x, xa, std::span(&site, 1));
}

}  // namespace fsdpq
