// FP8-weight kernels (fp8.cu) against plain loops on fresh random inputs: FP8 codes drawn over every non-NaN value
// (zeros and subnormals included) with random per-chunk scales; references computed in double from the dequantized
// weights f32(code) * scale. The streaming product and the MoE experts within 1e-2 / 2e-2 of the largest reference
// (bf16 outputs and h, f32 sums in another order); the dequantizer bit for bit against the host rounding.
#ifdef ZEST_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "cuda/cuda_test_util.h"
#include "cuda/moe_decode_case.h"
#include "cuda/paged_kv_case.h"
#include "kernels/cuda/moe_stream.h"

namespace zest::cuda::test {
namespace {

// A random FP8 weight [rows, K] in the kernels' layout, with its dequantized values (HostBF16::f; bits unused).
struct HostFp8 {
  std::vector<uint8_t> q;
  std::vector<float> s;
  HostBF16 deq;
};

HostFp8 random_fp8(int rows, int K, std::mt19937& rng, float amax) {
  std::uniform_int_distribution<int> code(0, 255);
  std::uniform_real_distribution<float> sd(0.5f, 1.f);
  HostFp8 w;
  const int kc = (K + 63) / 64;
  w.q.resize(static_cast<size_t>(rows) * K);
  for (auto& b : w.q) {
    do b = static_cast<uint8_t>(code(rng));
    while ((b & 0x7f) == 0x7f);  // no NaN codes
  }
  w.s.resize(static_cast<size_t>(rows / 16) * kc);
  for (auto& v : w.s) v = amax / 448.f * sd(rng);
  w.deq.f.resize(w.q.size());
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(r) * K + k;
      w.deq.f[i] = f8e4m3_to_f32(w.q[i]) * w.s[static_cast<size_t>(r / 16) * kc + k / 64];
    }
  return w;
}

// random_fp8 with one scale per 128 x 128 block (the official checkpoints' blocks; what the tensor-core products take).
HostFp8 random_fp8_blocks(int rows, int K, std::mt19937& rng, float amax) {
  HostFp8 w = random_fp8(rows, K, rng, amax);
  const int kc = (K + 63) / 64;
  for (int r = 0; r < rows; ++r)
    for (int k = 0; k < K; ++k) {
      const float s = w.s[static_cast<size_t>(r / 128 * 8) * kc + k / 128 * 2];
      w.s[static_cast<size_t>(r / 16) * kc + k / 64] = s;
      const size_t i = static_cast<size_t>(r) * K + k;
      w.deq.f[i] = f8e4m3_to_f32(w.q[i]) * s;
    }
  return w;
}

// Rows quantized on the device (quantize_rows_fp8) and their dequantized values on the host.
struct QuantRows {
  DevBuf<uint8_t> q;
  DevBuf<float> s;
  std::vector<float> deq;
  QuantRows(const bf16* x, int rows, int K)
      : q(static_cast<size_t>(rows) * K), s(static_cast<size_t>(rows) * (K / 128)) {
    EXPECT_TRUE(quantize_rows_fp8(x, q.get(), s.get(), rows, K, nullptr).is_ok());
    sync_ok();
    const auto codes = q.download();
    const auto sc = s.download();
    deq.resize(codes.size());
    for (size_t i = 0; i < codes.size(); ++i) deq[i] = f8e4m3_to_f32(codes[i]) * sc[i / K * (K / 128) + i % K / 128];
  }
};

// The bits of bf16 values (for exact comparisons: poisoned values are NaNs).
std::vector<uint16_t> bits(const std::vector<bf16>& v) {
  std::vector<uint16_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 2);
  return b;
}

struct DevFp8 {
  DevBuf<uint8_t> q;
  DevBuf<float> s;
  explicit DevFp8(const HostFp8& h) : q(h.q), s(h.s) {}
  Fp8Weight view() const { return {q.get(), s.get()}; }
};

