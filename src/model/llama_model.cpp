#include "model/llama_model.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/section_times.h"
#include "backend/side_stream.h"
#include "kernels/splitmix64.h"
#include "model/activation_offload.h"
#include "model/block_expansion.h"
#include "model/llama_cached_attention.h"
#include "model/llama_layer.h"
#include "model/llama_lm_head.h"
#include "model/llama_weights.h"
#include "model/pass_activations.h"
#include "ops/dora.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/rmsnorm.h"
#include "ops/rope.h"
#include "util/bf16.h"
#include "util/error.h"
#include "util/strings.h"

namespace fsdpq {
namespace {

// One dropout key per (seed, step_key, layer, module): masks differ across steps, micro-batches,
// layers and modules, and the checkpointed recompute regenerates the forward's exact masks.
uint64_t lora_dropout_key(uint64_t seed, uint64_t step_key, int64_t layer, int module) {
  uint64_t key = mix64(seed + kGolden64);
  key = mix64(key ^ (step_key + kGolden64));
  key = mix64(key ^ (static_cast<uint64_t>(layer) + 2 * kGolden64));
  return mix64(key ^ (static_cast<uint64_t>(module) + 3 * kGolden64));
}

RopeScalingParams rope_scaling_of(const LlamaConfig& config) {
  RopeScalingParams p;
  if (config.rope_scaling.type == "llama3") {
    p.type = RopeScalingParams::Type::Llama3;
    p.factor = config.rope_scaling.factor;
    p.low_freq_factor = config.rope_scaling.low_freq_factor;
    p.high_freq_factor = config.rope_scaling.high_freq_factor;
    p.original_max_position_embeddings = config.rope_scaling.original_max_position_embeddings;
  }
  return p;
}

TensorView i32_view(const std::vector<int32_t>& values, int64_t count) {
  return TensorView{const_cast<int32_t*>(values.data()), DType::I32, Shape{count}, Device::CPU};
}

void check_batch(const data::Batch& batch) {
  if (batch.batch_size < 1 || batch.seq_len < 1)
    throw std::logic_error(fmt::format("LlamaModel: empty batch ({} x {})", batch.batch_size, batch.seq_len));
  const size_t n = static_cast<size_t>(batch.batch_size * batch.seq_len);
  if (batch.input_ids.size() != n || batch.labels.size() != n)
    throw std::logic_error(fmt::format("LlamaModel: batch {} x {} has {} input ids and {} labels", batch.batch_size,
                                       batch.seq_len, batch.input_ids.size(), batch.labels.size()));
  if (batch.packed() && (batch.segment_start.size() != n || batch.positions.size() != n))
    throw std::logic_error(fmt::format("LlamaModel: packed batch {} x {} has {} segment starts and {} positions",
                                       batch.batch_size, batch.seq_len, batch.segment_start.size(),
                                       batch.positions.size()));
}

// A base weight that is never NF4 (embedding, norms, head): its compute view.
TensorView dense_of(const BaseWeight& w) {
  return w.trainable ? w.trainable->compute_view() : w.frozen.values();  // throws for a quantised weight
}

void convert_into_master(Tensor& master, const Tensor& source) {
  const int64_t n = master.numel();
  float* dst = master.data<float>();
  switch (source.dtype()) {
    case DType::F32: std::memcpy(dst, source.view().data, master.nbytes()); break;
    case DType::BF16: {
      const uint16_t* src = source.data<uint16_t>();
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
      break;
    }
    case DType::F16: {
      const uint16_t* src = source.data<uint16_t>();
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_float(src[i]);
      break;
    }
    default: throw std::logic_error("convert_into_master: unsupported dtype");
  }
}

enum class PassKind { Train, Evaluate, Logits };

GpuDequantizeStream& gpu_dequantize_choice() {
  static GpuDequantizeStream choice = [] {
    const char* env = std::getenv("FSDPQ_DEQUANTIZE_STREAM");  // runtime/environment.cpp checks the value
    return env != nullptr && std::string_view(env) == "compute" ? GpuDequantizeStream::Compute
                                                                : GpuDequantizeStream::Side;
  }();
  return choice;
}

// The lowest layer whose backward is needed: 0 where the embedding trains, else the first layer
// with a trainable tensor (the layer count where none has one). The layers below it have no
// gradient of their own and nothing below them trains, so they skip their backward and its
// recompute: Llama-Pro's frozen layers under its first new block (fsdp_qlora's default expansion of
// 32 layers: the first 10 of 35).
int64_t first_backward_layer(const LlamaWeights& w) {
  if (w.embedding.trainable) return 0;
  const int64_t L = static_cast<int64_t>(w.layers.size());
  for (int64_t i = 0; i < L; ++i) {
    const LayerWeights& layer = w.layers[static_cast<size_t>(i)];
    bool trains = layer.input_norm.trainable || layer.post_norm.trainable;
    for (int m = 0; m < kLinearModules; ++m) trains = trains || layer.linear[m].trainable || layer.lora[m];
    if (trains) return i;
  }
  return L;
}

std::optional<StreamPriority>& adapter_stream_choice() {
  static std::optional<StreamPriority> choice = []() -> std::optional<StreamPriority> {
    const char* env = std::getenv("FSDPQ_ADAPTER_STREAM");  // runtime/environment.cpp checks the value
    if (env != nullptr && std::string_view(env) == "off") return std::nullopt;
    return env != nullptr && std::string_view(env) == "high" ? StreamPriority::High : StreamPriority::Normal;
  }();
  return choice;
}

bool& lora_fold_choice() {
  static bool choice = [] {
    const char* env = std::getenv("FSDPQ_LORA_FOLD");  // runtime/environment.cpp checks the value
    return env == nullptr || std::string_view(env) != "0";
  }();
  return choice;
}

}  // namespace

GpuDequantizeStream gpu_dequantize_stream() { return gpu_dequantize_choice(); }
std::optional<StreamPriority> gpu_adapter_stream() { return adapter_stream_choice(); }
void set_gpu_adapter_stream(std::optional<StreamPriority> priority) { adapter_stream_choice() = priority; }
void set_gpu_dequantize_stream(GpuDequantizeStream stream) { gpu_dequantize_choice() = stream; }
bool lora_fold() { return lora_fold_choice(); }
void set_lora_fold(bool fold) { lora_fold_choice() = fold; }


struct LlamaModel::Impl {
  LlamaConfig config;
  ModelOptions options;
  LlamaWeights weights;
  DType act = DType::BF16;
  RopeTable rope;
  std::array<Tensor, kLinearModules> dequantized;  // one layer's NF4 weights made dense, reused
  // Where they are made dense on the GPU (FSDPQ_DEQUANTIZE_STREAM, default side): beside the
  // compute stream, module by module in the order the pass uses them, so that each one's
  // dequantisation overlaps the products of the modules before it instead of delaying the layer.
  std::unique_ptr<SideStream> dequantize_stream;
  // Where the adapters' dB, d(xa) and dA run in backward (LayerCompute::adapter_stream), made at
  // the priority gpu_adapter_stream() says.
  std::unique_ptr<SideStream> adapter_stream;
  StreamPriority adapter_stream_priority = StreamPriority::Normal;
  // Per module: the compute stream's last read of dequantized[m] so far (LayerCompute::buffer_free).
  std::array<StreamMark, kLinearModules> buffer_free;
  // keep_dequantized_layers (ModelOptions): the last layers' dense base weights, each layer's in
  // buffers of its own (kept[j] for layer L - kept.size() + j, only its quantised modules: the
  // shared buffers are never made where every quantised layer is kept). The first pass that reads
  // them makes them dense; every later pass, forward and backward, reads what they hold: a frozen
  // base never changes, so neither does its dense form (`filled`, with `ready`, the side stream's
  // mark after that first dequantisation). `free`: the compute stream's last read so far, which
  // that first dequantisation waits for where the buffers were there before.
  struct KeptLayer {
    std::array<Tensor, kLinearModules> dense;
    StreamMark free;
    bool filled = false;
    std::array<StreamMark, kLinearModules> ready;
  };
  std::vector<KeptLayer> kept;
  // Generation: each layer's DoRA weight norms, computed once (the weights do not change between
  // tokens); cleared whenever the adapters change.
  std::vector<std::array<Tensor, kLinearModules>> dora_norms;
  UnitHooks* hooks = nullptr;                      // sharding; null: weights always present
  Device device = Device::CPU;                     // where activations live and the ops run
  // What use_activation_cpu_offload sends to host memory and back (its buffers kept from pass to pass).
  ActivationOffload activation_offload;

