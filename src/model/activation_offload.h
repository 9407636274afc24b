// use_activation_cpu_offload: with checkpointing, what a layer keeps for its backward waits in host
// memory between the forward and the backward:
//   - each layer's input (the residual stream), all but the last layer's;
//   - its attention output (att, lse) and x2 = x + o_proj(att), where the caller says so
//     (CheckpointPolicy::offloads_attention_output):
//       - a recomputed layer's: brought back, they let the recompute skip the attention forward
//         and o_proj (layer_recompute, LayerActivations::attention_output_kept). Not the last
//         recomputed layer's, whose activations are still in their shared buffer at its backward;
//       - a layer that keeps its activations (keep_activation_layers, checkpoint_every): it holds
//         the rest on the device. Not the last layer's, whose backward comes first.
//
// Nothing here stops the GPU. The copies run on a side stream into page-locked buffers:
//   - forward: once a layer's forward is queued, its tensors leave, and the caller hands them over
//     (the layer's LayerActivations has no att, lse, x2 until they are back; a buffer shared with
//     later layers gets new ones from PassActivations). They are let go of a layer later, after the
//     compute stream has waited for the copy (which has long finished by then);
//   - backward: a layer's tensors come back into new blocks beside the backward of the layer after
//     it, and the compute stream waits for them only when that layer's backward begins.
// So at most three layer inputs are on the device at a time (the one a copy is still reading, the
// layer's input and its output), and one attention output beyond those the layers hold (the one a
// copy reads in the forward, writes in the backward), which plan/memory_plan.cpp counts.
//
// The bytes are the same, so the pass's results are the same with or without it.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/side_stream.h"
#include "backend/tensor.h"
#include "model/llama_layer.h"

namespace fsdpq {

class ActivationOffload {
 public:
  ActivationOffload() = default;
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // A pass over `layers` layers whose inputs are `shape` and `dtype` each, on `device`; layer i's
  // attention output goes too where sends_attention_output[i]. The host buffers and the side stream
  // are kept from pass to pass.
  void begin_pass(int64_t layers, const Shape& shape, DType dtype, Device device,
                  std::vector<bool> sends_attention_output);

  // Forward: layer i's forward is queued. Its input (not the last layer's) leaves for host memory,
  // and the previous layer's tensors, sent a layer ago, are let go of: the caller hands `input`
  // over, and a's att, lse and x2 where it sends layer i's attention output.
  void forward_done(int64_t i, Tensor& input, LayerActivations& a);

  // Backward, before layer i's (i = L - 1 down to 0): the compute stream waits for layer i's input
  // to be back on the device (and its attention output, moved into a), and layer i - 1's start
  // coming back beside layer i's backward, into new blocks.
  struct Returning {
    Tensor previous_input;               // layer i - 1's input (none for layer 0)
    bool attention_output_back = false;  // a holds layer i's att, lse and x2
  };
  Returning backward_begin(int64_t i, LayerActivations& a);

 private:
  static constexpr int kParts = 3;  // att, lse, x2
  using Parts = std::array<Tensor, kParts>;
  static std::array<Tensor*, kParts> attention_output_of(LayerActivations& a) { return {&a.att, &a.lse, &a.x2}; }
  size_t input_bytes() const;

  int64_t layers_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
  std::vector<bool> sends_;  // per layer: its attention output too
  std::unique_ptr<SideStream> side_;
  std::vector<std::unique_ptr<HostStaging>> host_;                          // per layer: its input
  std::vector<std::array<std::unique_ptr<HostStaging>, kParts>> host_outputs_;  // per layer: att, lse, x2
  std::array<Shape, kParts> part_shapes_;  // an attention output's, as the forward sent them
  std::array<DType, kParts> part_dtypes_{};
  Tensor leaving_;        // the input a copy may still be reading, let go of a layer later
  Parts leaving_outputs_;  // the attention output a copy may still be reading, likewise
  StreamMark left_;        // the end of those copies
  Parts returning_;        // the attention output coming back for the next layer's backward
  std::vector<StreamMark> arrived_, outputs_arrived_;  // per layer: the end of its copies back
};

}  // namespace fsdpq
