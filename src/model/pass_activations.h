// What a training pass keeps for each layer's backward, and the checkpointed recompute that
// rebuilds the rest (the rule of which layers it recomputes: model/checkpoint_policy.h):
//   - each layer not recomputed: a LayerActivations of its own, filled by its forward;
//   - the recomputed layers: one LayerActivations they share, and beside it each one's adapters'
//     xa (LayerActivations::xa_kept), so the recompute draws no dropout mask again. The last
//     recomputed layer's activations are still in the shared one when its backward begins: it is
//     not recomputed;
//   - with recompute_elementwise, the buffers the layers share for n1, n2 and h.
// A layer's buffers are made when the forward reaches it. With activation offload
// (model/activation_offload.h) its att, lse and x2 may leave for host memory after its forward:
// the shared buffer gets new ones for the next layer. A layer keeping its own activations lets them
// go after its backward.
// An evaluation pass (no backward) runs every layer in the one shared LayerActivations.
#pragma once
#include <array>
#include <cstdint>
#include <cstddef>
#include <string>
#include <vector>

#include "backend/tensor.h"
#include "model/llama_layer.h"
#include "model/llama_model.h"

namespace fsdpq {

class PassActivations {
 public:
  PassActivations(int64_t layers, bool train, const ModelOptions& options, const LayerDims& d, DType dtype,
                  const std::array<int64_t, kLinearModules>& lora_ranks, Device device);
  PassActivations(const PassActivations&) = delete;
  PassActivations& operator=(const PassActivations&) = delete;

  bool recomputed(int64_t i) const { return checkpointing_ && policy_.recomputes(i, layers_); }
  // With activation offload, whether layer i's att, lse and x2 go to host memory too (CheckpointPolicy's rule).
  bool offloads_attention_output(int64_t i) const {
    return offloads_ && policy_.offloads_attention_output(i, layers_, dora_);
  }

  // Forward: layer i's buffers (a recomputed layer gets its own xa), and after its forward is queued.
  LayerActivations& forward_begin(int64_t i);
  void forward_end(int64_t i);

  // Backward, before any reads: allocates what the recompute writes that nobody reads (DoRA's layer output).
  void backward_prepare();
  // Whether layer i's backward must first rebuild its activations (recomputed, and the shared
  // buffer holds another layer's).
  bool needs_recompute(int64_t i) const { return recomputed(i) && shared_holds_ != i; }
  // Layer i's buffers for its backward, a recomputed layer's xa back in them.
  LayerActivations& backward_begin(int64_t i);
  // Rebuilds layer i's activations from its input x (the forward's masks and bits). What activation
  // offload brought back is already there: att, lse and x2 (attention_output_kept).
  void recompute(int64_t i, const TensorView& x, const LayerCompute& w, const RopeTable& rope,
                 const RowSegments& segments, bool attention_output_kept);
  // Layer i's backward is queued: its xa goes, and a layer keeping its own activations lets them go.
  void backward_end(int64_t i);

 private:
  LayerActivations& of(int64_t i) { return slots_[of_layer_[static_cast<size_t>(i)]]; }
  bool keeps_xa(int64_t i) const { return keeps_xa_ && recomputed(i); }
  bool shared(int64_t i) const { return of_layer_[static_cast<size_t>(i)] == shared_slot_; }

  int64_t layers_;
  bool checkpointing_;
  bool offloads_;  // activation offload may take a layer's att, lse and x2 away
  bool dora_;
  CheckpointPolicy policy_;
  bool keeps_xa_;  // recomputed layers keep their xa (not DoRA's: its own per-module xa, z and norms)
  LayerDims d_;
  DType dtype_;
  std::array<int64_t, kLinearModules> lora_ranks_;
  Device device_;
  ElementwiseScratch elementwise_;
  std::vector<size_t> of_layer_;           // each layer's slot
  size_t shared_slot_ = SIZE_MAX;          // the one the recomputed layers share (none: SIZE_MAX)
  std::vector<LayerActivations> slots_;
  std::vector<bool> made_;                 // per slot: allocated (the forward reached it)
  std::vector<std::array<Tensor, kLinearGroups>> recomputed_xa_;  // per recomputed layer, between its forward and backward
  int64_t shared_holds_ = -1;              // the layer whose activations the shared slot holds
  Tensor recompute_output_;                // DoRA's recompute writes the layer's output here, unread
};

}  // namespace fsdpq
