// Shared helpers of the CUDA kernel tests: skip without a GPU, device buffers, random bf16 data and
// error metrics. Every kernel is compared with a plain f32 loop written in its test.
#pragma once
#ifdef ZEST_HAVE_CUDA
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "kernels/backend.h"
#include "kernels/cuda/kernels.h"

namespace zest::cuda::test {

#define ZEST_REQUIRE_GPU()                                                         \
  do {                                                                             \
    if (!::zest::kernels::cuda_available()) GTEST_SKIP() << "no CUDA GPU available"; \
    ASSERT_TRUE(::zest::kernels::cuda_init(0).is_ok());                            \
  } while (0)

#define ZEST_ASSERT_OK(expr)                        \
  do {                                              \
    const ::zest::Status _s = (expr);               \
    ASSERT_TRUE(_s.is_ok()) << _s.to_string();      \
  } while (0)

// Owning device buffer of n elements of T.
template <typename T>
class DevBuf {
 public:
  explicit DevBuf(size_t n = 0) { resize(n); }
  DevBuf(const std::vector<T>& host) {
    resize(host.size());
    upload(host);
  }
  ~DevBuf() {
    if (p_) cudaFree(p_);
  }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  void resize(size_t n) {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = n;
    if (n) {
      EXPECT_EQ(cudaMalloc(&p_, n * sizeof(T)), cudaSuccess);
    }
  }
  void upload(const std::vector<T>& host) {
    EXPECT_EQ(cudaMemcpy(p_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> download() const {
    std::vector<T> h(n_);
    EXPECT_EQ(cudaMemcpy(h.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  // Fills every byte with 0xff (poison: bf16 NaN, int -1) to catch unwritten outputs. Done when it returns: a memset
  // on the legacy stream is not ordered with the non-blocking streams tests launch on next, so that stream is
  // synchronised (it alone: a kernel another test keeps running on a non-blocking stream does not hold it up).
  void poison() {
    EXPECT_EQ(cudaMemset(p_, 0xff, n_ * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Host-side bf16 tensor: raw bits plus their f32 values (what the reference computes with).
struct HostBF16 {
  std::vector<uint16_t> bits;
  std::vector<float> f;
};

inline HostBF16 random_bf16(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> d(lo, hi);
  HostBF16 h;
  h.bits.resize(n);
  h.f.resize(n);
  for (size_t i = 0; i < n; ++i) {
    h.bits[i] = f32_to_bf16(d(rng));
    h.f[i] = bf16_to_f32(h.bits[i]);
  }
  return h;
}

inline std::unique_ptr<DevBuf<bf16>> upload_bf16(const HostBF16& h) {
  auto b = std::make_unique<DevBuf<bf16>>(h.bits.size());
  EXPECT_EQ(cudaMemcpy(b->get(), h.bits.data(), h.bits.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}

inline std::vector<float> download_bf16(const DevBuf<bf16>& b) {
  std::vector<uint16_t> bits(b.size());
  EXPECT_EQ(cudaMemcpy(bits.data(), b.get(), bits.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) f[i] = bf16_to_f32(bits[i]);
  return f;
}

inline void sync_ok() { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }

// max |a - b| and max |b| over all elements; NaN in `a` counts as an infinite error.
struct ErrStats {
  double max_err = 0, max_ref = 0;
};
inline ErrStats compare(const std::vector<float>& got, const std::vector<float>& ref) {
  ErrStats s;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double e = std::isnan(got[i]) ? INFINITY : std::fabs(static_cast<double>(got[i]) - ref[i]);
    s.max_err = std::max(s.max_err, e);
    s.max_ref = std::max(s.max_ref, std::fabs(static_cast<double>(ref[i])));
  }
  return s;
}

// The tolerance used for bf16 outputs: max abs error <= rel * max |ref|.
#define ZEST_EXPECT_CLOSE(got, ref, rel)                                                                  \
  do {                                                                                                    \
    ASSERT_EQ((got).size(), (ref).size());                                                                \
    const auto _st = ::zest::cuda::test::compare((got), (ref));                                          \
    EXPECT_GT(_st.max_ref, 0.0);                                                                          \
    EXPECT_LE(_st.max_err, (rel) * _st.max_ref) << "max err " << _st.max_err << " max ref " << _st.max_ref; \
  } while (0)

}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
