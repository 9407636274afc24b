#include "model/llama_layer.h"

#include <fmt/format.h>

#include "backend/section_times.h"
#include "ops/attention.h"
#include "ops/dora.h"
#include "ops/elementwise.h"
#include "ops/lora.h"
#include "ops/matmul.h"
#include "ops/rmsnorm.h"
#include "ops/swiglu.h"

#include <stdexcept>
#include <string>
#include <vector>

namespace fsdpq {
namespace {

Shape heads_shape(const LayerDims& d, int64_t heads) { return Shape{d.B, d.T, heads, d.D}; }

constexpr int kQkv[] = {kQProj, kKProj, kVProj}, kO[] = {kOProj}, kGateUp[] = {kGateProj, kUpProj},
              kDown[] = {kDownProj};

// The adapters of a group's modules, in module order (modules without one left out).
struct GroupAdapters {
  std::vector<LoraSite> sites;
  std::vector<int> site_of;  // per module of the group: its index in sites, or -1
};

bool is_dora(const LayerCompute& w, int m) { return w.lora[m] != nullptr && w.lora[m]->magnitude != nullptr; }

GroupAdapters group_adapters(int group, const LayerCompute& w) {
  GroupAdapters g;
  for (int m : group_modules(group)) {
    const LoraAdapter* lora = is_dora(w, m) ? nullptr : w.lora[m];  // a DoRA linear runs on its own
    g.site_of.push_back(lora ? static_cast<int>(g.sites.size()) : -1);
    if (lora) g.sites.push_back(LoraSite{lora->A.compute_view(), lora->B.compute_view(), w.lora_params[m]});
  }
  return g;
}

DoraSite dora_site(const LayerCompute& w, int m) {
  const LoraAdapter& adapter = *w.lora[m];
  return DoraSite{w.weight(m).as_tensor(), adapter.A.compute_view(), adapter.B.compute_view(), adapter.magnitude->compute_view(),
                  w.lora_params[m]};
}

DoraSaved dora_saved(const LayerActivations& a, const LayerCompute& w, int m) {
  const LayerActivations::Dora& kept = a.dora[m];
  return DoraSaved{kept.xa, kept.z, w.dora_norm[m].data ? w.dora_norm[m] : kept.norm.view()};
}

// Module m's DoRA linear: its weight norm (unless given), then its output.
void dora_linear_forward(TensorView y, const TensorView& x, int m, const LayerCompute& w, LayerActivations& a) {
  ScopedSection section("dora");
  const DoraSite site = dora_site(w, m);
  if (!w.dora_norm[m].data)
    dora_weight_norm(a.dora[m].norm, site.W, site.A, site.B, lora_scaling(site.params, site.A.shape[0]));
  dora_forward(y, dora_saved(a, w, m), x, site);
}

// A folded group's forward (LayerCompute): xa = [dropout_j(x)·A_jᵀ]_j, X = [x | xa], module j's
// s_j·B_j into its block of W_cat_j, then ys[j] = X[:, :C + K_j] · W_cat_jᵀ, one GEMM a module.
// The small blocks (xa, each s_j·B_j; a recompute's x too) are one copy_blocks pass, not a launch each.
void folded_group_forward(std::span<const TensorView> ys, const TensorView& x, int group, const LayerCompute& w,
                          LayerActivations& a) {
  const std::span<const int> modules = group_modules(group);
  const GroupAdapters g = group_adapters(group, w);
  if (g.sites.size() != modules.size())
    throw std::logic_error("folded_group_forward: a folded group's modules must all have plain LoRA adapters");
  const TensorView xa = a.xa[group];
  const int64_t C = x.shape.last(), R = xa.shape.last();
  Tensor wide = Tensor::empty(Shape{x.shape.rows(), C + R}, x.dtype, x.device);
  std::vector<BlockCopy> blocks;
  if (a.xa_kept) {
    blocks.push_back(BlockCopy{MatrixView(wide.view(), 0, C), x});
  } else {
    ScopedSection section("lora");
    lora_down_group(xa, x, g.sites, MatrixView(wide.view(), 0, C));  // x into [x | xa] too
  }
  blocks.push_back(BlockCopy{MatrixView(wide.view(), C, R), xa});
  std::vector<int64_t> width;  // C + K_j
  int64_t first = C;
  for (size_t j = 0; j < modules.size(); ++j) {
    const LoraSite& site = g.sites[j];
    const int64_t rank = site.A.shape[0];
    const MatrixView base = w.weight(modules[j]);
    const TensorView folded = base.tensor;
    if (base.first_column != 0 || base.cols() != C || folded.shape.last() != first + rank)
      throw std::logic_error(fmt::format("folded_group_forward: module {}'s folded weight {} holds columns [0, {}) of "
                                         "the base; expected [0, {}) of a weight {} wide",
                                         modules[j], folded.describe(), base.cols(), C, first + rank));
    blocks.push_back(BlockCopy{MatrixView(folded, first, rank), site.B, lora_scaling(site.params, rank)});
    first += rank;
    width.push_back(first);
  }
  {
    ScopedSection section("lora: fold");
    copy_blocks(blocks);
  }
  ScopedSection section("linear");
  for (size_t j = 0; j < modules.size(); ++j)
    linear_forward(ys[j], MatrixView(wide.view(), 0, width[j]), w.weight(modules[j]).tensor);
  w.release_group(group);
}

// ys[j] = x·W_mᵀ (+ scaling · dropout(x)·Aᵀ·Bᵀ) for the group's j-th module m, keeping xa; a
// DoRA module's ys[j] is its DoRA linear's output. Adapters first: their B product writes ys[j]
// (its old values unread) and the base GEMM adds to it through its beta, which reads ys[j] as it
// stores: the skinny, memory-bound B product no longer reads y (~695 MB a 7B layer at 8192 tokens).
void linear_group_forward(std::span<const TensorView> ys, const TensorView& x, int group, const LayerCompute& w,
                          LayerActivations& a) {
  if (w.folded[group]) return folded_group_forward(ys, x, group, w, a);
  const std::span<const int> modules = group_modules(group);
  const GroupAdapters g = group_adapters(group, w);
  if (!g.sites.empty()) {
    std::vector<TensorView> adapted;
    for (size_t j = 0; j < modules.size(); ++j)
      if (g.site_of[j] >= 0) adapted.push_back(ys[j]);
    ScopedSection section("lora");
    if (a.xa_kept)
      lora_up_group(adapted, a.xa[group], x, g.sites, /*accumulate_ys=*/false);
    else
      lora_forward_group(adapted, a.xa[group], x, g.sites, /*accumulate_ys=*/false);
  }
  {
    ScopedSection section("linear");
    for (size_t j = 0; j < modules.size(); ++j)
      if (!is_dora(w, modules[j])) linear_forward(ys[j], x, w.weight(modules[j]), /*accumulate=*/g.site_of[j] >= 0);
  }
  for (size_t j = 0; j < modules.size(); ++j)
    if (is_dora(w, modules[j])) dora_linear_forward(ys[j], x, modules[j], w, a);
  w.release_group(group);
}

// dy as module m's GEMMs (its weight's, and its adapter's B) read it: the three or four of them
// share one copy where the device rounds it (round_for_gemms, ops/matmul.h).
TensorView gemm_ready(const TensorView& dy, int m, const LayerCompute& w, Tensor& storage) {
  const DType weight = w.weight(m).dtype();
  const DType adapter = w.lora[m] ? w.lora[m]->B.compute_view().dtype : weight;
  return round_for_gemms(dy, {weight, adapter}, storage, "dy rounding");
}

// Queues `work` on the layer's adapter stream once the compute stream's work so far is done (or
// runs it here, on the compute stream, where there is none). `held` are let go of in there: a
// block freed on a side stream returns to the pool only once the compute stream has waited for a
// later mark of that stream, or the stream has passed the free (backend/cuda_backend.cpp), so
// what the work reads stays intact until it has read it.
template <typename Work>
void beside(const LayerCompute& w, Work&& work, std::initializer_list<Tensor*> held = {}) {
  if (!w.adapter_stream) return work();
  w.adapter_stream->wait_for_compute();
  const OnSideStream on_side(*w.adapter_stream);
  work();
  for (Tensor* t : held) *t = Tensor();
}

// A group of one adapted module (o, down): dx = its adapter's part (written, not added), then
// dx += dy·W through the base GEMM's beta, which reads dx as it stores its output: the adapter's
// pass over dx [M, in] (down: 11,008 columns) no longer reads it. dW for a trainable base weight.
// Its dy copy is held through both. dA, which nothing in the layer reads, goes to the adapter
// stream where there is one (dB stays: dy may be the layer's d_resid, which its backward rewrites).
// dx and dA are lora_backward_input's two parts, each in a call of its own (the same bits).
void adapter_first_backward(TensorView dx, const TensorView& dy_in, const TensorView& x, int group,
                            const LayerCompute& w, const LayerActivations& a, const GroupAdapters& g) {
  const int m = group_modules(group)[0];
  Tensor dy_storage;
  const TensorView dy = gemm_ready(dy_in, m, w, dy_storage);
  {
    ScopedSection section("lora bwd");
    Tensor dxa = Tensor::empty(a.xa[group].shape(), DType::F32, x.device);
    lora_backward_output(dxa, 0, w.lora[m]->B.grad.view(), dy, x, a.xa[group], g.sites);
    lora_backward_input(dx, {}, dxa, x, a.xa[group], g.sites, /*accumulate_dx=*/false);
    const TensorView dA = w.lora[m]->A.grad.view();
    beside(w, [&] { lora_backward_input(TensorView{}, std::span(&dA, 1), dxa, x, a.xa[group], g.sites); }, {&dxa});
  }
  ScopedSection section("linear bwd");
  linear_backward_input(dx, dy, w.weight(m), /*accumulate=*/true);
  if (w.d_weight[m].data) linear_backward_weight(w.d_weight[m], dy, x, /*accumulate=*/true);
}

// dx (+)= Σ_j dys[j]·W_m (+ the adapters' part), adding dW for trainable base weights and dA, dB
// for adapters. Each module's dy is let go of once its own GEMMs have read it. With an adapter
// stream, each module's dB and d(xa) run there beside the base GEMMs, and dA after them, which
// nothing in the layer waits for; the adapters' part of dx waits for the d(xa).
void linear_group_backward(TensorView dx, bool accumulate, std::span<const TensorView> dys, const TensorView& x,
                           int group, const LayerCompute& w, const LayerActivations& a) {
  const std::span<const int> modules = group_modules(group);
  const GroupAdapters g = group_adapters(group, w);
  if (modules.size() == 1 && g.sites.size() == 1 && !accumulate && dx.data != nullptr) {  // (a DoRA module has no site)
    adapter_first_backward(dx, dys[0], x, group, w, a, g);
    w.release_group(group);
    return;
  }
  Tensor dxa = g.sites.empty() ? Tensor() : Tensor::empty(a.xa[group].shape(), DType::F32, x.device);
  for (size_t j = 0; j < modules.size(); ++j) {
    const int m = modules[j];
    if (is_dora(w, m)) {
      ScopedSection section("dora bwd");
      const LoraAdapter& adapter = *w.lora[m];
      dora_backward(dx, accumulate || j > 0, adapter.A.grad.view(), adapter.B.grad.view(), adapter.magnitude->grad.view(),
                    dys[j], x, dora_saved(a, w, m), dora_site(w, m));
      continue;
    }
    Tensor dy_storage;
    const TensorView dy = gemm_ready(dys[j], m, w, dy_storage);
    const bool adapted = g.site_of[j] >= 0;
    if (adapted)
      beside(w, [&] {
        ScopedSection section("lora bwd");
        lora_backward_output(dxa, static_cast<size_t>(g.site_of[j]), w.lora[m]->B.grad.view(), dy, x, a.xa[group],
                             g.sites);
      });
    if (dx.data != nullptr || w.d_weight[m].data != nullptr) {  // (no dx: the first layer's q/k/v)
      ScopedSection section("linear bwd");
      if (dx.data) linear_backward_input(dx, dy, w.weight(m), accumulate || j > 0);
      if (w.d_weight[m].data) linear_backward_weight(w.d_weight[m], dy, x, /*accumulate=*/true);
    }
    if (adapted) beside(w, [] {}, {&dy_storage});  // (dB on the adapter stream reads it: let go of there)
  }
  w.release_group(group);  // the adapters' part below reads no base weight
  if (g.sites.empty()) return;
  std::vector<TensorView> dAs;
  for (int m : modules)
    if (w.lora[m] && !is_dora(w, m)) dAs.push_back(w.lora[m]->A.grad.view());
  ScopedSection section("lora bwd");
  const StreamMark dxa_written = w.adapter_stream ? w.adapter_stream->mark() : StreamMark{};
  beside(w, [&] { lora_backward_input(TensorView{}, dAs, dxa, x, a.xa[group], g.sites); });
  dxa_written.compute_waits();
  if (dx.data) lora_backward_input(dx, {}, dxa, x, a.xa[group], g.sites);
  beside(w, [] {}, {&dxa});
}

}  // namespace

std::array<int64_t, kLinearModules> folded_columns(const std::array<FoldCandidate, kLinearModules>& modules) {
  std::array<int64_t, kLinearModules> extra{};
  for (int group = 0; group < kLinearGroups; ++group) {
    const std::span<const int> members = group_modules(group);
    bool folds = true;
    for (int m : members)
      folds = folds && modules[m].plain_lora_on_quantized_base && modules[m].rank > 0 && modules[m].in % 64 == 0;
    int64_t columns = 0;
    for (int m : members) extra[m] = folds ? (columns += modules[m].rank) : 0;
  }
  return extra;
}

void LayerCompute::release_group(int group) const {
  if (buffer_free == nullptr) return;
  const StreamMark here = mark_compute();
  for (int m : group_modules(group)) (*buffer_free)[m] = here;
}

std::span<const int> group_modules(int group) {
  switch (group) {
    case kQkvGroup: return kQkv;
    case kOGroup: return kO;
    case kGateUpGroup: return kGateUp;
    case kDownGroup: return kDown;
    default: break;
  }
  throw std::logic_error("group_modules: no linear group " + std::to_string(group));
}

LayerDims layer_dims(const LlamaConfig& config, int64_t batch, int64_t seq_len) {
  LayerDims d;
  d.B = batch;
  d.T = seq_len;
  d.C = config.hidden_size;
  d.H = config.num_attention_heads;
  d.KV = config.num_key_value_heads;
  d.D = config.head_dim;
  d.I = config.intermediate_size;
  d.eps = static_cast<float>(config.rms_norm_eps);
  return d;
}

int64_t module_out(const LayerDims& d, int module) {
  switch (module) {
    case kQProj: return d.H * d.D;
    case kKProj:
    case kVProj: return d.KV * d.D;
    case kOProj:
    case kDownProj: return d.C;
    case kGateProj:
    case kUpProj: return d.I;
    default: break;
  }
  throw std::logic_error("module_out: no linear module " + std::to_string(module));
}

void ElementwiseScratch::allocate(const LayerDims& d, DType dtype, Device device) {
  norm = Tensor::empty(Shape{d.N(), d.C}, dtype, device);
  h = Tensor::empty(Shape{d.N(), d.I}, dtype, device);
}

void LayerActivations::allocate(const LayerDims& d, DType dtype, const std::array<int64_t, kLinearModules>& lora_ranks,
                                bool with_dora, Device device, const ElementwiseScratch* shared) {
  const int64_t N = d.N();
  recomputes_elementwise = shared != nullptr;
  if (shared) {
    own_n1 = Tensor(), own_n2 = Tensor(), own_h = Tensor();
    n1 = shared->norm, n2 = shared->norm, h = shared->h;
  } else {
    own_n1 = Tensor::empty(Shape{N, d.C}, dtype, device);
    own_n2 = Tensor::empty(Shape{N, d.C}, dtype, device);
    own_h = Tensor::empty(Shape{N, d.I}, dtype, device);
    n1 = own_n1, n2 = own_n2, h = own_h;
  }
  rstd1 = Tensor::empty(Shape{N}, DType::F32, device);
  q = Tensor::empty(Shape{N, d.H * d.D}, dtype, device);
  k = Tensor::empty(Shape{N, d.KV * d.D}, dtype, device);
  v = Tensor::empty(Shape{N, d.KV * d.D}, dtype, device);
  allocate_attention_output(d, dtype, device);
  rstd2 = Tensor::empty(Shape{N}, DType::F32, device);
  gate = Tensor::empty(Shape{N, d.I}, dtype, device);
  up = Tensor::empty(Shape{N, d.I}, dtype, device);
  xa = with_dora ? std::array<Tensor, kLinearGroups>{} : allocate_group_xa(d, dtype, lora_ranks, device);
  xa_kept = false;
  attention_output_kept = false;
  for (int m = 0; m < kLinearModules; ++m) {
    const bool kept = with_dora && lora_ranks[m] > 0;
    dora[m].xa = kept ? Tensor::empty(Shape{N, lora_ranks[m]}, dtype, device) : Tensor();
    dora[m].z = kept ? Tensor::empty(Shape{N, module_out(d, m)}, dtype, device) : Tensor();
    dora[m].norm = kept ? Tensor::empty(Shape{module_out(d, m)}, DType::F32, device) : Tensor();
  }
}

void LayerActivations::allocate_attention_output(const LayerDims& d, DType dtype, Device device) {
  att = Tensor::empty(Shape{d.N(), d.H * d.D}, dtype, device);
  lse = Tensor::empty(Shape{d.B, d.H, d.T}, DType::F32, device);
  x2 = Tensor::empty(Shape{d.N(), d.C}, dtype, device);
}

std::array<Tensor, kLinearGroups> allocate_group_xa(const LayerDims& d, DType dtype,
                                                    const std::array<int64_t, kLinearModules>& lora_ranks,
                                                    Device device) {
  std::array<Tensor, kLinearGroups> xa;
  for (int group = 0; group < kLinearGroups; ++group) {
    int64_t rank = 0;
    for (int m : group_modules(group)) rank += lora_ranks[m];
    if (rank > 0) xa[group] = Tensor::empty(Shape{d.N(), rank}, dtype, device);
  }
  return xa;
}

int64_t LayerActivations::nbytes() const {
  size_t total = 0;
  // (n1, n2 and h in shared buffers are the pass's, not the layer's; att, lse and x2 may be in host memory)
  for (const Tensor* t : {&rstd1, &q, &k, &v, &att, &lse, &x2, &rstd2, &gate, &up, &own_n1, &own_n2, &own_h})
    if (t->defined()) total += t->nbytes();
  for (const Tensor& t : xa)
    if (t.defined()) total += t.nbytes();  // an absent adapter's empty Tensor has rank 0, numel 1
  for (const Dora& kept : dora)
    for (const Tensor* t : {&kept.xa, &kept.z, &kept.norm})
      if (t->defined()) total += t->nbytes();
  return static_cast<int64_t>(total);
}

namespace {

// `shape` elements of `memory` from element `offset` on, as a Tensor that does not own them.
Tensor borrow_region(const Tensor& memory, int64_t offset, Shape shape) {
  TensorView region = memory.view();
  if (offset + shape.numel() > region.numel()) throw std::logic_error("LayerGradScratch: a region past its buffer");
  region.data = static_cast<char*>(region.data) + static_cast<size_t>(offset) * dtype_size(region.dtype);
  region.shape = shape;
  return Tensor::borrow(region);
}

}  // namespace

void LayerGradScratch::allocate(const LayerDims& d, DType grad_dtype, DType activation_dtype, Device device) {
  const int64_t N = d.N(), q = d.H * d.D, kv = d.KV * d.D;
  norm_or_att_ = Tensor::empty(Shape{N, layer_grad_norm_or_att_columns(d)}, grad_dtype, device);
  mlp_or_qkv_ = Tensor::empty(Shape{N, layer_grad_mlp_or_qkv_columns(d)}, grad_dtype, device);
  d_norm = borrow_region(norm_or_att_, 0, Shape{N, d.C});
  d_att = borrow_region(norm_or_att_, 0, Shape{N, q});
  dh = borrow_region(mlp_or_qkv_, 0, Shape{N, d.I});
  dq = borrow_region(mlp_or_qkv_, 0, Shape{N, q});
  dk = borrow_region(mlp_or_qkv_, N * q, Shape{N, kv});
  dv = borrow_region(mlp_or_qkv_, N * (q + kv), Shape{N, kv});
  if (gate_up_grads_in_place(grad_dtype, activation_dtype)) {
    dgate = Tensor();
    dup = Tensor();
  } else {
    dgate = Tensor::empty(Shape{N, d.I}, grad_dtype, device);
    dup = Tensor::empty(Shape{N, d.I}, grad_dtype, device);
  }
}

std::pair<TensorView, TensorView> LayerGradScratch::gate_up_grads(LayerActivations& a) const {
  if (dgate.defined()) return {dgate.view(), dup.view()};
  if (a.gate.dtype() != dh.dtype()) throw std::logic_error("LayerGradScratch: gate's dtype is not the gradients'");
  return {a.gate.view(), a.up.view()};
}

void attention_inputs_forward(LayerActivations& a, const TensorView& x, const LayerCompute& w, const LayerDims& d,
                              const RopeTable& rope, int64_t position_offset, const TensorView& positions) {
  {
    ScopedSection section("rmsnorm");
    rmsnorm_forward(a.n1, a.rstd1, x, w.input_norm, d.eps);
  }
  const TensorView qkv[] = {a.q, a.k, a.v};
  linear_group_forward(qkv, a.n1, kQkvGroup, w, a);
  ScopedSection section("rope");
  rope_forward(a.q.view().reshaped(heads_shape(d, d.H)), rope, position_offset, positions);
  rope_forward(a.k.view().reshaped(heads_shape(d, d.KV)), rope, position_offset, positions);
}

namespace {

// h = silu(gate(n2)) * up(n2).
void mlp_to_h(LayerActivations& a, const LayerCompute& w) {
  const TensorView gate_up[] = {a.gate, a.up};
  linear_group_forward(gate_up, a.n2, kGateUpGroup, w, a);
  ScopedSection section("swiglu");
  swiglu_forward(a.h, a.gate, a.up);
}

// x2 = x + o_proj(att); n2 = rmsnorm(x2); then h: the layer from a.att up to what the down
// projection reads.
void attention_output_to_h(LayerActivations& a, const TensorView& x, const LayerCompute& w, const LayerDims& d) {
  // o_proj lands in x2, then the residual is added in place (each rounded once, as HF does).
  const TensorView o[] = {a.x2};
  linear_group_forward(o, a.att, kOGroup, w, a);
  {
    ScopedSection section("residual + rmsnorm");
    residual_rmsnorm_forward(a.x2, a.n2, a.rstd2, x, w.post_norm, d.eps);
  }
  mlp_to_h(a, w);
}

void attention_forward_of(LayerActivations& a, const LayerDims& d, const RowSegments& segments) {
  ScopedSection section("attention");
  attention_forward(a.att.view().reshaped(heads_shape(d, d.H)), a.lse, a.q.view().reshaped(heads_shape(d, d.H)),
                    a.k.view().reshaped(heads_shape(d, d.KV)), a.v.view().reshaped(heads_shape(d, d.KV)),
                    segments.segment_start);
}

}  // namespace

void attention_output_mlp_forward(TensorView out, LayerActivations& a, const TensorView& x, const LayerCompute& w,
                                  const LayerDims& d) {
  attention_output_to_h(a, x, w, d);
  const TensorView down[] = {out};
  linear_group_forward(down, a.h, kDownGroup, w, a);
  ScopedSection section("residual + rmsnorm");
  residual_add(out, a.x2, out);
}

void layer_forward(TensorView out, LayerActivations& a, const TensorView& x, const LayerCompute& w,
                   const LayerDims& d, const RopeTable& rope, const RowSegments& segments) {
  attention_inputs_forward(a, x, w, d, rope, 0, segments.positions);
  attention_forward_of(a, d, segments);
  attention_output_mlp_forward(out, a, x, w, d);
}

void layer_recompute(LayerActivations& a, const TensorView& x, const LayerCompute& w, const LayerDims& d,
                     const RopeTable& rope, const RowSegments& segments) {
  for (int m : group_modules(kDownGroup))
    if (w.lora[m] != nullptr && (is_dora(w, m) || !a.xa_kept))
      throw std::logic_error("layer_recompute: the down projection's adapter needs its forward's values");
  attention_inputs_forward(a, x, w, d, rope, 0, segments.positions);
  if (!a.attention_output_kept) {
    attention_forward_of(a, d, segments);
    attention_output_to_h(a, x, w, d);
    return;
  }
  {
    ScopedSection section("rmsnorm");  // residual_rmsnorm_forward's second half: the same bits
    rmsnorm_forward(a.n2, a.rstd2, a.x2, w.post_norm, d.eps);
  }
  mlp_to_h(a, w);
}

void layer_backward(TensorView d_resid, LayerGradScratch& s, LayerActivations& a, const TensorView& x,
                    const LayerCompute& w, const LayerDims& d, const RopeTable& rope, const RowSegments& segments,
                    bool input_gradient) {
  // MLP: out = x2 + down(h), h = silu(gate) * up, gate/up = linear(n2), n2 = rmsnorm(x2).
  if (a.recomputes_elementwise) {
    ScopedSection section("elementwise recompute");
    swiglu_forward(a.h, a.gate, a.up);
  }
  const TensorView d_down[] = {d_resid};
  linear_group_backward(s.dh, false, d_down, a.h, kDownGroup, w, a);
  const auto [dgate, dup] = s.gate_up_grads(a);  // (over gate and up, where LayerGradScratch says)
  {
    ScopedSection section("swiglu bwd");
    swiglu_backward(dgate, dup, s.dh, a.gate, a.up);
  }
  if (a.recomputes_elementwise) {
    ScopedSection section("elementwise recompute");
    rmsnorm_forward(a.n2, a.rstd2, a.x2, w.post_norm, d.eps);
  }
  const TensorView d_gate_up[] = {dgate, dup};
  linear_group_backward(s.d_norm, false, d_gate_up, a.n2, kGateUpGroup, w, a);
  {
    ScopedSection section("rmsnorm + residual bwd");
    // d_resid becomes the gradient of x2 (frozen norm: no dweight)
    rmsnorm_backward_add(d_resid, w.d_post_norm, s.d_norm, a.x2, w.post_norm, a.rstd2);
  }

  // Attention: x2 = x + o(att), att = attention(rope(q), rope(k), v), q/k/v = linear(n1).
  const TensorView d_o[] = {d_resid};
  linear_group_backward(s.d_att, false, d_o, a.att, kOGroup, w, a);
  const Shape q_heads = heads_shape(d, d.H), kv_heads = heads_shape(d, d.KV);
  {
    // RoPE's backward too: inside the attention backward's stores on Hopper, a pass after it elsewhere
    // (timed there as "rope bwd").
    ScopedSection section("attention bwd");
    attention_rope_backward(s.dq.view().reshaped(q_heads), s.dk.view().reshaped(kv_heads),
                            s.dv.view().reshaped(kv_heads), s.d_att.view().reshaped(q_heads),
                            a.q.view().reshaped(q_heads), a.k.view().reshaped(kv_heads), a.v.view().reshaped(kv_heads),
                            a.att.view().reshaped(q_heads), a.lse, rope, 0, segments.positions,
                            segments.segment_start);
  }
  if (a.recomputes_elementwise) {
    ScopedSection section("elementwise recompute");
    rmsnorm_forward(a.n1, a.rstd1, x, w.input_norm, d.eps);
  }
  const TensorView d_qkv[] = {s.dq, s.dk, s.dv};
  linear_group_backward(input_gradient ? s.d_norm.view() : TensorView{}, false, d_qkv, a.n1, kQkvGroup, w, a);
  // The adapters' dB and dA read this layer's activations and gradient buffers: the compute stream
  // waits for them before anything may reuse those.
  if (w.adapter_stream) w.adapter_stream->mark().compute_waits();
  if (!input_gradient) return;
  ScopedSection section("rmsnorm + residual bwd");
  rmsnorm_backward_add(d_resid, w.d_input_norm, s.d_norm, x, w.input_norm, a.rstd1);  // the layer input's gradient
}

}  // namespace fsdpq