  // `checkpoint`: the config of the weights read, before any Llama-Pro expansion.
  Impl(const LlamaConfig& checkpoint, const ModelOptions& o, LlamaWeights w)
      : config(BlockExpansion(checkpoint.num_hidden_layers, o.llama_pro_new_blocks).expanded(checkpoint)),
        options(o),
        weights(std::move(w)),
        act(weights.activation) {}

  void place_on(Device target) {
    weights.place_on(target);
    for (Tensor& t : dequantized) t = Tensor();
    dequantize_stream.reset();
    buffer_free = {};
    kept.clear();
    dora_norms.clear();
    device = target;
  }

  int64_t num_layers() const { return config.num_hidden_layers; }

  // RoPE tables cover positions [0, positions); they grow on demand (values do not depend on the size).
  void ensure_rope(int64_t positions) {
    if (rope.max_positions >= positions) return;
    const int64_t size = std::max<int64_t>(positions, 2 * rope.max_positions);
    rope = make_rope_table(config.head_dim, size, config.rope_theta, rope_scaling_of(config));
  }

  void check_context(int64_t tokens, const char* what) const {
    if (config.sliding_window && tokens > *config.sliding_window)
      fail("{} of {} tokens exceeds the model's sliding_window of {}: sliding-window attention is not implemented "
           "yet, so use a context_length of at most {}",
           what, tokens, *config.sliding_window, *config.sliding_window);
  }

