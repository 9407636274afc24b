#include "plan/memory_plan.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <vector>

#include "backend/caching_allocator.h"
#include "config/train_config.h"
#include "model/block_expansion.h"
#include "model/llama_layer.h"
#include "model/llama_model.h"
#include "model/llama_weights.h"
#include "model/precision.h"
#include "fsdp/frozen_layout.h"
#include "model/footprint.h"
#include "model/llama_lm_head.h"
#include "kernels/lora_fused_shape.h"
#include "ops/dora.h"
#include "ops/lora.h"
#include "quant/frozen_format.h"

namespace fsdpq {
namespace {

constexpr int64_t kF32 = 4;

// Sums tensor sizes as the device allocates them: the caching allocator's rounded sizes on the
// GPU, the requested bytes on the host (what the host tensor counter reports).
struct Bytes {
  bool gpu = false;
  int64_t sum = 0;
  void add(int64_t bytes, int64_t count = 1) {
    if (bytes <= 0 || count <= 0) return;
    const int64_t one = gpu ? static_cast<int64_t>(CachingAllocator::rounded_size(static_cast<size_t>(bytes))) : bytes;
    sum += one * count;
  }
};

int64_t rounded(bool gpu, int64_t bytes) {
  Bytes b{gpu};
  b.add(bytes);
  return b.sum;
}

struct Linear {
  std::string name;
  int64_t out = 0, in = 0, rank = 0;  // rank 0: no adapter
};

std::vector<Linear> linears(const PlanInput& p) {
  std::vector<Linear> out;
  for (const std::string& name : linear_module_names()) {
    auto [o, i] = linear_shape(p.model, name);
    const bool adapted = !p.train_base && std::find(p.lora_targets.begin(), p.lora_targets.end(), name) != p.lora_targets.end();
    out.push_back({name, o, i, adapted ? p.lora_rank : 0});
  }
  return out;
}

// The tensors of one FSDP unit, by what they are.
struct UnitShape {
  std::vector<FrozenWeightShape> frozen;
  std::vector<int64_t> trainable;  // numel of each trainable tensor
};

UnitShape root_unit(const PlanInput& p) {
  const LlamaConfig& m = p.model;
  UnitShape u;
  std::vector<int64_t> dense = {m.vocab_size * m.hidden_size, m.hidden_size};
  if (!m.tie_word_embeddings) dense.push_back(m.vocab_size * m.hidden_size);
  for (int64_t n : dense) {
    if (p.train_base)
      u.trainable.push_back(n);
    else
      u.frozen.push_back({&dense_format(p.activation), n});
  }
  return u;
}

// A decoder layer's unit; `new_block`: one of Llama-Pro's, every weight trainable.
UnitShape layer_unit_shape(const PlanInput& p, bool new_block = false) {
  UnitShape u;
  const int64_t C = p.model.hidden_size;
  const bool trains = p.train_base || new_block;
  for (int k = 0; k < 2; ++k) {  // input / post-attention norms
    if (trains)
      u.trainable.push_back(C);
    else
      u.frozen.push_back({&dense_format(p.activation), C});
  }
  for (const Linear& l : linears(p)) {
    if (trains)
      u.trainable.push_back(l.out * l.in);
    else
      u.frozen.push_back(
          {p.quantized ? &quantized_linear_format(p.hqq_bits, p.activation) : &dense_format(p.activation), l.out * l.in});
  }
  for (const Linear& l : linears(p))
    if (l.rank > 0) {
      u.trainable.push_back(l.rank * l.in);   // lora_A [r, in]
      u.trainable.push_back(l.out * l.rank);  // lora_B [out, r]
      if (p.dora) u.trainable.push_back(l.out);  // lora_magnitude_vector [out]
    }
  return u;
}

// A frozen weight's separate allocations: one per segment of its format (NF4 codes, absmax codes,
// absmax group scales; or dense values).
std::vector<int64_t> frozen_allocations(const FrozenWeightShape& w) {
  std::vector<int64_t> sizes;
  for (const SegmentSpec& s : w.format->segments(w.numel)) sizes.push_back(static_cast<int64_t>(s.bytes));
  return sizes;
}

struct UnitBytes {
  int64_t nf4 = 0, dense = 0;  // frozen, whole, as allocated on the device the sum is for
  int64_t nf4_host = 0;        // the NF4 host copy (never rounded)
  int64_t compute = 0;         // trainable tensors in the compute dtype (or fp32 masters under fp32)
  int64_t grads = 0;           // fp32 gradients of every trainable tensor, whole
  int64_t trainable_numel = 0;
  UnitLayout layout;           // flat shards over the shard group
};

UnitBytes unit_bytes(const PlanInput& p, const UnitShape& u, int shard_size, bool gpu) {
  UnitBytes b;
  Bytes nf4{gpu}, dense{gpu}, compute{gpu}, grads{gpu};
  for (const FrozenWeightShape& w : u.frozen) {
    const bool quantized = w.format->quantized();
    for (int64_t a : frozen_allocations(w)) (quantized ? nf4 : dense).add(a);
    if (quantized) b.nf4_host += static_cast<int64_t>(stored_bytes(*w.format, w.numel));
  }
  for (int64_t n : u.trainable) {
    compute.add(n * static_cast<int64_t>(dtype_size(p.activation)));
    grads.add(n * kF32);
    b.trainable_numel += n;
  }
  b.nf4 = nf4.sum;
  b.dense = dense.sum;
  b.compute = compute.sum;
  b.grads = grads.sum;
  b.layout = unit_layout(u.frozen, u.trainable, shard_size);
  return b;
}

int64_t state_buffers(OptimizerKind kind) { return static_cast<int64_t>(optimizer_state_names(kind).size()); }

// Per planned module, the columns its folded buffer adds (model/llama_layer.h's folded_columns), with
// lora_fold() on.
std::vector<int64_t> folded_columns(const PlanInput& p, const std::vector<Linear>& lin) {
  if (!lora_fold()) return std::vector<int64_t>(lin.size(), 0);
  std::array<FoldCandidate, kLinearModules> modules{};
  for (size_t m = 0; m < lin.size() && m < modules.size(); ++m)
    modules[m] = {p.quantized && !p.train_base && !p.dora, lin[m].in, lin[m].rank};
  const std::array<int64_t, kLinearModules> extra = fsdpq::folded_columns(modules);
  std::vector<int64_t> out(lin.size(), 0);
  for (size_t m = 0; m < lin.size() && m < extra.size(); ++m) out[m] = extra[m];
  return out;
}

// The largest buffers the adapter ops allocate for themselves in a layer's forward and backward.
struct OpTemporaries {
  int64_t forward = 0, backward = 0;
  int64_t recompute = 0;  // the forward's in a checkpointed recompute that keeps its xa (only [x | xa]; no down group)
};

// What LoRA's ops allocate for themselves (src/ops/lora.cpp, matmul.cpp, model/llama_layer.cpp), per
// group of modules that share an input. Forward: with dropout, each adapter's dropped copy of the
// input (one pass writes them all); without, the stacked A. Backward: the group's d(xa) (fp32
// [N, Σr]) throughout, with each module's dy cast to the compute dtype in turn (GPU, where the
// activation gradients are fp32: fp16), then for
// the dA and dx GEMMs d(xa) rounded (GPU) beside the dropped copies, then beside every adapter's
// masked product d(xa)_i · A_i (x's dtype, as many bytes as the copies), or beside the stacked A and dA. A group the fused LoRA kernels take
// (GPU, 16-bit, dropout: ops/lora.h) writes no dropped copy: only their fp32 partial sums
// (kernels/lora_fused_shape.h), the forward's split-K ones and the backward's per-chunk dA. A group
// of one module keeps its dy copy through its adapter's part, which runs first. A folded group's
// forward holds [x | xa] [N, in + Σr] beside those: the down product copies x into it.
OpTemporaries lora_temporaries(const PlanInput& p, const std::vector<Linear>& lin, int64_t N) {
  const bool gpu = p.on_gpu, dropout = p.lora_dropout > 0;
  const int64_t a = static_cast<int64_t>(dtype_size(p.activation));
  const int64_t g = static_cast<int64_t>(dtype_size(activation_grad_dtype(p.activation)));
  auto R = [&](int64_t bytes) { return rounded(gpu, bytes); };
  const bool cast = gpu && p.activation != DType::F32;  // d(xa) is rounded for the GEMMs against A
  const bool dy_cast_needed = cast && g == kF32;
  const bool fused_kernels = cast && dropout && gpu_lora_kernels() == GpuLoraKernels::Fused;
  const std::vector<int64_t> folded = folded_columns(p, lin);
  OpTemporaries t;
  for (int group_index = 0; group_index < kLinearGroups; ++group_index) {
    const std::span<const int> group = group_modules(group_index);
    int64_t adapters = 0, rank = 0, dy_cast = 0;
    std::vector<int64_t> ranks;
    const int64_t in = lin[static_cast<size_t>(group[0])].in;
    for (int m : group) {
      const Linear& l = lin[static_cast<size_t>(m)];
      if (dy_cast_needed) dy_cast = std::max(dy_cast, R(N * l.out * a));
      if (l.rank > 0) ++adapters, rank += l.rank, ranks.push_back(l.rank);
    }
    t.backward = std::max(t.backward, dy_cast);
    if (adapters == 0) continue;
    const bool fused = fused_kernels && lora_fused::takes(in, ranks.data(), ranks.size());
    const int64_t stacked = adapters > 1 ? R(rank * in * a) : 0;
    const int64_t dropped_copies = adapters * R(N * in * a);
    const int64_t down = fused     ? R(lora_fused::down_workspace_floats(N, in, rank) * kF32)
                         : dropout ? dropped_copies
                                   : stacked;
    // A folded group's [x | xa] is allocated before its down product, which copies x into it.
    const int64_t wide = folded[static_cast<size_t>(group[0])] > 0 ? R(N * (in + rank) * a) : 0;
    t.forward = std::max(t.forward, wide + down);
    if (group_index != kDownGroup) t.recompute = std::max(t.recompute, wide);  // (layer_recompute stops at h)
    const int64_t dxa = R(N * rank * kF32), dxa_cast = cast ? R(N * rank * a) : 0;
    const int64_t input_phase = fused     ? R(lora_fused::weight_grad_workspace_floats(N, in, rank) * kF32)
                                : dropout ? dropped_copies
                                          : stacked + (adapters > 1 ? R(rank * in * kF32) : 0);
    // A group of one module (o, down) runs its adapter's part first, while its dy copy is held for
    // the base weight's GEMM after it (model/llama_layer.cpp, adapter_first_backward).
    const bool adapter_first = group.size() == 1;
    t.backward = std::max(t.backward, adapter_first ? dxa + dy_cast + dxa_cast + input_phase
                                                    : dxa + std::max(dy_cast, dxa_cast + input_phase));
  }
  return t;
}

// What a DoRA linear's ops allocate for themselves (src/ops/dora.cpp, and the LoRA op it calls
// as a group of one), the largest over the adapted modules. Forward: the weight norm's fp32 block
// of rows (at most kDoraNormChunkBytes) and then g, the dropped input copy (dropout: DoRA's and
// LoRA's own). Backward: g and dy ⊙ g, then with dropout (g − 1) ⊙ dy and the fp32 gradient at the
// dropped input, or LoRA's d(xa) (fp32, rounded on the GPU) beside its dropped copy or its product.
OpTemporaries dora_temporaries(const PlanInput& p, const std::vector<Linear>& lin, int64_t N) {
  const bool gpu = p.on_gpu, dropout = p.lora_dropout > 0;
  const int64_t a = static_cast<int64_t>(dtype_size(p.activation));
  const int64_t g = static_cast<int64_t>(dtype_size(activation_grad_dtype(p.activation)));
  auto R = [&](int64_t bytes) { return rounded(gpu, bytes); };
  OpTemporaries t;
  for (const Linear& l : lin) {
    if (l.rank == 0) continue;
    const int64_t norm_block = R(dora_norm_chunk_rows(l.out, l.in) * l.in * kF32), scale = R(l.out * kF32);
    const int64_t dropped = dropout ? R(N * l.in * a) : 0;
    t.forward = std::max({t.forward, norm_block, scale + 2 * dropped});
    const int64_t dy_g = R(N * l.out * g);
    const int64_t base_dropped = dropout ? R(N * l.out * g) + R(N * l.in * kF32) : 0;
    const int64_t dxa = R(N * l.rank * kF32) + (gpu && p.activation != DType::F32 ? R(N * l.rank * a) : 0);
    const int64_t lora = dxa + (dropout ? R(N * l.in * a) : 0);
    t.backward = std::max(t.backward, scale + dy_g + std::max(base_dropped, lora));
  }
  t.recompute = t.forward;  // DoRA's recompute draws its masks again
  return t;
}

// allocate_group_xa (model/llama_layer.h): one [N, Σr] per group of modules that share an input;
// none under DoRA.
int64_t group_xa_bytes(const PlanInput& p, const std::vector<Linear>& lin, int64_t N) {
  const int64_t a = static_cast<int64_t>(dtype_size(p.activation));
  Bytes xa{p.on_gpu};
  for (int g = 0; g < kLinearGroups && !p.dora; ++g) {
    int64_t rank = 0;
    for (int module : group_modules(g)) rank += lin[static_cast<size_t>(module)].rank;  // indices into linear_module_names()
    if (rank > 0) xa.add(N * rank * a);
  }
  return xa.sum;
}

// LayerActivations::allocate: what one decoder layer keeps for its backward.
int64_t layer_activation_bytes(const PlanInput& p, const std::vector<Linear>& lin, int64_t N) {
  const LlamaConfig& m = p.model;
  const int64_t B = p.setting.batch_size, T = p.context_length;
  const int64_t C = m.hidden_size, H = m.num_attention_heads, KV = m.num_key_value_heads, D = m.head_dim;
  const int64_t I = m.intermediate_size;
  const int64_t a = static_cast<int64_t>(dtype_size(p.activation));
  const bool own_elementwise = !p.setting.recompute_elementwise;  // n1, n2, h kept, else shared
  Bytes layer{p.on_gpu};
  if (own_elementwise) layer.add(N * C * a);  // n1
  layer.add(N * kF32);             // rstd1
  layer.add(N * H * D * a);        // q
  layer.add(N * KV * D * a, 2);    // k, v
  layer.add(N * H * D * a);        // att
  layer.add(B * H * T * kF32);     // lse
  layer.add(N * C * a, own_elementwise ? 2 : 1);  // x2, n2
  layer.add(N * kF32);             // rstd2
  layer.add(N * I * a, own_elementwise ? 3 : 2);  // gate, up, h
  // xa: one [N, Σr] per group of modules that share an input (group_xa_bytes); under DoRA
  // one [N, r] per module instead, beside its output before the magnitude scales it z [N, out]
  // and its weight norm (fp32 [out]).
  layer.sum += group_xa_bytes(p, lin, N);
  for (const Linear& l : lin)
    if (p.dora && l.rank > 0) {
      layer.add(N * l.rank * a);
      layer.add(N * l.out * a);
      layer.add(l.out * kF32);
    }
  return layer.sum;
}

// LayerGradScratch::allocate: one layer's activation gradients during its backward.
int64_t layer_grad_scratch_bytes(const PlanInput& p, int64_t N) {
  const LlamaConfig& m = p.model;
  const int64_t C = m.hidden_size, H = m.num_attention_heads, KV = m.num_key_value_heads, D = m.head_dim;
  const int64_t I = m.intermediate_size;
  const int64_t g = static_cast<int64_t>(dtype_size(activation_grad_dtype(p.activation)));
  LayerDims d;
  d.C = C, d.H = H, d.KV = KV, d.D = D, d.I = I;
  Bytes scratch{p.on_gpu};
  scratch.add(N * layer_grad_norm_or_att_columns(d) * g);  // d_norm, d_att over it
  scratch.add(N * layer_grad_mlp_or_qkv_columns(d) * g);   // dh, dq / dk / dv over it
  // dgate and dup where they do not overwrite gate and up
  if (!gate_up_grads_in_place(activation_grad_dtype(p.activation), p.activation)) scratch.add(N * I * g, 2);
  return scratch.sum;
}

}  // namespace

PlanInput plan_input_from(const TrainConfig& c, const LlamaConfig& model, int world_size) {
  PlanInput p;
  p.model = BlockExpansion(model.num_hidden_layers, c.llama_pro() ? c.llama_pro_num_new_blocks : 0).expanded(model);
  p.quantized = c.quantized_base();
  p.hqq_bits = c.hqq_base() ? static_cast<int>(c.n_bits) : 0;
  p.train_base = c.full_finetune();
  p.new_blocks = c.llama_pro() ? c.llama_pro_num_new_blocks : 0;
  p.lora_rank = c.lora_rank;
  if (c.is_lora()) p.lora_targets = c.lora_target_modules;
  p.lora_dropout = c.lora_dropout;
  p.dora = c.dora();
  p.activation = activation_dtype(c.choice.precision);
  p.optimizer = c.choice.optimizer;
  p.context_length = c.context_length;
  p.world_size = world_size;
  p.ranks_per_node = static_cast<int>(c.ranks_per_node);
  p.setting.strategy = c.choice.sharding;
  p.setting.gradient_checkpointing = c.use_gradient_checkpointing;
  p.setting.checkpoint_every = c.checkpoint_every;
  p.setting.keep_activation_layers = c.keep_activation_layers;
  p.setting.recompute_elementwise = c.recompute_elementwise;
  p.setting.keep_dequantized_layers = c.keep_dequantized_layers;
  p.setting.cpu_offload = c.use_cpu_offload;
  p.setting.activation_offload = c.use_activation_cpu_offload;
  p.setting.batch_size = c.batch_size;
  return p;
}

ActivationBytes activation_bytes(const PlanInput& p) {
  const LlamaConfig& m = p.model;
  const bool gpu = p.on_gpu;
  const int64_t B = p.setting.batch_size, T = p.context_length, N = B * T, L = m.num_hidden_layers;
  const int64_t C = m.hidden_size, D = m.head_dim, V = m.vocab_size;
  const int64_t a = static_cast<int64_t>(dtype_size(p.activation));
  const int64_t g = static_cast<int64_t>(dtype_size(activation_grad_dtype(p.activation)));
  const std::vector<Linear> lin = linears(p);
  auto R = [&](int64_t bytes) { return rounded(gpu, bytes); };
  ActivationBytes x;

  x.layer = layer_activation_bytes(p, lin, N);
  // Checkpointing keeps the activations of the layers it does not recompute
  // (model/checkpoint_policy.h), plus one buffer the recomputed layers share.
  const CheckpointPolicy policy{p.setting.gradient_checkpointing, p.setting.checkpoint_every,
                                p.setting.keep_activation_layers};
  const int64_t recomputed_layers = policy.recomputed_layers(L);
  x.kept_layers = L - recomputed_layers + (recomputed_layers > 0 ? 1 : 0);
  // Each recomputed layer keeps its xa, and the buffer the recomputed layers share has none.
  if (recomputed_layers > 0) x.checkpointed_xa = (recomputed_layers - 1) * group_xa_bytes(p, lin, N);
  if (p.setting.recompute_elementwise) x.shared_elementwise = R(N * C * a) + R(N * m.intermediate_size * a);

  // The residual stream of a training pass (L + 1 layer inputs) and the token ids.
  const int64_t ids = R(N * 4), one_input = R(N * C * a);
  x.stream = ids + (L + 1) * one_input;
  x.stream_on_device = p.setting.activation_offload ? ids + 3 * one_input : x.stream;
  x.offloaded = p.setting.activation_offload ? (L - 1) * N * C * a : 0;
  // Activation offload sends some layers' attention output and x2 too (CheckpointPolicy's rule):
  // the layers keeping their own hold the rest on the device, and one more is on its way at a time
  // (model/activation_offload.h).
  const int64_t H = m.num_attention_heads;
  const int64_t attention_output = R(N * H * D * a) + R(B * H * T * kF32) + R(N * C * a);
  const bool offloading = p.setting.activation_offload && p.setting.gradient_checkpointing;
  auto sent = [&](int64_t i) { return offloading && i >= 0 && policy.offloads_attention_output(i, L, p.dora); };
  // What layer i sends besides its input: one copy moves it in each direction at a time.
  auto parts = [&](int64_t i) { return sent(i) ? attention_output : 0; };
  for (int64_t i = 0; i < L; ++i) {
    if (!sent(i)) continue;
    x.offloaded += N * H * D * a + B * H * T * kF32 + N * C * a;
    if (!policy.recomputes(i, L)) x.kept_offloaded += attention_output;
    x.offload_spare = attention_output;
  }

  if (p.quantized && !p.train_base) {
    const std::vector<int64_t> folded = folded_columns(p, lin);
    for (size_t i = 0; i < lin.size(); ++i) x.dequantized += R(lin[i].out * (lin[i].in + folded[i]) * a);
    // That is one layer's: the buffers the layers share, while a quantised layer is not among the
    // last keep_dequantized_layers, and each of those its own (Llama-Pro's new blocks are dense).
    const BlockExpansion expansion(L - p.new_blocks, p.new_blocks);
    const int64_t first_kept = L - std::min(p.setting.keep_dequantized_layers, L);
    int64_t kept = 0;
    bool shared = false;
    for (int64_t layer = 0; layer < L; ++layer) {
      if (expansion.is_new(layer)) continue;
      if (layer >= first_kept)
        ++kept;
      else
        shared = true;
    }
    x.dequantized *= kept + (shared ? 1 : 0);
  }
  x.rope = 2 * R(T * D * kF32);

  // The head: normed + rstd, d_normed, one chunk of logits (+1 spare row), and every chunk's labels
  // and row losses (model/llama_lm_head.cpp).
  const int64_t chunk = lm_head_chunk_rows(V, N), chunks = (N + chunk - 1) / std::max<int64_t>(chunk, 1);
  const int64_t normed = R(N * C * a), final_rstd = R(N * kF32), d_normed = R(N * C * g);
  // (On the CPU backend the row losses' copy for the host, made while the rest is alive, counts too.)
  const int64_t logits = R((chunk + 1) * V * a) + (gpu ? 2 : 3) * R(chunks * (chunk + 1) * 4);
  const int64_t d_resid = R(N * C * g);
  x.lm_head = normed + final_rstd + d_normed + logits;

  // LayerGradScratch::allocate, d_resid, the recompute's output (DoRA's: the others stop at h).
  const int64_t recompute = p.setting.gradient_checkpointing && p.dora ? one_input : 0;
  x.grad_scratch = layer_grad_scratch_bytes(p, N) + d_resid + recompute + final_rstd;

  const OpTemporaries temporaries = p.dora ? dora_temporaries(p, lin, N) : lora_temporaries(p, lin, N);
  const int64_t forward_temp = temporaries.forward, backward_temp = temporaries.backward;
  x.op_temporary = std::max(forward_temp, backward_temp);

  // Gradients the engine allocates per unit at its backward (fp32, whole): the layer's, and the
  // root's (full fine-tuning: embedding, final norm, head) for the whole backward.
  int64_t layer_grads = 0, root_grads = 0;
  if (p.grads_per_unit) {
    layer_grads = unit_bytes(p, layer_unit_shape(p), 1, gpu).grads;
    if (p.new_blocks > 0) layer_grads = std::max(layer_grads, unit_bytes(p, layer_unit_shape(p, true), 1, gpu).grads);
    root_grads = unit_bytes(p, root_unit(p), 1, gpu).grads;
  }
  x.unit_grads = layer_grads + root_grads;

  // What the layers hold once the forward is done (the head's time; nothing is on its way then).
  const int64_t kept = x.stream_on_device + x.kept_layers * x.layer - x.kept_offloaded + x.checkpointed_xa +
                       x.shared_elementwise + x.dequantized + x.rope;
  // The forward, layer by layer: a layer's buffers are made as it reaches them (the shared one's, at
  // a recomputed layer, anew for what the previous one sent; each recomputed layer's xa of its own),
  // a kept layer's attention output leaves after its forward, and the previous layer's sent parts
  // are on their way out.
  const int64_t xa_bytes = group_xa_bytes(p, lin, N);
  int64_t own_bytes = 0, xa_made = 0, shared_lacks = 0;
  bool shared_made = false;
  x.forward_peak = 0;
  for (int64_t j = 0; j < L; ++j) {
    const bool own = !policy.recomputes(j, L);
    if (own) {
      own_bytes += x.layer;
    } else {
      shared_made = true;
      shared_lacks = 0;
      xa_made += xa_bytes;
    }
    const int64_t held = x.stream_on_device + x.shared_elementwise + x.dequantized + x.rope + own_bytes +
                         (shared_made ? x.layer - xa_bytes - shared_lacks : 0) + xa_made + parts(j - 1);
    x.forward_peak = std::max(x.forward_peak, held + forward_temp);
    if (own && sent(j)) own_bytes -= attention_output;
    if (!own) shared_lacks = parts(j);
  }
  x.head_peak = kept + root_grads + normed + final_rstd + d_normed + std::max(logits, d_resid);
  // The backward meets the forward's temporaries again only in a layer it recomputes: the last of
  // the recomputed layers is not, its activations still in their shared buffer from the forward.
  // Layer i's att, lse and x2 are back for its backward, and layer i - 1's sent parts on their way
  // back beside it; a layer keeping its own activations lets them go after it, and a recomputed
  // layer its xa.
  const int64_t last_recomputed = policy.last_recomputed(L);
  x.backward_peak = 0;
  int64_t let_go = 0;  // by the layers whose backward is done
  for (int64_t i = L - 1; i >= 0; --i) {
    const bool own = !policy.recomputes(i, L);
    const int64_t held = kept - let_go + parts(i - 1) + (own && sent(i) ? attention_output : 0);
    const bool recomputes = !own && i != last_recomputed;
    const int64_t temp = std::max(recomputes ? temporaries.recompute : 0, backward_temp);
    x.backward_peak = std::max(x.backward_peak, held + root_grads + layer_grads + x.grad_scratch + temp);
    let_go += own ? x.layer - (sent(i) ? attention_output : 0) : xa_bytes;  // a kept layer's own, a recomputed one's xa
  }
  x.peak = std::max({x.forward_peak, x.head_peak, x.backward_peak});
  x.transient_peak = x.peak - x.dequantized - x.rope;
  return x;
}

namespace {

// What one unit costs where it computes (`gpu`) and on the host, for each kind of unit: the root,
// a decoder layer, and a Llama-Pro new block (trainable; `new_blocks` of the layers are).
struct UnitCosts {
  UnitBytes root, layer, new_block;                 // where the model computes
  UnitBytes root_host, layer_host, new_block_host;  // their host-side counterparts
  int64_t layers = 0, new_blocks = 0;               // decoder layers, of which new blocks

