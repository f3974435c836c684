// The CUDA backend entry points of src/kernels/backend.h: device discovery, a caching device memory pool
// installed as the Tensor allocator, and a one-line description of the GPU.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "kernels/backend.h"
#include "kernels/cuda/kernels.h"

namespace zest::cuda {

namespace {
std::atomic<bool> g_pdl{true};
}  // namespace

void set_programmatic_launch(bool on) { g_pdl.store(on); }
bool programmatic_launch() { return g_pdl.load(); }

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return 132;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) return 132;
    return v;
  }();
  return n;
}

namespace {

// Caching pool: blocks are rounded up to a size class and kept on a free list of their GPU when released, so that
// steady-state allocation never calls cudaMalloc/cudaFree (which synchronise the device).
class DevicePool {
 public:
  void* alloc(size_t bytes) {
    const size_t size = round_up(bytes);
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) {
      cudaGetLastError();
      dev = 0;
    }
    const std::pair<int, size_t> key(dev, size);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(key);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      live_[p] = key;
      return p;
    }
    void* p = nullptr;
    if (cudaMalloc(&p, size) != cudaSuccess) {
      cudaGetLastError();
      release_cached_locked();
      if (cudaMalloc(&p, size) != cudaSuccess) {
        cudaGetLastError();
        return nullptr;
      }
    }
    live_[p] = key;
    return p;
  }
  void free(void* p) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) return;
    free_[it->second].push_back(p);
    live_.erase(it);
  }

 private:
  // Size classes: 256 B granularity below 1 MiB, then 1 MiB granularity.
  static size_t round_up(size_t b) {
    if (b < (1u << 20)) return (b + 255) / 256 * 256;
    return (b + (1u << 20) - 1) / (1u << 20) * (1u << 20);
  }
  void release_cached_locked() {  // every GPU's cached blocks (cudaFree finds a block's GPU itself)
    for (auto& [key, ptrs] : free_)
      for (void* p : ptrs) cudaFree(p);
    free_.clear();
  }
  std::mutex mu_;
  std::map<std::pair<int, size_t>, std::vector<void*>> free_;  // (GPU, size class) -> blocks
  std::unordered_map<void*, std::pair<int, size_t>> live_;
};

DevicePool& pool() {
  static DevicePool* p = new DevicePool();  // never destroyed: tensors may outlive static destructors
  return *p;
}

}  // namespace
}  // namespace zest::cuda

namespace zest::kernels {

bool cuda_available() {
  static const bool ok = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return n > 0;
  }();
  return ok;
}

Status cuda_init(int device) {
  if (!cuda_available())
    return unsupported("no usable CUDA GPU found (check the driver and CUDA_VISIBLE_DEVICES), use the cpu backend");
  int n = 0;
  cudaGetDeviceCount(&n);
  if (device < 0 || device >= n)
    return invalid_argument("CUDA device " + std::to_string(device) + " does not exist (" + std::to_string(n) +
                            " visible); pick a device in [0, " + std::to_string(n) + ")");
  cudaError_t e = cudaSetDevice(device);
  if (e != cudaSuccess) return internal_error(std::string("cudaSetDevice: ") + cudaGetErrorString(e));
  set_device_allocator(Device::CUDA, DeviceAllocator{[](size_t b) { return cuda::pool().alloc(b); },
                                                     [](void* p) { cuda::pool().free(p); }});
  return Status::ok();
}

std::string cuda_describe() {
  if (!cuda_available()) return "no CUDA GPU available";
  int dev = 0;
  cudaGetDevice(&dev);
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, dev) != cudaSuccess) return "CUDA device properties unavailable";
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%s (sm_%d%d, %d SMs, %.1f GiB, L2 %.0f MiB)", prop.name, prop.major, prop.minor,
                prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, prop.l2CacheSize / 1048576.0);
  return buf;
}

}  // namespace zest::kernels