  std::array<int64_t, kLinearModules> lora_ranks() const {
    std::array<int64_t, kLinearModules> ranks{};
    if (!weights.layers.empty())
      for (int m = 0; m < kLinearModules; ++m)
        if (weights.layers[0].lora[m]) ranks[m] = options.lora_rank;  // masters may be sharded away
    return ranks;
  }

  // The order a layer's pass reads its base weights: the forward's, or the backward's (down,
  // gate/up, o, then q/k/v), which a layer that is recomputed first reads in the forward's.
  static constexpr std::array<int, kLinearModules> kForwardOrder = {kQProj,    kKProj,  kVProj,   kOProj,
                                                                     kGateProj, kUpProj, kDownProj};
  static constexpr std::array<int, kLinearModules> kBackwardOrder = {kDownProj, kGateProj, kUpProj, kOProj,
                                                                      kQProj,    kKProj,    kVProj};

  // Layer `index`'s dense base weights, queued for the compute stream to wait on module by module
  // (LayerCompute::weight). On the side stream each module's buffer is refilled once the compute
  // stream is past the previous layer's last read of it (buffer_free, set by the layer's groups),
  // so the dequantisation overlaps the rest of the layer before, compute-bound products included.
  // Where the hooks may move or replace the frozen bytes (sharded units, offload), it waits for the
  // whole compute stream instead: the bytes are certain only once forward_begin's work is done.
  //
  // A kept layer (keep_dequantized_layers; `own` its buffers) makes its quantised modules dense in
  // its own buffers once, in the first pass that reads them; after that (`own->filled`) it only
  // hands out what they hold, the compute stream waiting for that first dequantisation's marks.
  void dequantize_layer(LayerCompute& c, LayerWeights& layer, const std::array<int, kLinearModules>& order,
                        KeptLayer* own = nullptr) {
    if (!dequantize_stream && device == Device::CUDA && gpu_dequantize_stream() == GpuDequantizeStream::Side)
      dequantize_stream = std::make_unique<SideStream>(device);
    if (dequantize_stream && gpu_dequantize_stream() != GpuDequantizeStream::Side) dequantize_stream.reset();
    const bool ahead = hooks == nullptr || hooks->frozen_weights_stay_in_place();
    const std::array<int64_t, kLinearModules> extra = folded_columns(layer);
    auto in_own = [&](int m) { return own != nullptr && quantized_frozen(layer.linear[m]); };
    auto buffer_of = [&](int m) -> Tensor& { return in_own(m) ? own->dense[m] : dequantized[m]; };
    // Buffers are made here, on the compute stream: the caching allocator may hand out a block that
    // work queued there still uses, so the side stream waits for all of it before its first write.
    bool made = false;
    for (int m : order)
      if (quantized_frozen(layer.linear[m])) {
        const bool new_buffer = ensure_dense_buffer(buffer_of(m), layer.linear[m], extra[m]);
        if (new_buffer && in_own(m)) own->filled = false;
        made |= new_buffer;
      }
    const bool own_filled = own != nullptr && own->filled;
    std::optional<OnSideStream> redirected;
    if (dequantize_stream) {
      if (ahead) c.buffer_free = &buffer_free;  // the layer marks where its reads of each buffer end
      if (!ahead || made) dequantize_stream->wait_for_compute();
      redirected.emplace(*dequantize_stream);
    }
    for (int m : order) {
      const BaseWeight& base = layer.linear[m];
      Tensor& buffer = buffer_of(m);
      // Folded: the base's block of the buffer (the layer writes the adapter's).
      const MatrixView dense = extra[m] > 0 ? MatrixView(buffer.view(), 0, base.frozen.shape()[1]) : MatrixView{};
      if (in_own(m) && own_filled) {
        c.set_weight(m, extra[m] > 0 ? dense : MatrixView(buffer.view()), own->ready[m]);
        continue;
      }
      if (dequantize_stream && ahead) dequantize_stream->wait(in_own(m) ? own->free : buffer_free[m]);
      ScopedSection section("nf4 dequantize");  // on the side stream: its own time, overlapped
      if (extra[m] > 0) base.frozen.dequantize_into(dense);
      const StreamMark ready = dequantize_stream ? dequantize_stream->mark() : StreamMark{};
      c.set_weight(m, extra[m] > 0 ? dense : MatrixView(base.dense(buffer, act)), ready);
      if (in_own(m)) own->ready[m] = ready;
    }
    if (own != nullptr) own->filled = true;
    for (int group = 0; group < kLinearGroups; ++group) c.folded[group] = extra[group_modules(group)[0]] > 0;
  }

