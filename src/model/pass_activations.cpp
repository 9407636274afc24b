#include "model/pass_activations.h"

#include <stdexcept>
#include <utility>

namespace fsdpq {

PassActivations::PassActivations(int64_t layers, bool train, const ModelOptions& options, const LayerDims& d,
                                 DType dtype, const std::array<int64_t, kLinearModules>& lora_ranks, Device device)
    : layers_(layers),
      checkpointing_(train && options.gradient_checkpointing),
      offloads_(checkpointing_ && options.activation_offload),
      dora_(options.use_dora),
      policy_(options.checkpoint_policy()),
      keeps_xa_(checkpointing_ && !options.use_dora),
      d_(d),
      dtype_(dtype),
      lora_ranks_(lora_ranks),
      device_(device),
      recomputed_xa_(static_cast<size_t>(layers)) {
  if (options.checkpoint_every < 1) throw std::logic_error("PassActivations: checkpoint_every must be at least 1");
  if (options.keep_activation_layers < 0)
    throw std::logic_error("PassActivations: keep_activation_layers must be at least 0");
  // A slot of its own for each layer that keeps its activations, one shared by the rest.
  size_t count = 0;
  for (int64_t i = 0; i < layers; ++i) {
    const bool kept = train && !policy_.recomputes(i, layers);
    if (!kept && shared_slot_ == SIZE_MAX) shared_slot_ = count++;
    of_layer_.push_back(kept ? count++ : shared_slot_);
  }
  if (train && options.recompute_elementwise) elementwise_.allocate(d, dtype, device);
  slots_.resize(count);
  made_.assign(count, false);
}

LayerActivations& PassActivations::forward_begin(int64_t i) {
  LayerActivations& a = of(i);
  const size_t slot = of_layer_[static_cast<size_t>(i)];
  if (!made_[slot]) {  // (the shared slot holds the recomputed layers' xa in turn, none of its own)
    a.allocate(d_, dtype_, keeps_xa_ && slot == shared_slot_ ? std::array<int64_t, kLinearModules>{} : lora_ranks_,
               dora_, device_, elementwise_.norm.defined() ? &elementwise_ : nullptr);
    made_[slot] = true;
  } else if (!a.att.defined()) {  // activation offload took the previous layer's
    a.allocate_attention_output(d_, dtype_, device_);
  }
  if (keeps_xa(i)) a.xa = allocate_group_xa(d_, dtype_, lora_ranks_, device_);
  return a;
}

void PassActivations::forward_end(int64_t i) {
  if (keeps_xa(i)) recomputed_xa_[static_cast<size_t>(i)] = std::move(of(i).xa);
  if (recomputed(i)) shared_holds_ = i;
}

void PassActivations::backward_prepare() {
  if (checkpointing_ && !keeps_xa_) recompute_output_ = Tensor::empty(Shape{d_.N(), d_.C}, dtype_, device_);
}

LayerActivations& PassActivations::backward_begin(int64_t i) {
  LayerActivations& a = of(i);
  if (keeps_xa(i)) a.xa = std::move(recomputed_xa_[static_cast<size_t>(i)]);
  return a;
}

void PassActivations::recompute(int64_t i, const TensorView& x, const LayerCompute& w, const RopeTable& rope,
                                const RowSegments& segments, bool attention_output_kept) {
  if (!needs_recompute(i)) throw std::logic_error("PassActivations::recompute: layer " + std::to_string(i) + " needs none");
  LayerActivations& a = of(i);
  a.xa_kept = keeps_xa(i);
  a.attention_output_kept = attention_output_kept;
  if (a.xa_kept)
    layer_recompute(a, x, w, d_, rope, segments);
  else
    layer_forward(recompute_output_, a, x, w, d_, rope, segments);
  a.xa_kept = false;
  a.attention_output_kept = false;
  shared_holds_ = i;
}

void PassActivations::backward_end(int64_t i) {
  LayerActivations& a = of(i);
  if (keeps_xa(i)) a.xa = {};
  if (!shared(i)) a = LayerActivations();  // (nobody reads them again: memory for the layers below)
}

}  // namespace fsdpq
