#include "model/activation_offload.h"

#include <stdexcept>

namespace fsdpq {

size_t ActivationOffload::bytes() const { return static_cast<size_t>(shape_.numel()) * dtype_size(dtype_); }

void ActivationOffload::begin_pass(int64_t layers, const Shape& shape, DType dtype, Device device) {
  if (!side_ || side_->device() != device) side_ = std::make_unique<SideStream>(device);
  layers_ = layers;
  shape_ = shape;
  dtype_ = dtype;
  device_ = device;
  while (host_.size() < static_cast<size_t>(layers)) host_.push_back(std::make_unique<HostStaging>());
  arrived_.assign(static_cast<size_t>(layers), StreamMark());
  leaving_ = Tensor();
  left_ = StreamMark();
}

void ActivationOffload::forward_done(int64_t i, Tensor& input) {
  if (i < 0 || i >= layers_) throw std::logic_error("ActivationOffload::forward_done: no such layer");
  if (leaving_.defined()) {  // sent a layer ago: its copy is done long before the compute stream gets here
    left_.compute_waits();
    leaving_ = Tensor();
  }
  if (i == layers_ - 1) return;  // the first backward reads it
  if (input.nbytes() != bytes()) throw std::logic_error("ActivationOffload::forward_done: not a layer input");
  side_->wait_for_compute();  // the layer's input is complete (and the forward's reads of it queued)
  side_->copy(host_[static_cast<size_t>(i)]->reserve(bytes()), Device::CPU, input.view().data, device_, bytes());
  left_ = side_->mark();
  leaving_ = std::move(input);
  input = Tensor();
}

void ActivationOffload::backward_begin(int64_t i, Tensor& previous_input) {
  if (i < 0 || i >= layers_) throw std::logic_error("ActivationOffload::backward_begin: no such layer");
  arrived_[static_cast<size_t>(i)].compute_waits();
  if (i == 0) return;
  previous_input = Tensor::empty(shape_, dtype_, device_);
  side_->wait_for_compute();  // the new block may be one the queued compute work is still using
  side_->copy(previous_input.view().data, device_, host_[static_cast<size_t>(i - 1)]->reserve(bytes()), Device::CPU,
              bytes());
  arrived_[static_cast<size_t>(i - 1)] = side_->mark();
}

}  // namespace fsdpq
