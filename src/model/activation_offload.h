// use_activation_cpu_offload: with checkpointing, each layer's input (the residual stream, kept
// for the layer's backward) waits in host memory between the forward and the backward.
//
// Nothing here stops the GPU. The copies run on a side stream into page-locked buffers:
//   - forward: once a layer's forward is queued, its input leaves; its device block is let go of
//     a layer later, after the compute stream has waited for the copy (which has long finished by
//     then), so the compute stream never waits for a copy it has just queued;
//   - backward: a layer's input comes back beside the backward of the layer after it, and the
//     compute stream waits for it only when that layer's backward begins.
// The last layer's input never leaves: its backward comes first. So at most three layer inputs
// are on the device at a time (the one a copy is still reading, the layer's input and its
// output), which is what plan/memory_plan.cpp counts.
//
// The bytes are those of the layer inputs, so the pass's results are the same with or without it.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/cuda_backend.h"
#include "backend/side_stream.h"
#include "backend/tensor.h"

namespace fsdpq {

class ActivationOffload {
 public:
  ActivationOffload() = default;
  ActivationOffload(const ActivationOffload&) = delete;
  ActivationOffload& operator=(const ActivationOffload&) = delete;

  // A pass over `layers` layers whose inputs are `shape` and `dtype` each, on `device`. The host
  // buffers and the side stream are kept from pass to pass.
  void begin_pass(int64_t layers, const Shape& shape, DType dtype, Device device);

  // Forward: layer i's forward is queued and reads `input` (layer i's input). The layer's input
  // leaves for host memory (not the last layer's), and the previous layer's input, sent a layer
  // ago, is let go of. `input` stays valid until then: the caller hands it over.
  void forward_done(int64_t i, Tensor& input);

  // Backward, before layer i's (i = L - 1 down to 0): the compute stream waits for layer i's input
  // to be back on the device, and layer i - 1's starts coming back into `previous_input`, a new
  // block, beside layer i's backward.
  void backward_begin(int64_t i, Tensor& previous_input);

 private:
  size_t bytes() const;

  int64_t layers_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
  std::unique_ptr<SideStream> side_;
  std::vector<std::unique_ptr<HostStaging>> host_;
  Tensor leaving_;          // the input a copy may still be reading, let go of a layer later
  StreamMark left_;         // the end of that copy
  std::vector<StreamMark> arrived_;  // per layer: the end of its copy back (backward)
};

}  // namespace fsdpq
