// Step timeline (kernels.h): every CTA of each launch leaves exactly one record (and its phase stamps), releases
// follow the stream order, recording leaves the outputs unchanged, nothing is recorded without a buffer, and records
// past the capacity are counted as dropped.
#ifdef ZEST_HAVE_CUDA
#include "cuda/cuda_test_util.h"

namespace zest::cuda::test {
namespace {

struct GemmCase {
  int M = 1, N = 512, K = 256;
  HostBF16 x, w;
  DevBuf<uint16_t> dx, dw, dy;
  GemmCase(int n, int k, std::mt19937& rng) : N(n), K(k) {
    x = random_bf16(static_cast<size_t>(M) * K, rng);
    w = random_bf16(static_cast<size_t>(N) * K, rng);
    dx.resize(x.bits.size());
    dx.upload(x.bits);
    dw.resize(w.bits.size());
    dw.upload(w.bits);
    dy.resize(static_cast<size_t>(M) * N);
    dy.poison();
  }
  Status run(cudaStream_t s) {
    return gemm(reinterpret_cast<const bf16*>(dx.get()), reinterpret_cast<const bf16*>(dw.get()),
                reinterpret_cast<bf16*>(dy.get()), M, N, K, s);
  }
};

struct TimelineBuf {
  void* p = nullptr;
  ~TimelineBuf() {
    (void)set_step_timeline(nullptr);
    if (p) cudaFree(p);
  }
};

TEST(CudaStepTimeline, EveryCtaOnceInStreamOrder) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(811);
  GemmCase a(256, 512, rng), b(1024, 256, rng);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  // Outputs without recording, for the comparison below.
  ZEST_ASSERT_OK(a.run(s));
  ZEST_ASSERT_OK(b.run(s));
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  const auto ya = a.dy.download(), yb = b.dy.download();
  a.dy.poison();
  b.dy.poison();

  TimelineBuf buf;
  auto alloc = alloc_step_timeline(256, 64);
  ZEST_ASSERT_OK(alloc.status());
  buf.p = *alloc;
  ZEST_ASSERT_OK(set_step_timeline(buf.p));
  set_launch_log(true);
  ZEST_ASSERT_OK(a.run(s));
  ZEST_ASSERT_OK(b.run(s));
  set_launch_log(false);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  ZEST_ASSERT_OK(set_step_timeline(nullptr));
  const std::vector<std::string> names = take_launch_log();
  long long dropped = -1;
  auto got = read_step_timeline(buf.p, &dropped);
  ZEST_ASSERT_OK(got.status());
  EXPECT_EQ(dropped, 0);
  ASSERT_EQ(got->size(), 2u);
  EXPECT_EQ(names.size(), 2u);
  for (const TimelineLaunch& k : *got) {
    EXPECT_GT(k.ctas, 0);
    EXPECT_TRUE(k.ctas_unique);
    EXPECT_EQ(static_cast<unsigned int>(k.ctas), k.max_cta + 1);  // CTAs 0 .. n-1, each once
    EXPECT_LE(k.first_ready, k.first_release);
    EXPECT_LE(k.last_ready, k.last_release);
    EXPECT_NE(k.grid, 0ull);
    // The small-M GEMM stamps phase 0 at its first instruction and phase 1 when its weight tile has landed, once
    // per CTA each: the first before the CTA's wait, the second after it.
    EXPECT_EQ(k.phase_count[0], k.ctas);
    EXPECT_EQ(k.phase_count[1], k.ctas);
    EXPECT_LE(k.phase_first[0], k.first_ready);
    EXPECT_LE(k.phase_last[0], k.last_ready);
    EXPECT_GE(k.phase_first[1], k.first_release);
  }
  EXPECT_NE((*got)[0].grid, (*got)[1].grid);
  // The second launch waits for the whole first one, whose CTAs all passed their waits before it completed.
  EXPECT_GE((*got)[1].first_release, (*got)[0].last_release);
  EXPECT_EQ(a.dy.download(), ya);
  EXPECT_EQ(b.dy.download(), yb);

  // Unset: a further launch leaves the counts as they were.
  ZEST_ASSERT_OK(a.run(s));
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  auto again = read_step_timeline(buf.p, &dropped);
  ZEST_ASSERT_OK(again.status());
  EXPECT_EQ(again->size(), 2u);
  EXPECT_EQ((*again)[0].ctas + (*again)[1].ctas, (*got)[0].ctas + (*got)[1].ctas);
  cudaStreamDestroy(s);
}

TEST(CudaStepTimeline, RecordsPastTheCapacityCountAsDropped) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(812);
  GemmCase a(4096, 256, rng);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int ctas = 0;
  for (int cap : {4096, 1}) {
    TimelineBuf buf;
    auto alloc = alloc_step_timeline(256, cap);
    ZEST_ASSERT_OK(alloc.status());
    buf.p = *alloc;
    ZEST_ASSERT_OK(set_step_timeline(buf.p));
    ZEST_ASSERT_OK(a.run(s));
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    ZEST_ASSERT_OK(set_step_timeline(nullptr));
    long long dropped = -1, orphans = -1;
    auto got = read_step_timeline(buf.p, &dropped, &orphans);
    ZEST_ASSERT_OK(got.status());
    // Every CTA leaves three records: phase 0, the wait record, phase 1 (tile landed).
    long long kept = orphans;
    for (const TimelineLaunch& k : *got) kept += k.ctas + k.phase_count[0] + k.phase_count[1];
    if (cap > 1) {
      ASSERT_EQ(got->size(), 1u);
      EXPECT_EQ(dropped, 0);
      EXPECT_EQ(orphans, 0);
      ctas = (*got)[0].ctas;
      EXPECT_EQ(kept, 3LL * ctas);
    } else {
      int sms = 0;
      ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
      EXPECT_LE(kept, sms);  // one record per SM
      EXPECT_GT(dropped, 0);
      EXPECT_EQ(kept + dropped, 3LL * ctas);
    }
  }
  EXPECT_GT(ctas, 0);
  cudaStreamDestroy(s);
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
