#include "model/activation_offload.h"

#include <optional>
#include <stdexcept>
#include <utility>

#include "backend/section_times.h"

namespace fsdpq {

namespace {

// FSDPQ_SECTION_TIMES: a section on the side stream around a layer's copies, their own time (how
// busy the host link is beside the compute), as the dequantisation's side stream is timed.
class CopiesTimed {
 public:
  CopiesTimed(SideStream& side, const char* name) {
    if (!section_times_enabled()) return;
    on_side_.emplace(side);
    section_.emplace(name);
  }

 private:
  std::optional<OnSideStream> on_side_;
  std::optional<ScopedSection> section_;  // (ends before the stream is the compute stream again)
};

}  // namespace

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
  leaving_outputs_ = {};
  left_ = StreamMark();
  returning_ = {};
}

void ActivationOffload::forward_done(int64_t i, Tensor& input, LayerActivations& a) {
  if (i < 0 || i >= layers_) throw std::logic_error("ActivationOffload::forward_done: no such layer");
  // Sent a layer ago: the copies are done long before the compute stream gets here.
  left_.compute_waits();
  leaving_ = Tensor();
  leaving_outputs_ = {};
  const size_t at = static_cast<size_t>(i);
  if (i == layers_ - 1 && !sends_[at]) return;  // (the last layer's input: the first backward reads it)
  side_->wait_for_compute();  // the layer's tensors are complete
  const CopiesTimed timed(*side_, "activation offload: out");
  if (i < layers_ - 1) {
    if (input.nbytes() != input_bytes()) throw std::logic_error("ActivationOffload::forward_done: not a layer input");
    side_->copy(host_[at]->reserve(input_bytes()), Device::CPU, input.view().data, device_, input_bytes());
    leaving_ = std::move(input);
    input = Tensor();
  }
  if (sends_[at]) {
    const std::array<Tensor*, kParts> parts = attention_output_of(a);
    for (int k = 0; k < kParts; ++k) {
      Tensor& part = *parts[k];
      if (!part.defined()) throw std::logic_error("ActivationOffload::forward_done: the layer has no attention output");
      part_shapes_[k] = part.shape();
      part_dtypes_[k] = part.dtype();
      side_->copy(host_outputs_[at][k]->reserve(part.nbytes()), Device::CPU, part.view().data, device_, part.nbytes());
      leaving_outputs_[k] = std::move(part);
      part = Tensor();
    }
  }
  left_ = side_->mark();
}

ActivationOffload::Returning ActivationOffload::backward_begin(int64_t i, LayerActivations& a) {
  if (i < 0 || i >= layers_) throw std::logic_error("ActivationOffload::backward_begin: no such layer");
  const size_t at = static_cast<size_t>(i);
  arrived_[at].compute_waits();
  Returning back;
  back.attention_output_back = sends_[at];
  if (sends_[at]) {  // brought back beside the backward of the layer after it
    outputs_arrived_[at].compute_waits();
    const std::array<Tensor*, kParts> parts = attention_output_of(a);
    for (int k = 0; k < kParts; ++k) *parts[k] = std::move(returning_[k]);  // (a shared buffer's are let go of)
  }
  if (i == 0) return back;
  back.previous_input = Tensor::empty(shape_, dtype_, device_);
  const bool outputs = sends_[at - 1];
  if (outputs)
    for (int k = 0; k < kParts; ++k) returning_[k] = Tensor::empty(part_shapes_[k], part_dtypes_[k], device_);
  side_->wait_for_compute();  // new blocks, which queued work may have used before
  const CopiesTimed timed(*side_, "activation offload: in");
  side_->copy(back.previous_input.view().data, device_, host_[at - 1]->reserve(input_bytes()), Device::CPU, input_bytes());
  arrived_[at - 1] = side_->mark();
  if (outputs) {
    for (int k = 0; k < kParts; ++k)
      side_->copy(returning_[k].view().data, device_, host_outputs_[at - 1][k]->reserve(returning_[k].nbytes()),
                  Device::CPU, returning_[k].nbytes());
    outputs_arrived_[at - 1] = side_->mark();
  }
  return back;
}

}  // namespace fsdpq
