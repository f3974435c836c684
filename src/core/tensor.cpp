#include "core/tensor.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>

namespace zest {

const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

namespace {
std::mutex g_alloc_mu;
DeviceAllocator g_cuda_alloc;
}  // namespace

void set_device_allocator(Device d, DeviceAllocator a) {
  std::lock_guard<std::mutex> lock(g_alloc_mu);
  if (d == Device::CUDA) g_cuda_alloc = std::move(a);
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape_) n *= s;
  return n;
}

Tensor Tensor::empty(std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  const size_t bytes = std::max<size_t>(t.nbytes(), 1);
  if (device == Device::CPU) {
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    t.storage_ = std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  } else {
    DeviceAllocator a;
    {
      std::lock_guard<std::mutex> lock(g_alloc_mu);
      a = g_cuda_alloc;
    }
    if (!a.alloc) throw std::runtime_error("CUDA backend is not initialised");
    void* p = a.alloc(bytes);
    if (!p) throw std::bad_alloc();
    t.storage_ = std::shared_ptr<void>(p, [f = a.free](void* q) { f(q); });
  }
  t.data_ = t.storage_.get();
  return t;
}

Tensor Tensor::zeros(std::vector<int64_t> shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype, Device::CPU);
  std::memset(t.data_, 0, t.nbytes());
  return t;
}

Tensor Tensor::from_vector(std::vector<int64_t> shape, const std::vector<float>& values) {
  Tensor t = empty(std::move(shape), DType::F32, Device::CPU);
  if (static_cast<size_t>(t.numel()) != values.size())
    throw std::invalid_argument("Tensor::from_vector: size mismatch");
  std::memcpy(t.data_, values.data(), values.size() * 4);
  return t;
}

Tensor Tensor::wrap(void* data, std::vector<int64_t> shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  t.data_ = data;
  return t;
}

Tensor Tensor::reshape(std::vector<int64_t> shape) const {
  Tensor t = *this;
  t.shape_ = std::move(shape);
  if (t.numel() != numel()) throw std::invalid_argument("reshape: numel mismatch");
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  Tensor t = *this;
  const int64_t row = shape_.empty() ? 1 : numel() / std::max<int64_t>(shape_[0], 1);
  t.shape_[0] = end - begin;
  t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin * row) * dtype_size(dtype_);
  return t;
}

Tensor Tensor::clone() const {
  if (device_ != Device::CPU) throw std::runtime_error("clone: CPU tensors only");
  Tensor t = empty(shape_, dtype_, device_);
  std::memcpy(t.data_, data_, nbytes());
  return t;
}

std::string shape_to_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string Tensor::shape_str() const { return shape_to_string(shape_); }

}  // namespace zest