  // Per module, the columns its folded buffer adds (LayerCompute), with lora_fold() on.
  std::array<int64_t, kLinearModules> folded_columns(const LayerWeights& layer) const {
    if (!lora_fold()) return {};
    std::array<FoldCandidate, kLinearModules> modules{};
    for (int m = 0; m < kLinearModules; ++m) {
      const BaseWeight& base = layer.linear[m];
      const LoraAdapter* lora = layer.lora[m].get();
      modules[m] = {lora && !lora->magnitude && !base.trainable && base.frozen.defined() &&
                        base.frozen.format().quantized(),
                    base.shape.last(), lora ? lora->A.shape[0] : 0};
    }
    return fsdpq::folded_columns(modules);
  }

  // Makes `buffer` quantised module `base`'s dense buffer unless it is one already (true when it
  // made it): [out, in + extra] in the activation dtype where the weight lives, the extra columns
  // of a folded module zero (the blocks under the group's other adapters stay 0; its own adapter's
  // block the layer writes, LayerCompute).
  bool ensure_dense_buffer(Tensor& buffer, const BaseWeight& base, int64_t extra) {
    const Shape& shape = base.frozen.shape();
    const Shape want{shape[0], shape[1] + extra};
    const Device where = base.frozen.device();
    if (buffer.defined() && buffer.shape() == want && buffer.dtype() == act && buffer.device() == where) return false;
    buffer = extra > 0 ? Tensor::zeros(want, act, where) : Tensor::empty(want, act, where);
    return true;
  }

  // A frozen base stored quantised: what dequantisation makes dense (and a kept layer keeps).
  static bool quantized_frozen(const BaseWeight& base) {
    return !base.trainable && base.frozen.defined() && base.frozen.format().quantized();
  }

  // The buffers of layer `index` when it is one of the last keep_dequantized_layers; null otherwise.
  KeptLayer* kept_layer(int64_t index) {
    const int64_t L = num_layers(), k = std::min(options.keep_dequantized_layers, L);
    if (k <= 0 || index < L - k) return nullptr;
    if (kept.size() != static_cast<size_t>(k)) kept.resize(static_cast<size_t>(k));
    return &kept[static_cast<size_t>(index - (L - k))];
  }

  // Every kept layer's buffers, made before a pass allocates anything else: made later, amid the
  // pass's activations, each would take a larger block the caching allocator has cached (up to
  // twice its size) and hold it for the whole run. The compute stream's mark after them is where
  // their first refill may begin.
  void make_kept_buffers() {
    for (int64_t i = 0; i < num_layers(); ++i) {
      KeptLayer* const own = kept_layer(i);
      if (own == nullptr) continue;
      LayerWeights& layer = weights.layers[static_cast<size_t>(i)];
      const std::array<int64_t, kLinearModules> extra = folded_columns(layer);
      bool made = false;
      for (int m = 0; m < kLinearModules; ++m)
        if (quantized_frozen(layer.linear[m])) made |= ensure_dense_buffer(own->dense[m], layer.linear[m], extra[m]);
      if (made) {
        own->free = mark_compute();
        own->filled = false;
      }
    }
  }

  // `own`: dequantize_layer's.
  LayerCompute layer_compute(int64_t index, bool training, uint64_t step_key,
                             const std::array<int, kLinearModules>& order = kForwardOrder, KeptLayer* own = nullptr) {
    LayerWeights& layer = weights.layers[static_cast<size_t>(index)];
    LayerCompute c;
    c.input_norm = dense_of(layer.input_norm);
    c.post_norm = dense_of(layer.post_norm);
    c.d_input_norm = layer.input_norm.grad_view();
    c.d_post_norm = layer.post_norm.grad_view();
    dequantize_layer(c, layer, order, own);
    if (const std::optional<StreamPriority> priority = gpu_adapter_stream(); training && device == Device::CUDA && priority) {
      if (!adapter_stream || adapter_stream_priority != *priority) {
        adapter_stream = std::make_unique<SideStream>(device, *priority);
        adapter_stream_priority = *priority;
      }
      c.adapter_stream = adapter_stream.get();
    }
    for (int m = 0; m < kLinearModules; ++m) {
      c.d_weight[m] = layer.linear[m].grad_view();
      if (const LoraAdapter* adapter = layer.lora[m].get()) {
        c.lora[m] = adapter;
        c.lora_params[m].alpha = static_cast<float>(options.lora_alpha);
        c.lora_params[m].dropout = static_cast<float>(options.lora_dropout);
        c.lora_params[m].training = training;
        c.lora_params[m].dropout_key = lora_dropout_key(options.seed, step_key, index, m);
      }
    }
    return c;
  }

  std::array<TensorView, kLinearModules> cached_dora_norms(int64_t layer, const LayerCompute& w) {
    std::array<TensorView, kLinearModules> views{};
    if (!options.use_dora) return views;
    dora_norms.resize(static_cast<size_t>(num_layers()));
    std::array<Tensor, kLinearModules>& norms = dora_norms[static_cast<size_t>(layer)];
    for (int m = 0; m < kLinearModules; ++m) {
      const LoraAdapter* adapter = w.lora[m];
      if (!adapter || !adapter->magnitude) continue;
      if (!norms[m].defined()) {
        const TensorView W = w.weight(m).as_tensor();
        norms[m] = Tensor::empty(Shape{W.shape[0]}, DType::F32, device);
        const TensorView A = adapter->A.compute_view();
        dora_weight_norm(norms[m], W, A, adapter->B.compute_view(), lora_scaling(w.lora_params[m], A.shape[0]));
      }
      views[m] = norms[m];
    }
    return views;
  }

