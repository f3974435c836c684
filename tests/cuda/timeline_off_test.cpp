// The serving build's kernels carry no step-timeline check at their PDL waits (kernels.h): recording is refused
// with kUnsupported and a buffer handed over anyway stays untouched by a launch (the records are tested in
// tests/cuda_timeline against the ZEST_STEP_TIMELINE build).
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

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
