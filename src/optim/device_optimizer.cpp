#include "optim/device_optimizer.h"

#include <fmt/format.h>

#include <stdexcept>

#include "backend/cuda_backend.h"
#include "util/error.h"

#ifdef FSDPQ_WITH_CUDA
#include "kernels/optimizer.cuh"
#endif

namespace fsdpq {
namespace {

#ifdef FSDPQ_WITH_CUDA
cuda::KType compute_ktype(DType dtype, const char* what) {
  switch (dtype) {
    case DType::F32: return cuda::KType::F32;
    case DType::BF16: return cuda::KType::BF16;
    case DType::F16: return cuda::KType::F16;
    default: break;
  }
  throw std::logic_error(fmt::format("{}: compute dtype must be F32, BF16 or F16, not {}", what, dtype_name(dtype)));
}
#endif

}  // namespace

DeviceShardOptimizer::DeviceShardOptimizer(OptimizerConfig config, int64_t numel)
    : config_(config), numel_(numel), names_(optimizer_state_names(config.kind)) {
#ifdef FSDPQ_WITH_CUDA
  if (numel < 0) throw std::logic_error("DeviceShardOptimizer: negative numel");
  if (!cuda_initialized()) throw std::logic_error("DeviceShardOptimizer: the CUDA backend is used before cuda_init()");
  for (size_t k = 0; k < names_.size(); ++k) buffers_.push_back(Tensor::zeros({numel}, DType::F32, Device::CUDA));
#else
  no_cuda("DeviceShardOptimizer");
#endif
}

void DeviceShardOptimizer::step(float* param_device, const float* grad_device, double lr) {
  step(param_device, grad_device, lr, nullptr, DType::F32);
}

void DeviceShardOptimizer::step(float* param_device, const float* grad_device, double lr, void* compute_device,
                                DType compute_dtype) {
#ifdef FSDPQ_WITH_CUDA
  const cuda::KType ct = compute_device ? compute_ktype(compute_dtype, "DeviceShardOptimizer::step") : cuda::KType::F32;
  ++step_count_;
  std::vector<float*> state;
  for (Tensor& buffer : buffers_) state.push_back(buffer.data<float>());
  cuda::optimizer_step(config_, lr, step_count_, param_device, grad_device, state.data(), numel_,
                       compute_device, ct, cuda::stream());
#else
  no_cuda("DeviceShardOptimizer::step");
#endif
}

std::vector<DeviceShardOptimizer::NamedBuffer> DeviceShardOptimizer::state_buffers() {
  std::vector<NamedBuffer> out;
  for (size_t k = 0; k < names_.size(); ++k) out.push_back({names_[k], buffers_[k].data<float>(), numel_});
  return out;
}

nlohmann::json DeviceShardOptimizer::state_json() const {
  return optimizer_state_json(config_.kind, step_count_, numel_);
}

void DeviceShardOptimizer::load_state_json(const nlohmann::json& state) {
  step_count_ = optimizer_step_from_json(config_.kind, numel_, state);
}

void DeviceShardOptimizer::check_range(const char* what, size_t buffer, int64_t offset, size_t count) const {
  if (buffer >= buffers_.size())
    throw std::logic_error(fmt::format("DeviceShardOptimizer::{}: state buffer {} of {}", what, buffer, buffers_.size()));
  if (offset < 0 || offset > numel_ || static_cast<int64_t>(count) > numel_ - offset)
    throw std::logic_error(fmt::format("DeviceShardOptimizer::{}: elements [{}, {}) outside [0, {})", what, offset,
                                       offset + static_cast<int64_t>(count), numel_));
}

void DeviceShardOptimizer::copy_state_to_host(size_t buffer, int64_t offset, std::span<float> host) const {
  check_range("copy_state_to_host", buffer, offset, host.size());
  copy_bytes(host.data(), Device::CPU, buffers_[buffer].data<float>() + offset, Device::CUDA,
             host.size() * sizeof(float));
}

void DeviceShardOptimizer::copy_state_from_host(size_t buffer, int64_t offset, std::span<const float> host) {
  check_range("copy_state_from_host", buffer, offset, host.size());
  copy_bytes(buffers_[buffer].data<float>() + offset, Device::CUDA, host.data(), Device::CPU,
             host.size() * sizeof(float));
}

void device_store_compute(DType dtype, const float* src_device, int64_t n, void* dst_device) {
#ifdef FSDPQ_WITH_CUDA
  cuda::store_compute(src_device, dst_device, compute_ktype(dtype, "device_store_compute"), n, cuda::stream());
#else
  no_cuda("device_store_compute");
#endif
}

}  // namespace fsdpq