  // Forward (and for Train the backward) of one batch. Train keeps every layer's input and, without
  // checkpointing, every layer's activations; Evaluate and Logits keep only the current layer's.
  LossSum pass(const data::Batch& batch, PassKind kind, float grad_scale, uint64_t step_key, TensorView logits_out) {
    check_batch(batch);
    const int64_t B = batch.batch_size, T = batch.seq_len, N = B * T, L = num_layers();
    // The longest sequence attention and RoPE see: a row, or in a packed (padding-free) row, which
    // may be longer than context_length, its longest example.
    const int64_t longest = batch.packed() ? *std::max_element(batch.positions.begin(), batch.positions.end()) + 1 : T;
    check_context(longest, "a sequence");
    ensure_rope(longest);
    const LayerDims d = layer_dims(config, B, T);
    const bool train = kind == PassKind::Train;
    const bool checkpointing = train && options.gradient_checkpointing;
    const Tensor ids_storage = copy_to(i32_view(batch.input_ids, N), device);
    const TensorView ids = ids_storage.view();
    // Packed rows: where each token's example begins and its position in it, on the device once.
    Tensor starts_storage, positions_storage;
    RowSegments segments;
    if (batch.packed()) {
      starts_storage = copy_to(i32_view(batch.segment_start, N).reshaped(Shape{B, T}), device);
      positions_storage = copy_to(i32_view(batch.positions, N).reshaped(Shape{B, T}), device);
      segments = {starts_storage.view(), positions_storage.view()};
    }

    make_kept_buffers();
    // Activation offload: the layer inputs wait in host memory between forward and backward
    // (model/activation_offload.h), so they are made as the forward reaches them.
    const bool offload_activations = checkpointing && options.activation_offload;
    // The residual stream: stream[i] is layer i's input (two buffers in turn when nothing is kept).
    const Shape stream_shape{N, config.hidden_size};
    std::vector<Tensor> stream(static_cast<size_t>(train ? L + 1 : 2));
    for (size_t i = 0; i < stream.size(); ++i)
      if (!offload_activations || i == 0) stream[i] = Tensor::empty(stream_shape, act, device);
    auto stream_at = [&](int64_t i) -> Tensor& { return stream[static_cast<size_t>(train ? i : i % 2)]; };
    const bool backward_follows = train && !weights.trainables().empty();
    if (hooks) hooks->forward_begin(kRootUnit);
    embedding_forward(stream_at(0), ids, dense_of(weights.embedding));

    // What the backward reads of each layer, kept or rebuilt by a recompute.
    PassActivations saved(L, train, options, d, act, lora_ranks(), device);
    if (offload_activations) {
      std::vector<bool> sends(static_cast<size_t>(L));
      for (int64_t i = 0; i < L; ++i) sends[static_cast<size_t>(i)] = saved.offloads_attention_output(i);
      activation_offload.begin_pass(L, stream_shape, act, device, std::move(sends));
    }
    for (int64_t i = 0; i < L; ++i) {
      if (!stream_at(i + 1).defined()) stream_at(i + 1) = Tensor::empty(stream_shape, act, device);
      if (hooks) hooks->forward_begin(layer_unit(i));
      KeptLayer* const own = kept_layer(i);
      const LayerCompute w = layer_compute(i, train, step_key, kForwardOrder, own);
      LayerActivations& a = saved.forward_begin(i);
      layer_forward(stream_at(i + 1), a, stream_at(i), w, d, rope, segments);
      saved.forward_end(i);
      w.wait_for_weights();  // before forward_end may let the unit's quantised weights go
      if (own) own->free = mark_compute();  // its last read without a backward
      if (hooks) hooks->forward_end(layer_unit(i), backward_follows);
      if (offload_activations) activation_offload.forward_done(i, stream_at(i), a);
    }

    Tensor normed = Tensor::empty(Shape{N, config.hidden_size}, act, device);
    Tensor rstd = Tensor::empty(Shape{N}, DType::F32, device);
    const TensorView final_norm = dense_of(weights.final_norm);
    rmsnorm_forward(normed, rstd, stream_at(L), final_norm, d.eps);
    const TensorView head = dense_of(weights.head());
    // The head's gradient comes with the loss, so a training pass begins the root's backward here
    // (and the root, needed again for the embedding's backward, never ends its forward).
    if (hooks && backward_follows) hooks->backward_begin(kRootUnit);
    if (kind == PassKind::Logits) {
      lm_head_logits(logits_out, normed, head, act);
      if (hooks) hooks->forward_end(kRootUnit, false);
      return {};
    }

    const DType grad = activation_grad_dtype(act);
    Tensor d_normed = train ? Tensor::empty(Shape{N, config.hidden_size}, grad, device) : Tensor();
    const CrossEntropyResult loss = [&] {
      ScopedSection section("lm head + loss");
      return lm_head_loss(normed, head, i32_view(batch.labels, N), B, T, train ? grad_scale : 0.0f, d_normed.view(),
                     train ? weights.head().grad_view() : TensorView{}, act, lm_head_chunk_rows(config.vocab_size, N));
    }();
    const LossSum result{loss.loss_sum, loss.count};
    if (!backward_follows) {  // nothing to differentiate
      if (hooks) hooks->forward_end(kRootUnit, false);
      return result;
    }

    // Backward, layer by layer in reverse; d_resid carries the residual stream's gradient.
    Tensor d_resid = Tensor::empty(Shape{N, config.hidden_size}, grad, device);
    // A frozen final norm's grad_view has no data: rmsnorm_backward computes no dweight for it.
    rmsnorm_backward(d_resid, weights.final_norm.grad_view(), d_normed, stream_at(L), final_norm, rstd);
    d_normed = Tensor();
    normed = Tensor();
    LayerGradScratch scratch;
    scratch.allocate(d, grad, act, device);
    saved.backward_prepare();
    const int64_t first_backward = first_backward_layer(weights);
    for (int64_t i = L - 1; i >= 0; --i) {
      LayerActivations& a = saved.backward_begin(i);
      ActivationOffload::Returning back;
      if (offload_activations) {
        back = activation_offload.backward_begin(i, a);
        if (i > 0) stream_at(i - 1) = std::move(back.previous_input);
      }
      if (hooks) hooks->backward_begin(layer_unit(i));
      if (i >= first_backward) {
        KeptLayer* const own = kept_layer(i);  // its dense weights from the forward above
        const bool recompute = saved.needs_recompute(i);  // (the same dropout masks and bits)
        const LayerCompute w = layer_compute(i, true, step_key, recompute ? kForwardOrder : kBackwardOrder, own);
        if (recompute) saved.recompute(i, stream_at(i), w, rope, segments, back.attention_output_back);
        // The lowest such layer's input gradient feeds nothing that trains but its own input norm.
        const bool input_gradient = i > first_backward || weights.embedding.trainable || w.d_input_norm.data != nullptr;
        layer_backward(d_resid, scratch, a, stream_at(i), w, d, rope, segments, input_gradient);
        saved.backward_end(i);
        w.wait_for_weights();
        if (own) own->free = mark_compute();  // the next forward refills its buffers after this
      } else {
        saved.backward_end(i);  // frozen, and nothing below it trains: no backward, no recompute
      }
      if (offload_activations) stream_at(i) = Tensor();  // its layer's backward is queued
      if (hooks) hooks->backward_end(layer_unit(i));
    }
    if (weights.embedding.trainable) embedding_backward(weights.embedding.trainable->grad, ids, d_resid);
    if (hooks) hooks->backward_end(kRootUnit);
    return result;
  }

