// The serving build's kernels carry no step-timeline check at their PDL waits (kernels.h): recording is refused
// with kUnsupported and a buffer handed over anyway stays untouched by a launch (the records are tested in
// tests/cuda_timeline against the ZEST_STEP_TIMELINE build). Launch timing (the benchmarks' per-kernel profile) works
// in this build: one entry per launch, in launch order, each timed to the next launch on its own stream.
#ifdef ZEST_HAVE_CUDA
#include "cuda/cuda_test_util.h"

namespace zest::cuda::test {
namespace {

TEST(CudaStepTimelineOff, ServingBuildRefusesToRecord) {
  EXPECT_FALSE(step_timeline_built());
  const Status s = set_step_timeline(reinterpret_cast<void*>(uintptr_t{256}));
  EXPECT_EQ(s.code(), ErrorCode::kUnsupported);
  EXPECT_NE(s.message().find("ZEST_STEP_TIMELINE"), std::string::npos);
}

TEST(CudaStepTimelineOff, LaunchesLeaveABufferUntouched) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(813);
  auto buf = alloc_step_timeline(256, 8);
  ZEST_ASSERT_OK(buf.status());
  EXPECT_EQ(set_step_timeline(*buf).code(), ErrorCode::kUnsupported);
  const int M = 1, N = 256, K = 512;
  auto x = random_bf16(static_cast<size_t>(M) * K, rng), w = random_bf16(static_cast<size_t>(N) * K, rng);
  DevBuf<uint16_t> dx(x.bits), dw(w.bits), dy(static_cast<size_t>(M) * N);
  ZEST_ASSERT_OK(gemm(reinterpret_cast<const bf16*>(dx.get()), reinterpret_cast<const bf16*>(dw.get()),
                      reinterpret_cast<bf16*>(dy.get()), M, N, K, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  long long dropped = -1;
  auto got = read_step_timeline(*buf, &dropped);
  cudaFree(*buf);
  ZEST_ASSERT_OK(got.status());
  EXPECT_TRUE(got->empty());
  EXPECT_EQ(dropped, 0);
}

TEST(CudaLaunchTiming, OneEntryPerLaunchTimedOnItsStream) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(815);
  struct Gemm {
    int M, N, K;
    DevBuf<uint16_t> x, w, y;
    Gemm(int m, int n, int k, std::mt19937& rng)
        : M(m), N(n), K(k), x(random_bf16(static_cast<size_t>(m) * k, rng).bits),
          w(random_bf16(static_cast<size_t>(n) * k, rng).bits), y(static_cast<size_t>(m) * n) {}
    Status run(cudaStream_t s) {
      return gemm(reinterpret_cast<const bf16*>(x.get()), reinterpret_cast<const bf16*>(w.get()),
                  reinterpret_cast<bf16*>(y.get()), M, N, K, s);
    }
  };
  Gemm small(1, 256, 512, rng);       // the small-M kernel of this library
  Gemm large(1024, 4096, 4096, rng);  // cuBLASLt: ~34 GFLOP, tens of microseconds at least
  cudaStream_t s1, s2;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  ZEST_ASSERT_OK(large.run(s1));  // warm-up: cuBLASLt's plan and workspace
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto none = take_launch_times();
  ZEST_ASSERT_OK(none.status());
  EXPECT_TRUE(none->empty());  // nothing recorded while off

  set_launch_timing(true);
  ZEST_ASSERT_OK(small.run(s1));
  ZEST_ASSERT_OK(large.run(s1));
  ZEST_ASSERT_OK(small.run(s2));
  set_launch_timing(false);
  ZEST_ASSERT_OK(small.run(s1));  // not recorded
  auto got = take_launch_times();
  ZEST_ASSERT_OK(got.status());
  ASSERT_EQ(got->size(), 3u);
  EXPECT_EQ((*got)[1].first, "cublasLtMatmul");
  EXPECT_NE((*got)[0].first, "cublasLtMatmul");
  EXPECT_EQ((*got)[0].first, (*got)[2].first);  // the same kernel on the other stream
  for (const auto& [name, ms] : *got) EXPECT_GE(ms, 0.f) << name;
  EXPECT_GT((*got)[1].second, 0.01f);                // the large product took measurable time
  EXPECT_GT((*got)[1].second, (*got)[0].second);     // and more than the 256 x 512 one
  auto again = take_launch_times();
  ZEST_ASSERT_OK(again.status());
  EXPECT_TRUE(again->empty());  // taken once
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