TEST(CudaFp8, StreamingProductMatchesDequantizedReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(903);
  // Model widths (qkv and o, one token), a K past the last full 64-column chunk, N ending in half a CTA (16 rows), a
  // second pass of tokens (33 > 32), the largest M; a K whose 16-row tile does not fit shared memory (two segments),
  // with one pass and with two (the segments loaded again for the second).
  for (const auto& [M, N, K] : {std::tuple{1, 5120, 2048}, std::tuple{1, 2048, 4096}, std::tuple{8, 512, 160},
                                std::tuple{13, 176, 768}, std::tuple{33, 96, 1024}, std::tuple{64, 256, 2048},
                                std::tuple{3, 48, 48}, std::tuple{2, 32, 14336}, std::tuple{40, 16, 14336}}) {
    SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K);
    const HostFp8 w = random_fp8(N, K, rng, 0.05f);
    const HostBF16 x = random_bf16(static_cast<size_t>(M) * K, rng);
    std::vector<float> ref(static_cast<size_t>(M) * N);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double a = 0;
        for (int k = 0; k < K; ++k)
          a += static_cast<double>(x.f[static_cast<size_t>(m) * K + k]) * w.deq.f[static_cast<size_t>(n) * K + k];
        ref[static_cast<size_t>(m) * N + n] = static_cast<float>(a);
      }
    auto dx = upload_bf16(x);
    DevFp8 dw(w);
    DevBuf<bf16> dy(static_cast<size_t>(M) * N);
    dy.poison();
    ZEST_ASSERT_OK(gemm_fp8(dx->get(), dw.view(), dy.get(), M, N, K, nullptr));
    sync_ok();
    ZEST_EXPECT_CLOSE(download_bf16(dy), ref, 1e-2);
  }
  DevBuf<bf16> dy(16 * 65);
  DevBuf<uint8_t> dq(16 * 128);
  EXPECT_EQ(gemm_fp8(dy.get(), {dq.get(), nullptr}, dy.get(), 65, 16, 128, nullptr).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(gemm_fp8(dy.get(), {dq.get(), nullptr}, dy.get(), 1, 20, 128, nullptr).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(gemm_fp8(dy.get(), {dq.get(), nullptr}, dy.get(), 1, 16, 120, nullptr).code(),
            ErrorCode::kInvalidArgument);
}

// The residual add and RMSNorm folded into gemm_fp8 at one row (the decoder's FP8 o projection at one token): x and y
// get the bits add_rmsnorm gives over the folded launch's own output row (the same row arithmetic on as many threads);
// with no norm weight only x changes; the output row agrees with the unfolded product's (the fold splits k over 8
// warps); the exit counter is left zero, so a second launch finds it ready; bad fold arguments are refused.
TEST(CudaFp8, GemmFoldsTheAddAndNormAtOneRow) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(913);
  for (const auto& [N, K] : {std::pair{2048, 4096}, std::pair{512, 256}}) {
    for (const bool norm : {true, false}) {
      SCOPED_TRACE(testing::Message() << "N " << N << " K " << K << " norm " << norm);
      const HostFp8 w = random_fp8(N, K, rng, 0.05f);
      const HostBF16 x = random_bf16(static_cast<size_t>(K), rng);
      const HostBF16 res = random_bf16(static_cast<size_t>(N), rng);
      const HostBF16 nw = random_bf16(static_cast<size_t>(N), rng);
      auto dx = upload_bf16(x);
      auto dnw = upload_bf16(nw);
      DevFp8 dw(w);
      DevBuf<bf16> o(static_cast<size_t>(N));
      DevBuf<unsigned> done(1);
      ASSERT_EQ(cudaMemset(done.get(), 0, sizeof(unsigned)), cudaSuccess);
      ZEST_ASSERT_OK(gemm_fp8(dx->get(), dw.view(), o.get(), 1, N, K, nullptr));
      sync_ok();
      const std::vector<float> unfolded = download_bf16(o);
      for (int rep = 0; rep < 2; ++rep) {
        auto fx = upload_bf16(res);
        DevBuf<bf16> fy(static_cast<size_t>(N));
        fy.poison();
        const auto poisoned = bits(fy.download());
        Fp8AddNorm an;
        an.x = fx->get();
        an.w = norm ? dnw->get() : nullptr;
        an.y = norm ? fy.get() : nullptr;
        an.eps = 1e-6f;
        an.done = done.get();
        o.poison();
        ZEST_ASSERT_OK(gemm_fp8(dx->get(), dw.view(), o.get(), 1, N, K, nullptr, &an));
        sync_ok();
        EXPECT_EQ(done.download()[0], 0u) << "launch " << rep;
        auto rx = upload_bf16(res);
        DevBuf<bf16> ry(static_cast<size_t>(N));
        ry.poison();
        ZEST_ASSERT_OK(add_rmsnorm(rx->get(), o.get(), norm ? dnw->get() : nullptr, ry.get(), 1, N, 1e-6f, nullptr));
        sync_ok();
        EXPECT_NE(bits(rx->download()), res.bits);  // the product moved x
        EXPECT_EQ(bits(fx->download()), bits(rx->download())) << "launch " << rep;
        EXPECT_EQ(bits(fy.download()), norm ? bits(ry.download()) : poisoned) << "launch " << rep;
        ZEST_EXPECT_CLOSE(download_bf16(o), unfolded, 1e-2);
      }
    }
  }
  DevBuf<bf16> buf(4096);
  DevBuf<uint8_t> q(4096 * 16);
  DevBuf<unsigned> done(1);
  Fp8AddNorm an;  // no x
  an.done = done.get();
  EXPECT_EQ(gemm_fp8(buf.get(), {q.get(), nullptr}, buf.get(), 1, 256, 16, nullptr, &an).code(),
            ErrorCode::kInvalidArgument);
  an.x = buf.get();  // two rows
  EXPECT_EQ(gemm_fp8(buf.get(), {q.get(), nullptr}, buf.get(), 2, 256, 16, nullptr, &an).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(gemm_fp8(buf.get(), {q.get(), nullptr}, buf.get(), 1, 4096, 16, nullptr, &an).code(),  // past 2048
            ErrorCode::kInvalidArgument);
}

// The FP8 qkv product with L2 prefetches of a paged KV cache (gemm_fp8_kv_prefetch: at most 2 rows): the bits of
// gemm_fp8, for 1, 2 and 3 sequences (3: no prefetch) of mixed context lengths over a shuffled block table; without a
// cache described, gemm_fp8; the caches are read only; a KvPrefetch with a norm weight is refused.
TEST(CudaFp8, KvPrefetchProductMatchesGemmFp8) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(917);
  const int N = 5120, K = 2048, Hkv = 4;
  const HostFp8 w = random_fp8(N, K, rng, 0.05f);
  DevFp8 dw(w);
  for (int M : {1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << "M " << M);
    std::vector<int32_t> lens(M);
    const int choose[] = {1, 17, 1025};
    for (int b = 0; b < M; ++b) lens[b] = choose[(b + M) % 3];
    const PagedKvCase cache(lens, Hkv, rng);
    const HostBF16 x = random_bf16(static_cast<size_t>(M) * K, rng);
    auto dx = upload_bf16(x);
    DevBuf<bf16> base(static_cast<size_t>(M) * N);
    ZEST_ASSERT_OK(gemm_fp8(dx->get(), dw.view(), base.get(), M, N, K, nullptr));
    sync_ok();
    const auto want = bits(base.download());
    const KvPrefetch& kv = cache.kv;
    for (bool with_cache : {true, false}) {
      SCOPED_TRACE(with_cache ? "cache" : "no cache");
      KvPrefetch use = kv;
      if (!with_cache) use.k_cache = nullptr;
      DevBuf<bf16> dy(static_cast<size_t>(M) * N);
      dy.poison();
      ZEST_ASSERT_OK(gemm_fp8_kv_prefetch(dx->get(), dw.view(), dy.get(), M, N, K, use, nullptr));
      sync_ok();
      EXPECT_EQ(bits(dy.download()), want);
    }
    EXPECT_EQ(bits(cache.dk->download()), cache.kc.bits);
    EXPECT_EQ(bits(cache.dv->download()), cache.vc.bits);
    KvPrefetch normed = kv;
    normed.norm_w = dx->get();
    EXPECT_EQ(gemm_fp8_kv_prefetch(dx->get(), dw.view(), base.get(), M, N, K, normed, nullptr).code(),
              ErrorCode::kInvalidArgument);
  }
}