  // Σ over the decoder layers of `f` of their bytes (where they compute, or on the host).
  template <class F>
  int64_t sum_layers(const F& f, bool host = false) const {
    return (layers - new_blocks) * f(host ? layer_host : layer) + new_blocks * f(host ? new_block_host : new_block);
  }
  // The largest `f` of one decoder layer.
  template <class F>
  int64_t largest_layer(const F& f, bool host = false) const {
    const int64_t frozen = layers > new_blocks ? f(host ? layer_host : layer) : 0;
    return new_blocks > 0 ? std::max(frozen, f(host ? new_block_host : new_block)) : frozen;
  }
};

UnitCosts unit_costs(const PlanInput& p, int shard_size, bool gpu) {
  UnitCosts u;
  u.root = unit_bytes(p, root_unit(p), shard_size, gpu);
  u.layer = unit_bytes(p, layer_unit_shape(p), shard_size, gpu);
  u.new_block = unit_bytes(p, layer_unit_shape(p, true), shard_size, gpu);
  u.root_host = unit_bytes(p, root_unit(p), shard_size, false);
  u.layer_host = unit_bytes(p, layer_unit_shape(p), shard_size, false);
  u.new_block_host = unit_bytes(p, layer_unit_shape(p, true), shard_size, false);
  u.layers = p.model.num_hidden_layers;
  u.new_blocks = p.new_blocks;
  return u;
}

// Fields of UnitBytes as functions, for UnitCosts' sums.
int64_t frozen_bytes(const UnitBytes& b) { return static_cast<int64_t>(b.layout.frozen_bytes); }
int64_t compute_bytes(const UnitBytes& b) { return b.compute; }
int64_t quantized_bytes(const UnitBytes& b) { return b.nf4; }
int64_t dense_bytes(const UnitBytes& b) { return b.dense; }
int64_t frozen_on_device(const UnitBytes& b) { return b.nf4 + b.dense; }
int64_t quantized_host_bytes(const UnitBytes& b) { return b.nf4_host; }
int64_t trainable_numel(const UnitBytes& b) { return b.layout.trainable_numel; }

// The rows of the prediction's table: where the compute happens (the GPU, or the host for the CPU
// backend) and the host beside it.
class ItemList {
 public:
  explicit ItemList(bool gpu) : gpu_(gpu) {}
  void add(const std::string& what, int64_t compute_side, int64_t host_side) {
    MemoryItem item{what, gpu_ ? compute_side : 0, host_side + (gpu_ ? 0 : compute_side)};
    if (item.gpu || item.host) items_.push_back(item);
  }
  std::vector<MemoryItem> take() { return std::move(items_); }

