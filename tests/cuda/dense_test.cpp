// CUDA dense kernels (GEMM, embedding, RMSNorm variants, SwiGLU, argmax) against plain f32 loops.
#ifdef ZEST_HAVE_CUDA
#include <tuple>

#include "cuda/cuda_test_util.h"

namespace zest::cuda::test {
namespace {

constexpr float kEps = 1e-6f;
constexpr double kTol = 2e-2;  // bf16 outputs: max abs err <= 2e-2 * max |ref|

std::vector<float> ref_gemm(const std::vector<float>& x, const std::vector<float>& w, int M, int N, int K) {
  std::vector<float> y(static_cast<size_t>(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double s = 0;
      for (int k = 0; k < K; ++k) s += static_cast<double>(x[m * K + k]) * w[static_cast<size_t>(n) * K + k];
      y[static_cast<size_t>(m) * N + n] = static_cast<float>(s);
    }
  return y;
}

// y = w * bf16(x * rsqrt(mean(x^2) + eps)) per row.
std::vector<float> ref_rmsnorm(const std::vector<float>& x, const std::vector<float>& w, int rows, int hidden) {
  std::vector<float> y(x.size());
  for (int r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < hidden; ++i) ss += static_cast<double>(x[r * hidden + i]) * x[r * hidden + i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / hidden + kEps));
    for (int i = 0; i < hidden; ++i) y[r * hidden + i] = round_bf16(x[r * hidden + i] * inv) * w[i];
  }
  return y;
}

TEST(CudaGemm, MatchesReferenceAcrossShapes) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(11);
  // (M, N, K): tensor-core streaming (M <= 16, N % 16 == 0, K % 32 == 0), the CUDA-core streaming kernel
  // (M <= 8, other N, K), and cuBLASLt sizes. Small M at the model's shapes (qkv 5120 x 2048, o 2048 x 4096, router
  // 128 x 2048) and odd ones, M = 1, 2, 8, 9 and 16: the weight tile bulk-copied into shared memory where every
  // tile's CTA fits (tiles evict-first at M <= 2), the register-streamed kernel for 9-16 rows at K <= 2048 and for
  // more tiles than resident CTAs, rows_ring for many tiles; K = 2080 (65 chunks of 32), N = 1040 (an odd number of
  // 16-row tiles), N with fewer row tiles than SMs.
  for (auto [M, N, K] : {std::tuple{1, 64, 2048}, {13, 160, 96}, {16, 512, 4096}, {1, 67, 200}, {5, 300, 136},
                         {8, 1000, 2048}, {13, 72, 104}, {64, 512, 256}, {1, 5120, 2048}, {1, 2048, 4096},
                         {16, 2048, 4096}, {9, 128, 2048}, {8, 48, 96}, {3, 208, 1056}, {16, 16, 32},
                         {5, 16 * 1000, 64}, {8, 2064, 2080}, {9, 1040, 4096}, {2, 2048, 4096}, {1, 48, 96},
                         {5, 4096, 2048}, {16, 128, 2080}, {3, 160, 1600}}) {
    SCOPED_TRACE(testing::Message() << "M=" << M << " N=" << N << " K=" << K);
    auto x = random_bf16(static_cast<size_t>(M) * K, rng), w = random_bf16(static_cast<size_t>(N) * K, rng);
    auto dx = upload_bf16(x), dw = upload_bf16(w);
    DevBuf<bf16> dy(static_cast<size_t>(M) * N);
    dy.poison();
    ZEST_ASSERT_OK(gemm(dx->get(), dw->get(), dy.get(), M, N, K, nullptr));
    sync_ok();
    const auto ref = ref_gemm(x.f, w.f, M, N, K);
    ZEST_EXPECT_CLOSE(download_bf16(dy), ref, kTol);
    if (N % 8 == 0) {
      dy.poison();
      ZEST_ASSERT_OK(gemm_cublaslt(dx->get(), dw->get(), dy.get(), M, N, K, nullptr));
      sync_ok();
      ZEST_EXPECT_CLOSE(download_bf16(dy), ref, kTol);
    }
  }
}

TEST(CudaGemm, RejectsBadSizes) {
  ZEST_REQUIRE_GPU();
  DevBuf<bf16> a(64);
  EXPECT_FALSE(gemm(a.get(), a.get(), a.get(), 0, 8, 8, nullptr).is_ok());
  EXPECT_FALSE(gemm(a.get(), a.get(), a.get(), 2, -1, 8, nullptr).is_ok());
}