TEST(CudaFp8, DequantizeMatchesHostRounding) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(905);
  const int rows = 48, K = 208;
  const HostFp8 w = random_fp8(rows, K, rng, 2.f);
  DevFp8 dw(w);
  DevBuf<bf16> out(static_cast<size_t>(rows) * K);
  out.poison();
  ZEST_ASSERT_OK(dequantize_fp8(dw.view(), out.get(), rows, K, nullptr));
  sync_ok();
  std::vector<uint16_t> bits(out.size());
  ASSERT_EQ(cudaMemcpy(bits.data(), out.get(), bits.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < bits.size(); ++i) ASSERT_EQ(bits[i], f32_to_bf16(w.deq.f[i])) << "element " << i;
}

// The nearest e4m3 code of v (ties to the even code, magnitudes past 448 saturated), by search over every finite code.
uint8_t nearest_e4m3(float v) {
  const float a = std::fabs(v);
  int best = 0;
  for (int c = 1; c < 0x7f; ++c) {
    const float d = std::fabs(f8e4m3_to_f32(static_cast<uint8_t>(c)) - a), bd = std::fabs(f8e4m3_to_f32(best) - a);
    if (d < bd || (d == bd && c % 2 == 0)) best = c;
  }
  return static_cast<uint8_t>(best | (std::signbit(v) ? 0x80 : 0));
}