  std::vector<float> forward_cached(const std::vector<int32_t>& tokens, KvCache& cache) {
    if (hooks) throw std::logic_error("forward_cached: generation runs on an unsharded model");
    if (device != Device::CPU) throw std::logic_error("forward_cached: generation runs on the CPU backend");
    const int64_t n = static_cast<int64_t>(tokens.size()), L = num_layers();
    if (n == 0) fail("forward_cached: no tokens given");
    if (cache.keys.size() != static_cast<size_t>(L) || cache.values.size() != static_cast<size_t>(L))
      throw std::logic_error("forward_cached: the cache was not made by this model's make_cache");
    if (cache.length < 0 || cache.length + n > cache.max_tokens)
      fail("KV cache of {} tokens already holds {}: {} more do not fit; make a larger cache", cache.max_tokens,
           cache.length, n);
    check_context(cache.length + n, "a generated sequence");
    const Shape cache_shape{cache.max_tokens, config.num_key_value_heads, config.head_dim};
    for (int64_t i = 0; i < L; ++i)
      if (cache.keys[static_cast<size_t>(i)].shape() != cache_shape || cache.keys[static_cast<size_t>(i)].dtype() != act ||
          cache.values[static_cast<size_t>(i)].shape() != cache_shape ||
          cache.values[static_cast<size_t>(i)].dtype() != act)
        throw std::logic_error("forward_cached: the cache was not made by this model's make_cache");
    ensure_rope(cache.length + n);

    const LayerDims d = layer_dims(config, 1, n);
    const int64_t kv_width = d.KV * d.D;
    std::array<Tensor, 2> stream = {Tensor::empty(Shape{n, d.C}, act, device), Tensor::empty(Shape{n, d.C}, act, device)};
    embedding_forward(stream[0], i32_view(tokens, n), dense_of(weights.embedding));
    LayerActivations a;
    a.allocate(d, act, lora_ranks(), options.use_dora);
    for (int64_t i = 0; i < L; ++i) {
      const TensorView x = stream[static_cast<size_t>(i % 2)], out = stream[static_cast<size_t>((i + 1) % 2)];
      KeptLayer* const own = kept_layer(i);
      LayerCompute w = layer_compute(i, false, 0, kForwardOrder, own);
      w.dora_norm = cached_dora_norms(i, w);
      attention_inputs_forward(a, x, w, d, rope, cache.length);
      Tensor& keys = cache.keys[static_cast<size_t>(i)];
      Tensor& values = cache.values[static_cast<size_t>(i)];
      copy_convert(keys.view().slice_rows(cache.length, n).reshaped(Shape{n, kv_width}), a.k);
      copy_convert(values.view().slice_rows(cache.length, n).reshaped(Shape{n, kv_width}), a.v);
      cached_attention_forward(a.att.view().reshaped(Shape{n, d.H, d.D}), a.q.view().reshaped(Shape{n, d.H, d.D}),
                               keys, values, cache.length);
      attention_output_mlp_forward(out, a, x, w, d);
      if (own) own->free = mark_compute();
    }
    cache.length += n;

    // Only the last position's logits are needed.
    const TensorView last = stream[static_cast<size_t>(L % 2)].view().slice_rows(n - 1, 1);
    Tensor normed = Tensor::empty(Shape{1, d.C}, act, device);
    Tensor rstd = Tensor::empty(Shape{1}, DType::F32, device);
    rmsnorm_forward(normed, rstd, last, dense_of(weights.final_norm), d.eps);
    std::vector<float> logits(static_cast<size_t>(config.vocab_size));
    lm_head_logits(TensorView{logits.data(), DType::F32, Shape{1, config.vocab_size}, Device::CPU}, normed,
                   dense_of(weights.head()), act);
    return logits;
  }