TEST(CudaEmbedding, GathersRowsAndZeroesInvalidIds) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(12);
  const int vocab = 50, hidden = 72;
  auto table = random_bf16(static_cast<size_t>(vocab) * hidden, rng);
  std::vector<int32_t> ids = {3, 49, 0, 17, 60, -2, 3};
  const int n = static_cast<int>(ids.size());
  auto dt = upload_bf16(table);
  DevBuf<int32_t> di(ids);
  DevBuf<bf16> out(static_cast<size_t>(n) * hidden);
  out.poison();
  ZEST_ASSERT_OK(embedding(di.get(), dt->get(), out.get(), n, hidden, vocab, nullptr));
  sync_ok();
  const auto got = download_bf16(out);
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < hidden; ++i) {
      const bool ok = ids[t] >= 0 && ids[t] < vocab;
      const float want = ok ? table.f[static_cast<size_t>(ids[t]) * hidden + i] : 0.f;
      ASSERT_EQ(got[static_cast<size_t>(t) * hidden + i], want) << "token " << t << " dim " << i;
    }
}

TEST(CudaNorm, RmsnormMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(13);
  for (auto [rows, hidden] : {std::pair{1, 2048}, {5, 1000}, {3, 8}}) {
    auto x = random_bf16(static_cast<size_t>(rows) * hidden, rng, -3.f, 3.f), w = random_bf16(hidden, rng, 0.5f, 1.5f);
    auto dx = upload_bf16(x), dw = upload_bf16(w);
    DevBuf<bf16> dy(x.f.size());
    dy.poison();
    ZEST_ASSERT_OK(rmsnorm(dx->get(), dw->get(), dy.get(), rows, hidden, kEps, nullptr));
    sync_ok();
    ZEST_EXPECT_CLOSE(download_bf16(dy), ref_rmsnorm(x.f, w.f, rows, hidden), kTol);
  }
}

TEST(CudaNorm, AddRmsnormUpdatesResidualAndNormalises) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(14);
  const int rows = 4, hidden = 264;
  auto x = random_bf16(rows * hidden, rng, -2.f, 2.f), r = random_bf16(rows * hidden, rng),
       w = random_bf16(hidden, rng, 0.5f, 1.5f);
  auto dx = upload_bf16(x), dr = upload_bf16(r), dw = upload_bf16(w);
  DevBuf<bf16> dy(x.f.size());
  dy.poison();
  ZEST_ASSERT_OK(add_rmsnorm(dx->get(), dr->get(), dw->get(), dy.get(), rows, hidden, kEps, nullptr));
  sync_ok();
  std::vector<float> xs(x.f.size());
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = round_bf16(x.f[i] + r.f[i]);
  ZEST_EXPECT_CLOSE(download_bf16(*dx), xs, 1e-2);
  ZEST_EXPECT_CLOSE(download_bf16(dy), ref_rmsnorm(xs, w.f, rows, hidden), kTol);
}

