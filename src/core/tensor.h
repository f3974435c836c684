// Tensor: a contiguous, row-major n-d array on one device, owning or viewing its storage.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace zest {

enum class Device : uint8_t { CPU, CUDA };
const char* device_name(Device d);

// Allocation hooks for non-CPU devices; a device backend installs its pair when it initialises.
struct DeviceAllocator {
  std::function<void*(size_t)> alloc;
  std::function<void(void*)> free;
};
void set_device_allocator(Device d, DeviceAllocator a);

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised storage of the given shape.
  static Tensor empty(std::vector<int64_t> shape, DType dtype = DType::F32, Device device = Device::CPU);
  // Zero-filled CPU tensor.
  static Tensor zeros(std::vector<int64_t> shape, DType dtype = DType::F32);
  // CPU f32 tensor holding a copy of `values` (numel must match).
  static Tensor from_vector(std::vector<int64_t> shape, const std::vector<float>& values);
  // Non-owning view of external memory (the caller keeps it alive).
  static Tensor wrap(void* data, std::vector<int64_t> shape, DType dtype, Device device = Device::CPU);

  bool defined() const { return data_ != nullptr; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  // Size of dimension i; negative i counts from the end.
  int64_t dim(int i) const { return shape_[i < 0 ? shape_.size() + i : i]; }
  int64_t numel() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  void* raw() { return data_; }
  const void* raw() const { return data_; }
  template <typename T> T* data() { return static_cast<T*>(data_); }
  template <typename T> const T* data() const { return static_cast<const T*>(data_); }

  // Same storage, new shape (numel must match).
  Tensor reshape(std::vector<int64_t> shape) const;
  // View of rows [begin, end) along dimension 0.
  Tensor rows(int64_t begin, int64_t end) const;
  // Deep copy (same device).
  Tensor clone() const;
  std::string shape_str() const;

 private:
  std::shared_ptr<void> storage_;
  void* data_ = nullptr;
  std::vector<int64_t> shape_;
  DType dtype_ = DType::F32;
  Device device_ = Device::CPU;
};

std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace zest
