// ShardOptimizer's counterpart for a shard that lives in GPU memory: the state buffers are
// device Tensors, and a step runs kernels/optimizer.cu on the compute stream, with the CPU's
// formulas and fp32 rounding (a GPU step gives the CPU step's bits). state_json() is
// ShardOptimizer's, so a checkpoint saved by either loads into the other.
//
// Every pointer given to step() is a device pointer; nothing here synchronises except the
// copies to and from host memory. In a build without CUDA (or before cuda_init()) the
// constructor throws std::logic_error.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "backend/tensor.h"
#include "optim/optimizer.h"
#include "util/dtype.h"

namespace fsdpq {

class DeviceShardOptimizer {
 public:
  DeviceShardOptimizer(OptimizerConfig config, int64_t numel);

  // Increments the step count, then updates param (numel() device floats) in place from grad.
  void step(float* param_device, const float* grad_device, double lr);
  // The same, also writing the updated param as compute_dtype (F32, BF16 or F16, round to
  // nearest even) into compute_device (numel() elements) in the same pass.
  void step(float* param_device, const float* grad_device, double lr, void* compute_device, DType compute_dtype);

  const OptimizerConfig& config() const { return config_; }
  int64_t numel() const { return numel_; }
  int64_t step_count() const { return step_count_; }

  // The named state buffers (torch's names, optimizer_state_names order) in device memory.
  struct NamedBuffer {
    std::string name;
    float* device_ptr = nullptr;
    int64_t numel = 0;
  };
  std::vector<NamedBuffer> state_buffers();

  // {"optimizer", "step", "numel"}, as ShardOptimizer::state_json().
  nlohmann::json state_json() const;
  // Restores the step count; throws UserError (ShardOptimizer's messages) when the checkpoint is
  // of another optimizer or size.
  void load_state_json(const nlohmann::json& state);

  // Checkpoint save / load of elements [offset, offset + host.size()) of state buffer `buffer`
  // (an index into state_buffers()). Both return once the bytes are in place.
  void copy_state_to_host(size_t buffer, int64_t offset, std::span<float> host) const;
  void copy_state_from_host(size_t buffer, int64_t offset, std::span<const float> host);

 private:
  void check_range(const char* what, size_t buffer, int64_t offset, size_t count) const;

  OptimizerConfig config_;
  int64_t numel_;
  int64_t step_count_ = 0;
  std::vector<std::string> names_;
  std::vector<Tensor> buffers_;  // F32 [numel] on Device::CUDA, zeros before the first step
};

// ShardedParameters' store_compute for device buffers: dst[i] = src[i] as dtype (F32, BF16 or F16;
// round to nearest even). Queued on the compute stream; throws std::logic_error without CUDA.
void device_store_compute(DType dtype, const float* src_device, int64_t n, void* dst_device);

}  // namespace fsdpq
