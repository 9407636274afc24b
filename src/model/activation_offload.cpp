#include "model/activation_offload.h"

#include <stdexcept>
#include <utility>

namespace fsdpq {

size_t ActivationOffload::input_bytes() const { return static_cast<size_t>(shape_.numel()) * dtype_size(dtype_); }

void ActivationOffload::begin_pass(int64_t layers, const Shape& shape, DType dtype, Device device,
                                   std::vector<bool> sends_attention_output) {
  if (sends_attention_output.size() != static_cast<size_t>(layers))
    throw std::logic_error("ActivationOffload::begin_pass: one attention-output flag a layer");
  if (!side_ || side_->device() != device) side_ = std::make_unique<SideStream>(device);
  layers_ = layers;
  shape_ = shape;
  dtype_ = dtype;
  device_ = device;
  sends_ = std::move(sends_attention_output);
  while (host_.size() < static_cast<size_t>(layers)) host_.push_back(std::make_unique<HostStaging>());
  while (host_outputs_.size() < static_cast<size_t>(layers)) {
    host_outputs_.emplace_back();
    for (auto& part : host_outputs_.back()) part = std::make_unique<HostStaging>();
  }
  arrived_.assign(static_cast<size_t>(layers), StreamMark());
  outputs_arrived_.assign(static_cast<size_t>(layers), StreamMark());
  leaving_ = Tensor();
  left_ = StreamMark();
  spare_ = {};
  spare_free_ = StreamMark();
}

void ActivationOffload::forward_done(int64_t i, Tensor& input, LayerActivations& a) {
  if (i < 0 || i >= layers_) throw std::logic_error("ActivationOffload::forward_done: no such layer");
  if (leaving_.defined()) {  // sent a layer ago: its copy is done long before the compute stream gets here
    left_.compute_waits();
    leaving_ = Tensor();
  }
  const size_t at = static_cast<size_t>(i);
  if (i < layers_ - 1 || sends_[at]) side_->wait_for_compute();  // the layer's tensors are complete
  if (i < layers_ - 1) {  // (the last layer's input: the first backward reads it)
    if (input.nbytes() != input_bytes()) throw std::logic_error("ActivationOffload::forward_done: not a layer input");
    side_->copy(host_[at]->reserve(input_bytes()), Device::CPU, input.view().data, device_, input_bytes());
    left_ = side_->mark();
    leaving_ = std::move(input);
    input = Tensor();
  }
  if (!sends_[at]) return;
  const std::array<Tensor*, kParts> parts = attention_output_of(a);
  for (int k = 0; k < kParts; ++k)
    side_->copy(host_outputs_[at][k]->reserve(parts[k]->nbytes()), Device::CPU, parts[k]->view().data, device_,
                parts[k]->nbytes());
  const StreamMark sent = side_->mark();
  spare_free_.compute_waits();  // the spares' copy out, a recomputed layer ago
  for (int k = 0; k < kParts; ++k) {
    if (!spare_[k].defined()) spare_[k] = Tensor::empty(parts[k]->shape(), parts[k]->dtype(), device_);
    std::swap(*parts[k], spare_[k]);
  }
  spare_free_ = sent;
}

ActivationOffload::Returning ActivationOffload::backward_begin(int64_t i, LayerActivations& a) {
  if (i < 0 || i >= layers_) throw std::logic_error("ActivationOffload::backward_begin: no such layer");
  const size_t at = static_cast<size_t>(i);
  arrived_[at].compute_waits();
  if (sends_[at]) {  // brought back into the spares beside the backward of the layer after it
    outputs_arrived_[at].compute_waits();
    for (int k = 0; k < kParts; ++k) std::swap(*attention_output_of(a)[k], spare_[k]);
  }
  Returning back;
  back.attention_output_back = sends_[at];
  if (i == 0) {
    spare_ = {};
    return back;
  }
  back.previous_input = Tensor::empty(shape_, dtype_, device_);
  // New blocks, and spares the queued backward of the layer after this one may still read.
  side_->wait_for_compute();
  side_->copy(back.previous_input.view().data, device_, host_[at - 1]->reserve(input_bytes()), Device::CPU, input_bytes());
  arrived_[at - 1] = side_->mark();
  if (sends_[at - 1]) {
    for (int k = 0; k < kParts; ++k)
      side_->copy(spare_[k].view().data, device_, host_outputs_[at - 1][k]->reserve(spare_[k].nbytes()), Device::CPU,
                  spare_[k].nbytes());
    outputs_arrived_[at - 1] = side_->mark();
  }
  return back;
}

}  // namespace fsdpq