// Without a norm weight add_rmsnorm updates the residual only and leaves y untouched, for a row held in registers
// (hidden <= 2048) and a longer one (the looped path).
TEST(CudaNorm, AddRmsnormWithoutWeightUpdatesResidualOnly) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(16);
  for (int hidden : {264, 2064}) {
    SCOPED_TRACE(testing::Message() << "hidden " << hidden);
    const int rows = 3;
    auto x = random_bf16(rows * hidden, rng, -2.f, 2.f), r = random_bf16(rows * hidden, rng);
    auto dx = upload_bf16(x), dr = upload_bf16(r);
    DevBuf<bf16> dy(x.f.size());
    dy.poison();
    ZEST_ASSERT_OK(add_rmsnorm(dx->get(), dr->get(), nullptr, dy.get(), rows, hidden, kEps, nullptr));
    sync_ok();
    std::vector<float> xs(x.f.size());
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = round_bf16(x.f[i] + r.f[i]);
    EXPECT_EQ(download_bf16(*dx), xs);
    std::vector<uint16_t> yb(x.f.size());
    ASSERT_EQ(cudaMemcpy(yb.data(), dy.get(), yb.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    for (uint16_t b : yb) ASSERT_EQ(b, 0xffffu) << "y written";
  }
}

TEST(CudaNorm, MoeCombineSkipsEmptySlotsAndNormalises) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(15);
  const int rows = 3, K = 4, hidden = 264;
  auto x = random_bf16(rows * hidden, rng), w = random_bf16(hidden, rng, 0.5f, 1.5f);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  std::vector<float> slots(static_cast<size_t>(rows) * K * hidden);
  for (auto& v : slots) v = d(rng);
  std::vector<int32_t> ids = {5, 2, -1, 7, 1, 0, 3, 4, -1, 6, 9, -1};
  for (int n = 0; n < rows; ++n)
    for (int k = 0; k < K; ++k)
      if (ids[n * K + k] < 0)
        for (int i = 0; i < hidden; ++i) slots[(static_cast<size_t>(n) * K + k) * hidden + i] = NAN;
  auto dx = upload_bf16(x), dw = upload_bf16(w);
  DevBuf<float> ds(slots);
  DevBuf<int32_t> di(ids);
  DevBuf<bf16> dy(x.f.size());
  dy.poison();
  ZEST_ASSERT_OK(moe_combine_add_rmsnorm(dx->get(), ds.get(), di.get(), K, dw->get(), dy.get(), rows, hidden, kEps, nullptr));
  sync_ok();
  std::vector<float> xs(x.f.size());
  for (int n = 0; n < rows; ++n)
    for (int i = 0; i < hidden; ++i) {
      double s = 0;
      for (int k = 0; k < K; ++k)
        if (ids[n * K + k] >= 0) s += slots[(static_cast<size_t>(n) * K + k) * hidden + i];
      xs[n * hidden + i] = round_bf16(x.f[n * hidden + i] + round_bf16(static_cast<float>(s)));
    }
  ZEST_EXPECT_CLOSE(download_bf16(*dx), xs, 1e-2);
  ZEST_EXPECT_CLOSE(download_bf16(dy), ref_rmsnorm(xs, w.f, rows, hidden), kTol);
}

// The combine over bf16 slot outputs (the prefill experts' default form) against the combine over the same values as
// fp32 slots: x and y bit for bit, rows that fit one chunk per thread (hidden 264) and longer rows (4104).
TEST(CudaNorm, MoeCombineBf16SlotsSameBitsAsFp32) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(151);
  for (const int hidden : {264, 4104}) {
    SCOPED_TRACE(testing::Message() << "hidden " << hidden);
    const int rows = 5, K = 8;
    auto x = random_bf16(rows * hidden, rng), w = random_bf16(hidden, rng, 0.5f, 1.5f);
    const size_t n = static_cast<size_t>(rows) * K * hidden;
    auto slots_bf = random_bf16(n, rng, -0.5f, 0.5f);  // values a bf16 slot holds exactly
    std::vector<int32_t> ids(static_cast<size_t>(rows) * K);
    std::uniform_int_distribution<int> id(-1, 127);  // some slots empty (-1)
    for (auto& v : ids) v = id(rng);
    std::vector<float> slots_f = slots_bf.f;
    auto dxa = upload_bf16(x), dxb = upload_bf16(x), dw = upload_bf16(w), dsb = upload_bf16(slots_bf);
    DevBuf<float> dsf(slots_f);
    DevBuf<int32_t> di(ids);
    DevBuf<bf16> dya(x.f.size()), dyb(x.f.size());
    dya.poison();
    dyb.poison();
    ZEST_ASSERT_OK(moe_combine_add_rmsnorm(dxa->get(), dsf.get(), di.get(), K, dw->get(), dya.get(), rows, hidden, kEps,
                                           nullptr));
    ZEST_ASSERT_OK(moe_combine_add_rmsnorm(dxb->get(), static_cast<const bf16*>(dsb->get()), di.get(), K, dw->get(),
                                           dyb.get(), rows, hidden, kEps, nullptr));
    sync_ok();
    const std::vector<float> xa = download_bf16(*dxa), xb = download_bf16(*dxb);
    EXPECT_EQ(xa, xb);
    EXPECT_NE(xa, x.f);  // the slots were added
    EXPECT_EQ(download_bf16(dya), download_bf16(dyb));
  }
}

TEST(CudaActivation, SiluMulMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(16);
  const int rows = 3, I = 100;
  auto gu = random_bf16(rows * 2 * I, rng, -4.f, 4.f);
  auto dgu = upload_bf16(gu);
  DevBuf<bf16> h(rows * I);
  h.poison();
  ZEST_ASSERT_OK(silu_mul(dgu->get(), h.get(), rows, I, nullptr));
  sync_ok();
  std::vector<float> ref(rows * I);
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < I; ++i) {
      const float g = gu.f[r * 2 * I + i], u = gu.f[r * 2 * I + I + i];
      ref[r * I + i] = g / (1.f + std::exp(-g)) * u;
    }
  ZEST_EXPECT_CLOSE(download_bf16(h), ref, kTol);
}

