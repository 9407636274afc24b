// Tensors: a shape and dtype over contiguous row-major memory on one device.
// TensorView is the non-owning handle every op takes; Tensor owns its storage (move-only).
#pragma once
#include "util/bf16.h"
#include "util/dtype.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace fsdpq {

enum class Device : uint8_t { CPU, CUDA };
std::string_view device_name(Device device);

// Up to four dimensions; unused trailing dims are kept at 0 so == compares only what is used.
struct Shape {
  static constexpr int kMaxRank = 4;
  std::array<int64_t, kMaxRank> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> sizes);

  int64_t operator[](int axis) const { return dims[static_cast<size_t>(axis)]; }
  int64_t last() const { return rank == 0 ? 1 : dims[static_cast<size_t>(rank - 1)]; }
  int64_t numel() const;
  // Product of all dims but the last: the row count when the tensor is read as a matrix.
  int64_t rows() const { return rank == 0 ? 1 : numel() / (last() == 0 ? 1 : last()); }
  bool operator==(const Shape& other) const = default;
  std::string to_string() const;  // "[2, 3, 4]"
};

// A non-owning view of contiguous row-major memory. Constness of the view does not make the
// memory read-only (like a pointer): ops take `const TensorView&` for inputs by convention.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  Shape shape;
  Device device = Device::CPU;

  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  template <class T>
  T* as() const { return static_cast<T*>(data); }
  // The same memory read with another shape of the same element count.
  TensorView reshaped(Shape new_shape) const;
  // Rows [begin, begin + count) along the first dimension.
  TensorView slice_rows(int64_t begin, int64_t count) const;
  std::string describe() const;  // "BF16[2, 3] on CPU", for error messages
};

// Element access for tests and cold paths (F32, BF16, F16; stores round to nearest even).
// Hot loops use the typed helpers of ops/storage.h instead of these per-element switches.
float load_f32(const TensorView& view, int64_t index);
void store_f32(TensorView& view, int64_t index, float value);

// Lets a device backend provide its memory (the CUDA backend installs itself when built).
struct DeviceMemoryHooks {
  void* (*allocate)(size_t bytes) = nullptr;
  void (*release)(void* pointer) = nullptr;
  void (*fill_zero)(void* pointer, size_t bytes) = nullptr;
};
void install_device_memory_hooks(Device device, const DeviceMemoryHooks& hooks);

class Tensor {
 public:
  static constexpr size_t kCpuAlignment = 64;  // one cache line; enough for any SIMD load

  Tensor() = default;
  static Tensor empty(Shape shape, DType dtype, Device device = Device::CPU);
  static Tensor zeros(Shape shape, DType dtype, Device device = Device::CPU);
  // A tensor over memory something else owns (a block of a larger buffer): it never frees it, and
  // that owner must outlive it.
  static Tensor borrow(const TensorView& memory);

  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  ~Tensor();

  TensorView view() const { return TensorView{data_, dtype_, shape_, device_}; }
  operator TensorView() const { return view(); }  // pass a Tensor wherever a view is expected

  template <class T>
  T* data() {
    check_element_size(sizeof(T));
    return static_cast<T*>(data_);
  }
  template <class T>
  const T* data() const {
    check_element_size(sizeof(T));
    return static_cast<const T*>(data_);
  }

  bool defined() const { return data_ != nullptr; }  // false only for a default-constructed or moved-from Tensor
  const Shape& shape() const { return shape_; }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

 private:
  void check_element_size(size_t size) const;
  void release();

  void* data_ = nullptr;
  DType dtype_ = DType::F32;
  Shape shape_;
  Device device_ = Device::CPU;
  bool owns_ = true;  // false: borrowed
};

}  // namespace fsdpq