  void load_adapters(const std::vector<std::pair<std::string, Tensor>>& tensors) {
    std::map<std::string, TrainableTensor*> expected;
    std::vector<std::string> expected_names;
    for (LoraAdapter* adapter : weights.adapters())
      for (TrainableTensor* t : adapter->tensors()) {
        expected[t->name] = t;
        expected_names.push_back(t->name);
      }
    if (expected.empty())
      fail("cannot load LoRA adapters: this model has none ({})",
           options.train_base ? "full fine-tuning trains the base weights instead" : "lora_target_modules is empty");

    std::set<std::string> seen;
    for (const auto& [name, tensor] : tensors) {
      const auto it = expected.find(name);
      if (it == expected.end()) {
        const std::string guess = closest_match(name, expected_names);
        fail("adapter tensor '{}' is not part of this model{}; it has LoRA adapters on {} of each of its {} layers",
             name, guess.empty() ? "" : fmt::format(" (did you mean '{}'?)", guess), join(options.lora_targets, ", "),
             num_layers());
      }
      if (!seen.insert(name).second) fail("adapter tensor '{}' is given twice", name);
      if (tensor.dtype() != DType::F32 && tensor.dtype() != DType::BF16 && tensor.dtype() != DType::F16)
        fail("adapter tensor '{}' is {}; LoRA weights must be F32, BF16 or F16", name, dtype_name(tensor.dtype()));
      const Shape& want = it->second->master.shape();
      if (tensor.shape() != want)
        fail("adapter tensor '{}' has shape {} but this model needs {} (lora_rank {}; lora_A is [r, in], lora_B [out, r]{})",
             name, tensor.shape().to_string(), want.to_string(), options.lora_rank,
             options.use_dora ? ", lora_magnitude_vector [out]" : "");
    }
    if (seen.size() != expected.size()) {
      std::vector<std::string> missing;
      for (const std::string& name : expected_names)
        if (!seen.count(name)) missing.push_back(name);
      const size_t shown = std::min<size_t>(missing.size(), 3);
      fail("{} adapter tensor{} missing: '{}'{}", missing.size(), missing.size() == 1 ? " is" : "s are",
           join(std::vector<std::string>(missing.begin(), missing.begin() + static_cast<long>(shown)), "', '"),
           missing.size() > shown ? fmt::format(" and {} more", missing.size() - shown) : "");
    }
    // Everything checked: only now change the model.
    for (const auto& [name, tensor] : tensors) convert_into_master(expected.at(name)->master, tensor);
    masters_updated();
  }