 private:
  bool gpu_;
  std::vector<MemoryItem> items_;
};

// Where the frozen and compute weights live under one placement, and what they add to each peak.
struct WeightTotals {
  int64_t persistent_compute = 0;  // for the whole run, where the model computes
  int64_t gathered_compute = 0;    // for a unit's pass (gathered units, collective buffers)
  int64_t host_weights = 0, host_gather = 0;
  int64_t load_peak = 0;           // the host while the model is built
};

// use_cpu_offload on a rank holding whole units (fsdp/frozen_offload.h): each layer's frozen bytes
// wait in pinned host memory and come to the GPU one unit ahead of use (the current layer and the
// next; the root stays). The host also holds each unit's gradients copied out and compute copies
// going back (fsdp/host_offload_scheduler.h).
WeightTotals offloaded_resident_weights(const PlanInput& p, const UnitCosts& u, int64_t building, int64_t host_state,
                                        ItemList& items) {
  const int64_t L = p.model.num_hidden_layers;
  const int64_t layers_on_gpu = std::min<int64_t>(2, L);
  const int64_t frozen_host = u.sum_layers(frozen_bytes, true);
  const int64_t compute = u.root.compute + u.sum_layers(compute_bytes);
  items.add("frozen dense weights (embedding, head, final norm)", u.root.dense + u.root.nf4, 0);
  items.add("frozen layer weights: " + std::to_string(layers_on_gpu) + " layers on the GPU, all in pinned host memory",
            layers_on_gpu * u.largest_layer(frozen_on_device), frozen_host);
  items.add(p.activation == DType::F32 ? "trainable fp32 weights (computed with)" : "trainable compute copies", compute, 0);
  const int64_t staging = (u.root_host.layout.trainable_numel + u.sum_layers(trainable_numel, true)) *
                          (kF32 + static_cast<int64_t>(dtype_size(p.activation)));
  items.add("gradient / compute-copy staging (pinned)", 0, staging);
  WeightTotals t;
  t.persistent_compute = u.root.dense + u.root.nf4 + compute;
  t.gathered_compute = layers_on_gpu * u.largest_layer(frozen_on_device);
  t.host_weights = frozen_host + staging;
  t.load_peak = frozen_host + u.root_host.dense + u.root_host.compute + u.sum_layers(compute_bytes, true) + building +
                host_state + staging;
  return t;
}

// A rank holding whole units: the whole model stays where it computes; NF4 host copies stay too
// (BaseWeight::place_on).
WeightTotals resident_weights(const PlanInput& p, const UnitCosts& u, bool gpu, int64_t building, int64_t host_state,
                              ItemList& items) {
  const int64_t frozen_nf4 = u.sum_layers(quantized_bytes), frozen_dense = u.root.dense + u.sum_layers(dense_bytes);
  const int64_t compute = u.root.compute + u.sum_layers(compute_bytes);
  const int64_t nf4_host = u.sum_layers(quantized_host_bytes, true);
  items.add(p.hqq_bits ? "frozen HQQ weights" : "frozen NF4 weights", frozen_nf4, gpu ? nf4_host : 0);
  items.add("frozen dense weights (embedding, head, norms" + std::string(p.quantized ? ")" : ", linears)"),
            frozen_dense, 0);
  items.add(p.activation == DType::F32 ? "trainable fp32 weights (computed with)" : "trainable compute copies", compute, 0);
  WeightTotals t;
  t.persistent_compute = frozen_nf4 + frozen_dense + compute;
  t.host_weights = gpu ? nf4_host : 0;
  // Loading builds every unit on the host first, then places the model on the GPU.
  const int64_t host_all = nf4_host + u.root_host.dense + u.sum_layers(dense_bytes, true) + u.root_host.compute +
                           u.sum_layers(compute_bytes, true);
  t.load_peak = host_all + building + host_state;
  return t;
}

// Shard groups of several ranks: each rank keeps its shard ([frozen | compute] bytes a gather
// sends): on the GPU beside its state, in (pinned) host memory with use_cpu_offload or on the CPU
// backend. Units are gathered for compute: the root always, the current unit and one prefetched
// (shard_grad_op: every unit from its forward until its backward).
WeightTotals sharded_weights(const PlanInput& p, const UnitCosts& u, int S, bool gpu, bool state_gpu,
                             int64_t host_state, ItemList& items) {
  const int64_t L = p.model.num_hidden_layers;
  const auto chunk = [&](const UnitBytes& b) {
    return static_cast<int64_t>(b.layout.frozen_shard_bytes + b.layout.shard_numel * dtype_size(p.activation));
  };
  const auto gathered = [](const UnitBytes& b) { return b.nf4 + b.dense + b.compute; };
  WeightTotals t;
  const int64_t shards = chunk(u.root_host) + u.sum_layers(chunk, true);
  const bool keeps_gathered = !reshards_after_forward(p.setting.strategy);
  const int64_t layers_in_flight = keeps_gathered ? L : std::min<int64_t>(2, L);
  const int64_t one_root = gathered(u.root);
  t.gathered_compute = one_root + (keeps_gathered ? u.sum_layers(gathered) : layers_in_flight * u.largest_layer(gathered));
  items.add("gathered units (root + " + std::to_string(layers_in_flight) + " layer" + (layers_in_flight == 1 ? "" : "s") +
                ")",
            t.gathered_compute, 0);
  if (state_gpu) {
    t.persistent_compute =
        rounded(true, chunk(u.root)) + u.sum_layers([&](const UnitBytes& b) { return rounded(true, chunk(b)); });
    items.add("this rank's shards of the weights", t.persistent_compute, 0);
  } else {
    t.host_weights = shards;
    items.add("this rank's shards of the weights", 0, shards);
  }
  // The collectives' buffers, where the model computes: the all-gather's output (one unit × S;
  // with offload also the host shard's copy in) and the reduce-scatter's packed gradients and
  // reduced shard; with offload the reduced shard's host copy.
  // (Sized for the largest layer: a Llama-Pro new block's when there are any.)
  const int64_t largest_chunk = u.largest_layer(chunk, true);
  const int64_t shard_numel = u.largest_layer([](const UnitBytes& b) { return b.layout.shard_numel; }, true);
  const int64_t recv = largest_chunk * S + (gpu && p.setting.cpu_offload ? largest_chunk : 0);
  const int64_t packed = shard_numel * S * kF32 + shard_numel * kF32;
  const int64_t reduced_host = gpu && p.setting.cpu_offload ? shard_numel * kF32 : 0;
  items.add("gather / reduce buffers", recv + packed, reduced_host);
  if (gpu) {
    t.gathered_compute += recv + packed;
    t.host_gather = reduced_host;
  } else {
    t.host_gather = recv + packed;
  }
  // The shard loader builds one unit's shard at a time (read in the load dtype); on the GPU
  // without offload each goes to the device as it is built.
  t.load_peak = t.host_weights + host_state +
                u.largest_layer([](const UnitBytes& b) { return static_cast<int64_t>(b.layout.frozen_shard_bytes); }, true) * 2;
  return t;
}

}  // namespace

MemoryPrediction predict_memory(const PlanInput& p) {
  if (p.world_size < 1) throw std::logic_error("predict_memory: world_size < 1");
  if (p.setting.batch_size < 1 || p.context_length < 1) throw std::logic_error("predict_memory: empty batch");
  MemoryPrediction r;
  const int S = shard_group_size(p.setting.strategy, p.world_size, p.ranks_per_node);
  r.shard_size = S;
  r.ranks_per_node = p.ranks_per_node > 0 ? std::min(p.ranks_per_node, p.world_size) : p.world_size;
  const bool gpu = p.on_gpu, resident = S == 1;
  const bool state_on_host = !gpu || p.setting.cpu_offload;
  const int64_t k = state_buffers(p.optimizer);
  if (p.new_blocks < 0 || p.new_blocks >= p.model.num_hidden_layers)
    throw std::logic_error("predict_memory: new_blocks must be fewer than the model's layers");
  const UnitCosts u = unit_costs(p, S, gpu);
  r.activations = activation_bytes(p);
  const ActivationBytes& act = r.activations;
  ItemList items(gpu);

  // Optimizer state of this rank's shards: fp32 master, gradient, k buffers (one allocation each per unit).
  auto shard_state = [&](const UnitBytes& b, bool on_gpu_now, int64_t buffers) {
    return rounded(on_gpu_now, b.layout.shard_numel * kF32) * buffers;
  };
  const bool state_gpu = gpu && !p.setting.cpu_offload;
  auto all_units_state = [&](bool on_gpu_now, int64_t buffers) {
    const auto one = [&](const UnitBytes& b) { return shard_state(b, on_gpu_now, buffers); };
    return one(on_gpu_now ? u.root : u.root_host) + u.sum_layers(one, !on_gpu_now);
  };
  const int64_t state_dev = state_gpu ? all_units_state(true, 2 + k) : 0;
  // The engine always keeps a host copy of its master shard (staging for gathers and checkpoints).
  const int64_t master_host = all_units_state(false, 1);
  const int64_t state_host = state_on_host ? all_units_state(false, 1 + k) : 0;

  // A rank holding whole units builds each on the host (its gradients and compute copy included).
  const auto built = [](const UnitBytes& b) { return b.grads + b.compute; };
  const int64_t building = std::max(built(u.root_host), u.largest_layer(built, true));
  const WeightTotals w =
      resident && gpu && p.setting.cpu_offload
          ? offloaded_resident_weights(p, u, building, master_host + state_host, items)
          : resident ? resident_weights(p, u, gpu, building, master_host + state_host, items)
                     : sharded_weights(p, u, S, gpu, state_gpu, master_host + state_host, items);
  items.add("fp32 masters (engine's host copy)", 0, master_host);
  if (state_gpu) items.add("fp32 masters + grads + optimizer state (" + std::to_string(k) + " buffers), shards", state_dev, 0);
  if (state_on_host) items.add("fp32 grads + optimizer state (" + std::to_string(k) + " buffers), shards", 0, state_host);

  items.add("activations: residual stream (layer inputs)", act.stream_on_device, 0);
  if (p.setting.activation_offload)
    items.add("activations: offloaded layer inputs and attention outputs (pinned; the one in flight on the GPU)",
              act.offload_spare, act.offloaded);
  items.add("activations: " + std::to_string(act.kept_layers) + " layer" + (act.kept_layers == 1 ? "" : "s") +
                " kept for backward" + (act.kept_offloaded > 0 ? " (less their offloaded attention outputs)" : ""),
            act.kept_layers * act.layer - act.kept_offloaded, 0);
  if (act.checkpointed_xa > 0) items.add("activations: the recomputed layers' LoRA xa", act.checkpointed_xa, 0);
  if (act.shared_elementwise > 0)
    items.add("activations: norm outputs and SwiGLU product, recomputed (one set)", act.shared_elementwise, 0);
  items.add(p.setting.keep_dequantized_layers > 0
                ? fmt::format("dequantised NF4 layers (the last {} kept dense) + RoPE tables",
                              std::min(p.setting.keep_dequantized_layers, p.model.num_hidden_layers))
                : std::string("dequantised NF4 layer + RoPE tables"),
            act.dequantized + act.rope, 0);
  items.add("peak pass workspace (head / grad scratch / op temporaries / unit grads)",
            act.peak - act.stream_on_device - act.offload_spare - (act.kept_layers * act.layer - act.kept_offloaded) -
                act.checkpointed_xa -
                act.shared_elementwise -
                act.dequantized -
                act.rope,
            0);
  r.items = items.take();

  // Host-side activation copies for offload; the CPU backend holds everything there.
  const int64_t offloaded = act.offloaded;
  if (gpu) {
    r.gpu_after_load = w.persistent_compute + state_dev;
    r.gpu_peak = w.persistent_compute + state_dev + w.gathered_compute + act.peak;
    r.gpu_required = static_cast<int64_t>(static_cast<double>(r.gpu_peak) * (1 + kAllocatorSlack)) + kCudaContextBytes;
    const int64_t train_host = w.host_weights + w.host_gather + master_host + state_host + offloaded + act.rope / 2;
    r.host_per_rank = kHostProcessBytes + std::max(w.load_peak, train_host);
  } else {
    const int64_t train_host = w.persistent_compute + w.gathered_compute + w.host_weights + w.host_gather + master_host +
                               state_host + act.peak;
    r.host_per_rank = kHostProcessBytes + std::max(w.load_peak, train_host);
  }
  r.host_per_node = r.host_per_rank * r.ranks_per_node;
  return r;
}

namespace {

// The largest n in 0 … layers for which fits(n), given that fits(0) holds (or 0) and that memory
// grows with n: a binary search.
template <class Fits>
int64_t most_last_layers(int64_t layers, const Fits& fits) {
  int64_t lo = 0, hi = layers;  // lo fits
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// A checkpointing step that fits: at its batch, recompute as few layers as still fit (the largest
// checkpoint_every of 2, 4, 8 ... up to the layer count), since each recomputed layer costs a
// forward; at each, the kept layers' activations whole first, then trimmed (recompute_elementwise:
// two RMSNorms and a SwiGLU per layer cost far less than the next halving's extra recomputed
// layers). Memory falls along that order, so the search stops at the first that fits. Where even
// checkpoint_every 2 does not fit, the memory left keeps the last layers' activations
// (keep_activation_layers), one layer at a time: whole, or trimmed where that keeps more of them,
// by more than one layer in 10 (a trimmed layer's SwiGLU and two RMSNorms cost at most ~10% of a
// layer's recompute: −2% on a 7B step for all 32 layers, ~0.36 ms a layer at 8k tokens against
// ~3.6 ms, bench/RESULTS.md 2026-12-05, before SwiGLU's faster kernels; each layer not recomputed
// is +0.6% at ctx 2048, bs 8, stop 44).
template <class Fits>
void recompute_fewer_layers(GuideStep& g, PlanInput in, const Fits& fits) {
  in.setting = g.setting;
  const int64_t layers = in.model.num_hidden_layers;
  int64_t largest = 1;
  while (largest * 2 <= layers) largest *= 2;
  for (int64_t every = largest; every >= 2; every /= 2)
    for (bool trimmed : {false, true}) {
      in.setting.checkpoint_every = every;
      in.setting.recompute_elementwise = trimmed;
      MemoryPrediction m = predict_memory(in);
      if (!fits(m)) continue;
      g.setting = in.setting;
      g.prediction = std::move(m);
      return;
    }
  // None of those fits: every layer stays recomputed but the last n keep their activations, as many
  // as fit (keep_activation_layers).
  auto most_kept = [&](bool trimmed) {
    in.setting = g.setting;
    in.setting.recompute_elementwise = trimmed;
    return most_last_layers(layers, [&](int64_t n) {
      in.setting.keep_activation_layers = n;
      return n == 0 || fits(predict_memory(in));  // (none kept: the step's own setting, which fits)
    });
  };
  const int64_t whole = most_kept(false), trimmed = most_kept(true);
  const bool trims = (trimmed - whole) * 10 > trimmed;
  const int64_t kept = trims ? trimmed : whole;
  if (kept == 0) return;
  in.setting = g.setting;
  in.setting.recompute_elementwise = trims;
  in.setting.keep_activation_layers = kept;
  g.setting = in.setting;
  g.prediction = predict_memory(in);
}

// A step that fits, on a quantised base: keep the dense weights of as many of the last layers as
// the GPU memory left allows (keep_dequantized_layers: each saves its backward's dequantisation;
// they live on the GPU, so the host's fit does not change).
void keep_dense_layers(GuideStep& g, PlanInput in, int64_t gpu_bytes) {
  in.setting = g.setting;
  const int64_t kept = most_kept_dense_layers(in, gpu_bytes);
  if (kept == 0) return;
  in.setting.keep_dequantized_layers = kept;
  g.setting = in.setting;
  g.prediction = predict_memory(in);
}

}  // namespace

GuideResult walk_guide(const PlanInput& base, int64_t gpu_bytes, int64_t host_bytes, int64_t max_batch) {
  if (max_batch < 1) throw std::logic_error("walk_guide: max_batch < 1");
  struct Step {
    const char* name;
    ShardingStrategy strategy;
    bool checkpointing, cpu_offload, activation_offload, recompute_elementwise = false;
  };
  const Step steps[] = {
      {"DDP", ShardingStrategy::Ddp, false, false, false},
      {"+ selective recompute", ShardingStrategy::Ddp, false, false, false, true},
      {"+ gradient checkpointing", ShardingStrategy::Ddp, true, false, false},
      {"shard_grad_op", ShardingStrategy::ShardGradOp, true, false, false},
      {"full_shard", ShardingStrategy::FullShard, true, false, false},
      {"+ CPU offload", ShardingStrategy::FullShard, true, true, false},
      {"+ activation offload", ShardingStrategy::FullShard, true, true, true},
  };
  GuideResult result;
  for (const Step& s : steps) {
    GuideStep g;
    g.name = s.name;
    PlanInput in = base;
    in.setting = {s.strategy, s.checkpointing, s.cpu_offload, s.activation_offload, 1};
    in.setting.recompute_elementwise = s.recompute_elementwise;
    auto fits = [&](const MemoryPrediction& m) {
      return m.gpu_required <= gpu_bytes && (host_bytes <= 0 || m.host_per_node <= host_bytes);
    };
    g.setting = in.setting;
    g.prediction = predict_memory(in);
    for (int64_t bs = 1; bs <= max_batch; bs *= 2) {
      in.setting.batch_size = bs;
      MemoryPrediction m = predict_memory(in);
      if (!fits(m)) break;  // memory grows with the batch: larger ones do not fit either
      g.fits = true;
      g.setting = in.setting;
      g.prediction = std::move(m);
    }
    if (g.fits && s.checkpointing) recompute_fewer_layers(g, in, fits);
    if (g.fits) keep_dense_layers(g, in, gpu_bytes);
    if (g.fits && result.recommended < 0) result.recommended = static_cast<int>(result.steps.size());
    result.steps.push_back(std::move(g));
  }
  return result;
}

int64_t most_kept_activation_layers(PlanInput input, int64_t gpu_bytes) {
  if (!input.setting.gradient_checkpointing) return 0;
  return most_last_layers(input.model.num_hidden_layers, [&](int64_t n) {
    input.setting.keep_activation_layers = n;
    return predict_memory(input).gpu_required <= gpu_bytes;
  });
}

int64_t most_kept_dense_layers(PlanInput input, int64_t gpu_bytes) {
  if (!input.quantized || input.train_base) return 0;
  for (int64_t k = input.model.num_hidden_layers; k >= 1; --k) {
    input.setting.keep_dequantized_layers = k;
    if (predict_memory(input).gpu_required <= gpu_bytes) return k;
  }
  return 0;
}

}  // namespace fsdpq