TEST(CudaFp8, QuantizeRowsMatchesNearestCodes) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(913);
  const int rows = 37, K = 384;
  HostBF16 x = random_bf16(static_cast<size_t>(rows) * K, rng);
  // one all-zero block, one block with a single large value (the rest underflow towards subnormals and zero)
  for (int k = 128; k < 256; ++k) x.f[static_cast<size_t>(5) * K + k] = 0.f;
  for (int k = 0; k < 128; ++k) x.f[static_cast<size_t>(9) * K + k] *= 1e-3f;
  x.f[static_cast<size_t>(9) * K + 17] = -300.f;
  for (size_t i = 0; i < x.f.size(); ++i) {
    x.bits[i] = f32_to_bf16(x.f[i]);
    x.f[i] = bf16_to_f32(x.bits[i]);
  }
  auto dx = upload_bf16(x);
  DevBuf<uint8_t> q(static_cast<size_t>(rows) * K);
  DevBuf<float> sc(static_cast<size_t>(rows) * (K / 128));
  ZEST_ASSERT_OK(quantize_rows_fp8(dx->get(), q.get(), sc.get(), rows, K, nullptr));
  sync_ok();
  const auto codes = q.download();
  const auto scales = sc.download();
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < K / 128; ++b) {
      float amax = 0.f;
      for (int k = 0; k < 128; ++k) amax = std::max(amax, std::fabs(x.f[static_cast<size_t>(r) * K + b * 128 + k]));
      const float inv = amax > 0.f ? 448.f / amax : 1.f;
      ASSERT_EQ(scales[static_cast<size_t>(r) * (K / 128) + b], amax > 0.f ? amax / 448.f : 1.f) << r << " " << b;
      for (int k = 0; k < 128; ++k) {
        const size_t i = static_cast<size_t>(r) * K + b * 128 + k;
        ASSERT_EQ(codes[i], nearest_e4m3(x.f[i] * inv)) << "row " << r << " column " << b * 128 + k;
      }
    }
  EXPECT_EQ(quantize_rows_fp8(dx->get(), q.get(), sc.get(), rows, 200, nullptr).code(), ErrorCode::kInvalidArgument);
}

TEST(CudaFp8, TensorCoreDenseMatchesQuantizedReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(917);
  // one token; a decode step's 40 rows (one part tile, the second warpgroup idle) over 16 chunks (the ring wraps); a
  // last row tile of 44 rows; three row tiles
  for (const auto& [M, N, K] : {std::tuple{1, 256, 384}, std::tuple{40, 512, 2048}, std::tuple{300, 128, 256},
                                std::tuple{384, 384, 1024}}) {
    SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K);
    const HostFp8 w = random_fp8_blocks(N, K, rng, 0.05f);
    const HostBF16 x = random_bf16(static_cast<size_t>(M) * K, rng);
    auto dx = upload_bf16(x);
    const QuantRows xq(dx->get(), M, K);
    std::vector<float> ref(static_cast<size_t>(M) * N);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < N; ++n) {
        double a = 0;
        for (int k = 0; k < K; ++k)
          a += static_cast<double>(xq.deq[static_cast<size_t>(m) * K + k]) * w.deq.f[static_cast<size_t>(n) * K + k];
        ref[static_cast<size_t>(m) * N + n] = static_cast<float>(a);
      }
    DevFp8 dw(w);
    DevBuf<bf16> dy(static_cast<size_t>(M) * N);
    dy.poison();
    ZEST_ASSERT_OK(gemm_fp8_tc(xq.q.get(), xq.s.get(), dw.view(), dy.get(), M, N, K, nullptr));
    sync_ok();
    ZEST_EXPECT_CLOSE(download_bf16(dy), ref, 1e-2);
  }
  DevBuf<uint8_t> q(128 * 128);
  DevBuf<bf16> y(128 * 128);
  EXPECT_EQ(gemm_fp8_tc(q.get(), nullptr, {q.get(), nullptr}, y.get(), 4, 96, 128, nullptr).code(),
            ErrorCode::kInvalidArgument);
}