  void masters_updated() {
    for (TrainableTensor* t : weights.trainables()) t->refresh_compute();
    dora_norms.clear();
  }
};

LlamaModel::LlamaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LlamaModel::LlamaModel(LlamaModel&&) noexcept = default;
LlamaModel& LlamaModel::operator=(LlamaModel&&) noexcept = default;
LlamaModel::~LlamaModel() = default;

LlamaModel LlamaModel::load(const LlamaConfig& config, const ModelWeights& weights, const ModelOptions& options,
                            const UnitBuiltCallback& on_unit_built) {
  validate_llama_config(config, weights.directory().string() + "/config.json");
  return LlamaModel(std::make_unique<Impl>(
      config, options, build_llama_weights(config, options, file_weight_source(weights), on_unit_built)));
}

LlamaModel LlamaModel::random(const LlamaConfig& config, uint64_t init_seed, const ModelOptions& options,
                              const UnitBuiltCallback& on_unit_built) {
  validate_llama_config(config, "model config");
  // init_model draws with the config's initializer_range as a float stddev.
  const WeightSource source = random_weight_source(init_seed, static_cast<float>(config.initializer_range));
  return LlamaModel(std::make_unique<Impl>(config, options, build_llama_weights(config, options, source, on_unit_built)));
}

LlamaModel LlamaModel::load(const LlamaConfig& config, const ModelWeights& weights, const ModelOptions& options,
                            const UnitLoader& load_unit) {
  validate_llama_config(config, weights.directory().string() + "/config.json");
  return LlamaModel(std::make_unique<Impl>(
      config, options, build_llama_weights_by_unit(config, options, file_weight_source(weights), load_unit)));
}

LlamaModel LlamaModel::random(const LlamaConfig& config, uint64_t init_seed, const ModelOptions& options,
                              const UnitLoader& load_unit) {
  validate_llama_config(config, "model config");
  const WeightSource source = random_weight_source(init_seed, static_cast<float>(config.initializer_range));
  return LlamaModel(std::make_unique<Impl>(config, options, build_llama_weights_by_unit(config, options, source, load_unit)));
}

std::vector<ParamUnit> LlamaModel::param_units() { return impl_->weights.units(); }
int LlamaModel::num_units() const { return static_cast<int>(impl_->config.num_hidden_layers) + 1; }
void LlamaModel::set_unit_hooks(UnitHooks* hooks) { impl_->hooks = hooks; }
void LlamaModel::place_on(Device device) { impl_->place_on(device); }
Device LlamaModel::device() const { return impl_->device; }

const LlamaConfig& LlamaModel::config() const { return impl_->config; }
const ModelOptions& LlamaModel::options() const { return impl_->options; }

LossSum LlamaModel::forward_backward(const data::Batch& batch, double normalizer, float loss_scale, uint64_t step_key) {
  const float grad_scale = static_cast<float>(static_cast<double>(loss_scale) / normalizer);
  return impl_->pass(batch, PassKind::Train, grad_scale, step_key, {});
}

LossSum LlamaModel::evaluate(const data::Batch& batch) { return impl_->pass(batch, PassKind::Evaluate, 0.0f, 0, {}); }

Tensor LlamaModel::logits(const data::Batch& batch) {
  check_batch(batch);
  Tensor out = Tensor::empty(Shape{batch.batch_size, batch.seq_len, impl_->config.vocab_size}, DType::F32,
                             impl_->device);
  impl_->pass(batch, PassKind::Logits, 0.0f, 0,
              out.view().reshaped(Shape{batch.batch_size * batch.seq_len, impl_->config.vocab_size}));
  return impl_->device == Device::CPU ? std::move(out) : copy_to(out, Device::CPU);
}

std::vector<TrainableParameter> LlamaModel::trainable_parameters() {
  std::vector<TrainableParameter> out;
  for (TrainableTensor* t : impl_->weights.trainables()) out.push_back({t->name, &t->master, &t->grad});
  return out;
}

void LlamaModel::zero_grads() {
  for (TrainableTensor* t : impl_->weights.trainables()) fill_zero(t->grad.view());
}

void LlamaModel::masters_updated() { impl_->masters_updated(); }

std::vector<std::pair<std::string, const Tensor*>> LlamaModel::adapter_tensors() const {
  std::vector<std::pair<std::string, const Tensor*>> out;
  for (const LayerWeights& layer : impl_->weights.layers)
    for (const auto& adapter : layer.lora)
      if (adapter)
        for (const TrainableTensor* t : std::as_const(*adapter).tensors()) out.emplace_back(t->name, &t->master);
  return out;
}

void LlamaModel::load_adapter_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  impl_->load_adapters(tensors);
}

KvCache LlamaModel::make_cache(int64_t max_tokens) const {
  if (max_tokens < 1) fail("a KV cache needs room for at least one token, got {}", max_tokens);
  KvCache cache;
  cache.max_tokens = max_tokens;
  const Shape shape{max_tokens, impl_->config.num_key_value_heads, impl_->config.head_dim};
  for (int64_t i = 0; i < impl_->config.num_hidden_layers; ++i) {
    cache.keys.push_back(Tensor::zeros(shape, impl_->act));
    cache.values.push_back(Tensor::zeros(shape, impl_->act));
  }
  return cache;
}

std::vector<float> LlamaModel::forward_cached(const std::vector<int32_t>& tokens, KvCache& cache) {
  return impl_->forward_cached(tokens, cache);
}

}  // namespace fsdpq