// Greedy argmax (argmax_rows: each row split over a cluster of 8 CTAs) against a scan in index order with a strict >
// (so ties go to the lowest index and NaN never wins): the Qwen3 vocabulary (16-byte loads), an odd vocabulary (scalar
// loads), and vocabularies smaller than the split (CTAs with nothing to scan); planted ties across the split's CTAs
// and inside one 8-element load, NaNs above every value, a row of -inf only (index 0).
TEST(CudaArgmax, FindsMaximumWithLowestIndexOnTies) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(17);
  for (int vocab : {151936, 151937, 64, 7}) {
    SCOPED_TRACE(testing::Message() << "vocab " << vocab);
    const int rows = 9;
    auto logits = random_bf16(static_cast<size_t>(rows) * vocab, rng, -5.f, 5.f);
    auto set = [&](int r, int j, float v) {
      if (j >= vocab) return;
      const size_t i = static_cast<size_t>(r) * vocab + j;
      logits.bits[i] = f32_to_bf16(v);
      logits.f[i] = bf16_to_f32(logits.bits[i]);
    };
    set(3, 90000, 8.f);  // row 3: a tie between the split's first and fifth CTA
    set(3, 1234, 8.f);
    set(4, 5, 9.f);  // row 4: a tie inside one 8-element load, a NaN before it
    set(4, 2, 9.f);
    set(4, 1, std::nanf(""));
    for (int j = 0; j < vocab; ++j) set(5, j, -INFINITY);  // row 5: nothing above -inf
    set(6, vocab - 1, 7.f);  // row 6: the last element
    auto dl = upload_bf16(logits);
    DevBuf<int32_t> out(rows);
    out.poison();
    ZEST_ASSERT_OK(argmax_rows(dl->get(), out.get(), rows, vocab, nullptr));
    sync_ok();
    const auto got = out.download();
    for (int r = 0; r < rows; ++r) {
      int best = -1;
      for (int j = 0; j < vocab; ++j) {
        const float v = logits.f[static_cast<size_t>(r) * vocab + j];
        if (!std::isnan(v) && (best < 0 || v > logits.f[static_cast<size_t>(r) * vocab + best])) best = j;
      }
      EXPECT_EQ(got[r], std::max(best, 0)) << "row " << r;
    }
    if (vocab > 90000) {
      EXPECT_EQ(got[3], 1234);
    }
    if (vocab > 5) {
      EXPECT_EQ(got[4], 2);
      EXPECT_EQ(got[6], vocab - 1);
    }
    EXPECT_EQ(got[5], 0);
  }
}

// The lm_head of a decode step and its argmax chained with programmatic launches (the logits are read only after the
// wait): the ids of a scan over the downloaded logits, at M = 1 and 8, three repetitions.
TEST(CudaArgmax, FollowsTheLmHeadWithProgrammaticLaunches) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(19);
  const bool pdl = programmatic_launch();
  set_programmatic_launch(true);
  const int N = 151936, K = 2048;
  auto w = random_bf16(static_cast<size_t>(N) * K, rng);
  auto dw = upload_bf16(w);
  for (int M : {1, 8}) {
    auto x = random_bf16(static_cast<size_t>(M) * K, rng);
    auto dx = upload_bf16(x);
    DevBuf<bf16> logits(static_cast<size_t>(M) * N);
    DevBuf<int32_t> ids(M);
    for (int rep = 0; rep < 3; ++rep) {
      logits.poison();
      ids.poison();
      ZEST_ASSERT_OK(gemm(dx->get(), dw->get(), logits.get(), M, N, K, nullptr));
      ZEST_ASSERT_OK(argmax_rows(logits.get(), ids.get(), M, N, nullptr));
      sync_ok();
      const auto l = download_bf16(logits);
      const auto got = ids.download();
      for (int m = 0; m < M; ++m) {
        int best = 0;
        for (int j = 1; j < N; ++j)
          if (l[static_cast<size_t>(m) * N + j] > l[static_cast<size_t>(m) * N + best]) best = j;
        EXPECT_EQ(got[m], best) << "M " << M << " row " << m << " repetition " << rep;
      }
    }
  }
  set_programmatic_launch(pdl);
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