// The experts on FP8 tensor cores: gate/up's h against the host's from the device-quantized token rows, then down's
// slot outputs against the host's from the device-quantized h (each product checked on the inputs it was given).
TEST(CudaFp8, TensorCoreExpertsMatchQuantizedReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(919);
  // A hot expert with 300 slots (three row tiles), holes, 16 experts of which some idle.
  const MoeCase c{300, 4, 16, 256, 384, 12, 5, 7};
  const Routing route = make_routing(c, rng);
  const HostBF16 x = random_bf16(static_cast<size_t>(c.N) * c.H, rng);
  const HostFp8 gu = random_fp8_blocks(c.E * 2 * c.I, c.H, rng, 2.f * std::sqrt(3.f / c.H));
  const HostFp8 dn = random_fp8_blocks(c.E * c.H, c.I, rng, 2.f * std::sqrt(3.f / c.I));
  auto dx = upload_bf16(x);
  const QuantRows xq(dx->get(), c.N, c.H);
  DevFp8 dgu(gu), ddn(dn);
  DevBuf<int32_t> ids(route.ids);
  const int NK = c.N * c.K;
  DevBuf<float> w(route.w), out(static_cast<size_t>(NK) * c.H);
  DevBuf<bf16> h(static_cast<size_t>(NK) * c.I);
  DevBuf<unsigned char> plan_buf(moe_plan_bytes(c.N, c.K, c.E));
  MoePlan plan;
  moe_plan_bind(plan, plan_buf.get(), c.N, c.K, c.E);
  ZEST_ASSERT_OK(moe_plan_prefill(ids.get(), c.N, c.K, c.E, plan, nullptr, nullptr));
  h.poison();
  ZEST_ASSERT_OK(moe_gate_up_fp8_tc(xq.q.get(), xq.s.get(), plan, dgu.view(), h.get(), c.N, c.K, c.E, c.H, c.I,
                                    nullptr));
  sync_ok();
  // The plan's sorted positions (host copy of the device plan's offsets and slots).
  std::vector<int32_t> sorted(NK), offsets(c.E + 1), active(c.E);
  int na = 0;
  ASSERT_EQ(cudaMemcpy(&na, plan.num_active, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(sorted.data(), plan.sorted_slots, NK * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(offsets.data(), plan.offsets, (na + 1) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(active.data(), plan.active_experts, na * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  const auto hb = download_bf16(h);
  std::vector<float> got_h, ref_h;
  for (int j = 0; j < na; ++j)
    for (int pos = offsets[j]; pos < offsets[j + 1]; ++pos) {
      const int e = active[j], tok = sorted[pos] / c.K;
      for (int i = 0; i < c.I; ++i) {
        double g = 0, u = 0;
        for (int k = 0; k < c.H; ++k) {
          const double xv = xq.deq[static_cast<size_t>(tok) * c.H + k];
          g += xv * gu.deq.f[(static_cast<size_t>(e) * 2 * c.I + i) * c.H + k];
          u += xv * gu.deq.f[(static_cast<size_t>(e) * 2 * c.I + c.I + i) * c.H + k];
        }
        const float gv = round_bf16(static_cast<float>(g));
        ref_h.push_back(round_bf16(gv / (1.f + std::exp(-gv))) * round_bf16(static_cast<float>(u)));
        got_h.push_back(hb[static_cast<size_t>(pos) * c.I + i]);
      }
    }
  ASSERT_FALSE(ref_h.empty());
  ZEST_EXPECT_CLOSE(got_h, ref_h, 2e-2);
  const QuantRows hq(h.get(), NK, c.I);
  out.poison();
  ZEST_ASSERT_OK(moe_down_fp8_tc(hq.q.get(), hq.s.get(), plan, w.get(), ddn.view(), out.get(), c.N, c.K, c.E, c.H,
                                 c.I, nullptr));
  sync_ok();
  const auto all = out.download();
  std::vector<float> got, ref;
  for (int j = 0; j < na; ++j)
    for (int pos = offsets[j]; pos < offsets[j + 1]; ++pos) {
      const int e = active[j], slot = sorted[pos];
      for (int r = 0; r < c.H; ++r) {
        double a = 0;
        for (int i = 0; i < c.I; ++i)
          a += static_cast<double>(hq.deq[static_cast<size_t>(pos) * c.I + i]) *
               dn.deq.f[(static_cast<size_t>(e) * c.H + r) * c.I + i];
        ref.push_back(static_cast<float>(a) * route.w[slot]);
        got.push_back(all[static_cast<size_t>(slot) * c.H + r]);
      }
    }
  ZEST_EXPECT_CLOSE(got, ref, 2e-2);
  // The slots as bf16: the same values (they are bf16-exact), in half the bytes.
  DevBuf<bf16> out16(static_cast<size_t>(c.N) * c.K * c.H);
  out16.poison();
  ZEST_ASSERT_OK(moe_down_fp8_tc(hq.q.get(), hq.s.get(), plan, w.get(), ddn.view(), out16.get(), c.N, c.K, c.E, c.H,
                                 c.I, nullptr));
  sync_ok();
  const auto all16 = download_bf16(out16);
  size_t checked = 0;
  for (size_t slot = 0; slot < route.ids.size(); ++slot) {
    if (route.ids[slot] < 0) continue;
    for (int r = 0; r < c.H; ++r, ++checked)
      ASSERT_EQ(all16[slot * c.H + r], all[slot * c.H + r]) << "slot " << slot << " row " << r;
  }
  EXPECT_GT(checked, 0u);
}

// The MoE experts over FP8 weights against ref_expert (moe_decode_case.h) on the dequantized weights; slots with
// id -1 stay unwritten. stream: moe_experts_stream_fp8 (the persistent weight-streaming kernel), else moe_experts_fp8.
void run_moe_case(const MoeCase& c, std::mt19937& rng, bool stream = false) {
  SCOPED_TRACE(testing::Message() << (stream ? "stream " : "") << "N=" << c.N << " K=" << c.K << " E=" << c.E << " H=" << c.H << " I=" << c.I
                                  << " pool=" << c.pool << " hot=" << c.hot << " holes=" << c.holes
                                  << " dup=" << c.dup);
  const Routing route = make_routing(c, rng);
  const HostBF16 x = random_bf16(static_cast<size_t>(c.N) * c.H, rng);
  const HostFp8 gu = random_fp8(c.E * 2 * c.I, c.H, rng, 2.f * std::sqrt(3.f / c.H));
  const HostFp8 dn = random_fp8(c.E * c.H, c.I, rng, 2.f * std::sqrt(3.f / c.I));
  auto dx = upload_bf16(x);
  DevFp8 dgu(gu), ddn(dn);
  DevBuf<int32_t> ids(route.ids);
  DevBuf<float> w(route.w), out(static_cast<size_t>(c.N) * c.K * c.H);
  DevBuf<bf16> h(static_cast<size_t>(c.N) * c.K * c.I);
  DevBuf<unsigned char> plan_buf(moe_plan_bytes(c.N, c.K, c.E));
  MoePlan plan;
  moe_plan_bind(plan, plan_buf.get(), c.N, c.K, c.E);
  ZEST_ASSERT_OK(moe_plan(ids.get(), c.N, c.K, c.E, plan, nullptr, nullptr));
  out.poison();
  if (stream)
    ZEST_ASSERT_OK(moe_experts_stream_fp8(dx->get(), plan, w.get(), dgu.view(), ddn.view(), h.get(), out.get(), c.N,
                                          c.K, c.E, c.H, c.I, nullptr));
  else
    ZEST_ASSERT_OK(moe_experts_fp8(dx->get(), plan, w.get(), dgu.view(), ddn.view(), h.get(), out.get(), c.N, c.K,
                                   c.E, c.H, c.I, nullptr));
  sync_ok();
  const auto all = out.download();
  std::vector<uint32_t> bits(all.size());
  std::memcpy(bits.data(), all.data(), all.size() * 4);
  std::vector<float> got, ref;
  for (int n = 0; n < c.N; ++n)
    for (int k = 0; k < c.K; ++k) {
      const size_t slot = static_cast<size_t>(n) * c.K + k;
      if (route.ids[slot] < 0) {
        for (int r = 0; r < c.H; ++r) ASSERT_EQ(bits[slot * c.H + r], 0xffffffffu) << "slot " << slot;
        continue;
      }
      got.insert(got.end(), all.begin() + slot * c.H, all.begin() + (slot + 1) * c.H);
      const auto r = ref_slot(c, x, gu.deq, dn.deq, route, n, k);
      ref.insert(ref.end(), r.begin(), r.end());
    }
  if (!ref.empty()) ZEST_EXPECT_CLOSE(got, ref, 2e-2);
}

TEST(CudaFp8, MoeExpertsMatchHostLoop) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(907);
  // Model widths (Qwen3-30B-A3B: H 2048, I 768) at one and seven tokens; more tokens than a pass (hot expert with
  // 64); widths past the last full chunk with empty slots; repeated ids (SERE folds) giving an expert 2N slots.
  run_moe_case({1, 8, 8, 2048, 768, 0, -1, 0}, rng);
  run_moe_case({7, 8, 16, 2048, 768, 0, -1, 0}, rng);
  run_moe_case({64, 8, 32, 256, 128, 0, 3, 0}, rng);
  run_moe_case({40, 4, 16, 160, 48, 0, -1, 5}, rng);
  run_moe_case({12, 2, 4, 256, 96, 0, -1, 0, true}, rng);
  // 128 experts, all active at 64 tokens.
  run_moe_case({64, 8, 128, 512, 256, 0, -1, 0}, rng);
}

// The combine folded into the down kernel at one token (the decoder's FP8 one-token step): x and y get the bits
// moe_combine_add_rmsnorm gives over the folded launch's own slots (its row arithmetic, common.cuh's combine_norm_row,
// on as many threads), empty slots (-1) skipped; with no norm weight only x changes; the slots agree with the unfolded
// launch's (the folded one splits k over 8 warps: bf16 noise); the exit counter is left zero, so a second launch finds
// it ready. Mutations: a CTA that leaves without counting (no expert) makes no CTA last and x stays unchanged; a
// counter left non-zero breaks the second launch.
TEST(CudaFp8, MoeExpertsFoldTheCombineAtOneToken) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(911);
  for (const MoeCase& c : {MoeCase{1, 8, 16, 2048, 256, 0, -1, 0}, MoeCase{1, 8, 16, 512, 128, 0, -1, 3}}) {
    for (const bool norm : {true, false}) {
      SCOPED_TRACE(testing::Message() << "H=" << c.H << " holes=" << c.holes << " norm=" << norm);
      const Routing route = make_routing(c, rng);
      const HostBF16 x = random_bf16(static_cast<size_t>(c.H), rng);
      const HostBF16 res = random_bf16(static_cast<size_t>(c.H), rng);
      const HostBF16 nw = random_bf16(static_cast<size_t>(c.H), rng);
      const HostFp8 gu = random_fp8(c.E * 2 * c.I, c.H, rng, 2.f * std::sqrt(3.f / c.H));
      const HostFp8 dn = random_fp8(c.E * c.H, c.I, rng, 2.f * std::sqrt(3.f / c.I));
      auto dx = upload_bf16(x);
      auto dnw = upload_bf16(nw);
      DevFp8 dgu(gu), ddn(dn);
      DevBuf<int32_t> ids(route.ids);
      DevBuf<float> w(route.w), out(static_cast<size_t>(c.K) * c.H);
      DevBuf<bf16> h(static_cast<size_t>(c.K) * c.I);
      DevBuf<unsigned char> plan_buf(moe_plan_bytes(c.N, c.K, c.E));
      DevBuf<unsigned> done(1);
      ASSERT_EQ(cudaMemset(done.get(), 0, sizeof(unsigned)), cudaSuccess);
      MoePlan plan;
      moe_plan_bind(plan, plan_buf.get(), c.N, c.K, c.E);
      ZEST_ASSERT_OK(moe_plan(ids.get(), c.N, c.K, c.E, plan, nullptr, nullptr));
      out.poison();
      ZEST_ASSERT_OK(moe_experts_fp8(dx->get(), plan, w.get(), dgu.view(), ddn.view(), h.get(), out.get(), c.N, c.K,
                                     c.E, c.H, c.I, nullptr));
      sync_ok();
      const std::vector<float> unfolded = out.download();
      for (int rep = 0; rep < 2; ++rep) {
        auto fx = upload_bf16(res);
        DevBuf<bf16> fy(static_cast<size_t>(c.H));
        fy.poison();
        const auto poisoned = bits(fy.download());
        Fp8AddNorm cmb;
        cmb.x = fx->get();
        cmb.ids = ids.get();
        cmb.w = norm ? dnw->get() : nullptr;
        cmb.y = norm ? fy.get() : nullptr;
        cmb.eps = 1e-6f;
        cmb.done = done.get();
        out.poison();
        ZEST_ASSERT_OK(moe_experts_fp8(dx->get(), plan, w.get(), dgu.view(), ddn.view(), h.get(), out.get(), c.N, c.K,
                                       c.E, c.H, c.I, nullptr, &cmb));
        sync_ok();
        EXPECT_EQ(done.download()[0], 0u) << "launch " << rep;
        // The reference: the combine kernel over the same slots.
        auto rx = upload_bf16(res);
        DevBuf<bf16> ry(static_cast<size_t>(c.H));
        ry.poison();
        ZEST_ASSERT_OK(moe_combine_add_rmsnorm(rx->get(), out.get(), ids.get(), c.K, norm ? dnw->get() : nullptr,
                                               ry.get(), 1, c.H, 1e-6f, nullptr));
        sync_ok();
        EXPECT_NE(bits(rx->download()), bits(upload_bf16(res)->download()));  // the slots moved x
        EXPECT_EQ(bits(fx->download()), bits(rx->download())) << "launch " << rep;
        EXPECT_EQ(bits(fy.download()), norm ? bits(ry.download()) : poisoned) << "launch " << rep;
        std::vector<float> got, want;
        const auto folded = out.download();
        for (int k = 0; k < c.K; ++k) {
          if (route.ids[k] < 0) continue;
          got.insert(got.end(), folded.begin() + k * c.H, folded.begin() + (k + 1) * c.H);
          want.insert(want.end(), unfolded.begin() + k * c.H, unfolded.begin() + (k + 1) * c.H);
        }
        ZEST_EXPECT_CLOSE(got, want, 1e-3);
      }
    }
  }
  DevBuf<bf16> buf(4096);
  DevBuf<unsigned char> q(4096), plan_buf(moe_plan_bytes(1, 8, 16));
  MoePlan plan;
  moe_plan_bind(plan, plan_buf.get(), 1, 8, 16);
  Fp8AddNorm cmb;  // no x, ids or counter
  EXPECT_EQ(moe_experts_fp8(buf.get(), plan, nullptr, {q.get(), nullptr}, {q.get(), nullptr}, buf.get(), nullptr, 1, 8,
                            16, 256, 128, nullptr, &cmb)
                .code(),
            ErrorCode::kInvalidArgument);
}

TEST(CudaFp8, MoeStreamMatchesHostLoop) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(911);
  // Model widths at one, five and seven tokens; 33 tokens (three passes of 16 for the hot expert); empty slots;
  // repeated ids; 128 experts all active at 64 tokens; I a single 256-column stage.
  run_moe_case({1, 8, 8, 2048, 768, 0, -1, 0}, rng, true);
  run_moe_case({7, 8, 16, 2048, 768, 0, -1, 0}, rng, true);
  run_moe_case({33, 8, 32, 512, 768, 0, 3, 0}, rng, true);
  run_moe_case({40, 4, 16, 256, 512, 0, -1, 5}, rng, true);
  run_moe_case({12, 2, 4, 256, 256, 0, -1, 0, true}, rng, true);
  run_moe_case({64, 8, 128, 512, 256, 0, -1, 0}, rng, true);
  run_moe_case({5, 8, 64, 2048, 768, 0, -1, 0}, rng, true);
  MoePlan plan;
  DevBuf<bf16> buf(1024);
  DevBuf<uint8_t> q(1024);
  EXPECT_FALSE(moe_stream_fp8_ok(2048, 192));
  EXPECT_EQ(moe_experts_stream_fp8(buf.get(), plan, nullptr, {q.get(), nullptr}, {q.get(), nullptr}, buf.get(),
                                   nullptr, 1, 2, 4, 2048, 192, nullptr)
                .code(),
            ErrorCode::kUnsupported);
}

TEST(CudaFp8, MoeExpertsRefuseWidthsOffSixteen) {
  ZEST_REQUIRE_GPU();
  MoePlan plan;
  DevBuf<bf16> buf(1024);
  DevBuf<uint8_t> q(1024);
  EXPECT_EQ(moe_experts_fp8(buf.get(), plan, nullptr, {q.get(), nullptr}, {q.get(), nullptr}, buf.get(), nullptr, 1, 2,
                            4, 160, 40, nullptr)
                .code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
