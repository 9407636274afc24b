#include "backend/tensor.h"

#include "backend/host_tensor_bytes.h"
#include "runtime/host_out_of_memory.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

namespace fsdpq {

std::string_view device_name(Device device) {
  switch (device) {
    case Device::CPU: return "CPU";
    case Device::CUDA: return "CUDA";
  }
  return "?";
}

Shape::Shape(std::initializer_list<int64_t> sizes) {
  if (sizes.size() > static_cast<size_t>(kMaxRank))
    throw std::logic_error(fmt::format("Shape: rank {} exceeds the maximum of {}", sizes.size(), kMaxRank));
  for (int64_t size : sizes) {
    if (size < 0) throw std::logic_error(fmt::format("Shape: negative dimension {}", size));
    dims[static_cast<size_t>(rank++)] = size;
  }
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int axis = 0; axis < rank; ++axis) n *= dims[static_cast<size_t>(axis)];
  return n;
}

std::string Shape::to_string() const {
  std::string text = "[";
  for (int axis = 0; axis < rank; ++axis) {
    if (axis > 0) text += ", ";
    text += std::to_string(dims[static_cast<size_t>(axis)]);
  }
  return text + "]";
}

TensorView TensorView::reshaped(Shape new_shape) const {
  if (new_shape.numel() != numel())
    throw std::logic_error(fmt::format("TensorView::reshaped: cannot view {} as {} ({} vs {} elements)",
                                       shape.to_string(), new_shape.to_string(), numel(), new_shape.numel()));
  TensorView result = *this;
  result.shape = new_shape;
  return result;
}

TensorView TensorView::slice_rows(int64_t begin, int64_t count) const {
  if (shape.rank == 0 || begin < 0 || count < 0 || begin + count > shape[0])
    throw std::logic_error(fmt::format("TensorView::slice_rows: rows [{}, {}) outside {}", begin, begin + count,
                                       shape.to_string()));
  TensorView result = *this;
  const size_t row_bytes = shape[0] == 0 ? 0 : nbytes() / static_cast<size_t>(shape[0]);
  result.data = static_cast<char*>(data) + static_cast<size_t>(begin) * row_bytes;
  result.shape.dims[0] = count;
  return result;
}

std::string TensorView::describe() const {
  return fmt::format("{}{} on {}", dtype_name(dtype), shape.to_string(), device_name(device));
}

float load_f32(const TensorView& view, int64_t index) {
  switch (view.dtype) {
    case DType::F32: return static_cast<const float*>(view.data)[index];
    case DType::BF16: return bf16_to_float(static_cast<const bf16_bits*>(view.data)[index]);
    case DType::F16: return f16_to_float(static_cast<const uint16_t*>(view.data)[index]);
    default: break;
  }
  throw std::logic_error(fmt::format("load_f32: unsupported dtype {}", dtype_name(view.dtype)));
}

void store_f32(TensorView& view, int64_t index, float value) {
  switch (view.dtype) {
    case DType::F32: static_cast<float*>(view.data)[index] = value; return;
    case DType::BF16: static_cast<bf16_bits*>(view.data)[index] = float_to_bf16(value); return;
    case DType::F16: static_cast<uint16_t*>(view.data)[index] = float_to_f16(value); return;
    default: break;
  }
  throw std::logic_error(fmt::format("store_f32: unsupported dtype {}", dtype_name(view.dtype)));
}

namespace {

DeviceMemoryHooks& cuda_hooks() {
  static DeviceMemoryHooks hooks;
  return hooks;
}

const DeviceMemoryHooks& hooks_for(Device device) {
  const DeviceMemoryHooks& hooks = cuda_hooks();
  if (device == Device::CUDA && hooks.allocate == nullptr)
    throw std::logic_error("a CUDA tensor before the CUDA backend started (cuda_init), or in a build without CUDA");
  return hooks;
}

size_t cpu_allocation_bytes(size_t nbytes) {
  // aligned_alloc wants a multiple of the alignment; never zero so data() is non-null.
  size_t rounded = (nbytes + Tensor::kCpuAlignment - 1) / Tensor::kCpuAlignment * Tensor::kCpuAlignment;
  return rounded == 0 ? Tensor::kCpuAlignment : rounded;
}

std::atomic<int64_t> g_host_live{0}, g_host_peak{0};

void host_bytes_added(size_t bytes) {
  const int64_t now = g_host_live.fetch_add(static_cast<int64_t>(bytes)) + static_cast<int64_t>(bytes);
  int64_t peak = g_host_peak.load();
  while (now > peak && !g_host_peak.compare_exchange_weak(peak, now)) {
  }
}

}  // namespace

HostTensorBytes host_tensor_bytes() { return {g_host_live.load(), g_host_peak.load()}; }
void reset_host_tensor_peak() { g_host_peak.store(g_host_live.load()); }

void install_device_memory_hooks(Device device, const DeviceMemoryHooks& hooks) {
  if (device != Device::CUDA) throw std::logic_error("install_device_memory_hooks: only a device backend has hooks");
  cuda_hooks() = hooks;
}

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  Tensor tensor;
  tensor.shape_ = shape;
  tensor.dtype_ = dtype;
  tensor.device_ = device;
  const size_t bytes = tensor.nbytes();
  if (device == Device::CPU) {
    tensor.data_ = std::aligned_alloc(kCpuAlignment, cpu_allocation_bytes(bytes));
    if (tensor.data_ == nullptr) fail_host_allocation(bytes, "a host tensor " + tensor.view().describe());
    host_bytes_added(bytes);
  } else {
    tensor.data_ = hooks_for(device).allocate(bytes == 0 ? 1 : bytes);
  }
  return tensor;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device) {
  Tensor tensor = empty(shape, dtype, device);
  if (device == Device::CPU)
    std::memset(tensor.data_, 0, tensor.nbytes());
  else
    hooks_for(device).fill_zero(tensor.data_, tensor.nbytes());
  return tensor;
}

Tensor Tensor::borrow(const TensorView& memory) {
  if (memory.data == nullptr) throw std::logic_error("Tensor::borrow: no memory to borrow");
  Tensor t;
  t.data_ = memory.data;
  t.dtype_ = memory.dtype;
  t.shape_ = memory.shape;
  t.device_ = memory.device;
  t.owns_ = false;
  return t;
}

Tensor::Tensor(Tensor&& other) noexcept
    : data_(other.data_), dtype_(other.dtype_), shape_(other.shape_), device_(other.device_), owns_(other.owns_) {
  other.data_ = nullptr;
  other.owns_ = true;
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    release();
    data_ = other.data_;
    dtype_ = other.dtype_;
    shape_ = other.shape_;
    device_ = other.device_;
    owns_ = other.owns_;
    other.data_ = nullptr;
    other.owns_ = true;
  }
  return *this;
}

Tensor::~Tensor() { release(); }

void Tensor::release() {
  if (data_ == nullptr) return;
  if (!owns_) {
    data_ = nullptr;
    owns_ = true;
    return;
  }
  if (device_ == Device::CPU) {
    std::free(data_);
    g_host_live.fetch_sub(static_cast<int64_t>(nbytes()));
  } else
    cuda_hooks().release(data_);
  data_ = nullptr;
}

void Tensor::check_element_size(size_t size) const {
  if (size != dtype_size(dtype_))
    throw std::logic_error(fmt::format("Tensor::data<T>: element of {} bytes requested from a {} tensor", size,
                                       dtype_name(dtype_)));
}

}  // namespace fsdpq
