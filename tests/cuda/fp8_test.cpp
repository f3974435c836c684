// FP8-weight kernels (fp8.cu) against plain loops on fresh random inputs: FP8 codes drawn over every non-NaN value
// (zeros and subnormals included) with random per-chunk scales; references computed in double from the dequantized
// weights f32(code) * scale. The streaming product and the MoE experts within 1e-2 / 2e-2 of the largest reference
// (bf16 outputs and h, f32 sums in another order); the dequantizer bit for bit against the host rounding.
#ifdef ZEST_HAVE_CUDA
#include <cmath>
#include <cstring>
#include <tuple>

#include "cuda/cuda_test_util.h"
#include "cuda/moe_decode_case.h"

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

struct DevFp8 {
  DevBuf<uint8_t> q;
  DevBuf<float> s;
  explicit DevFp8(const HostFp8& h) : q(h.q), s(h.s) {}
  Fp8Weight view() const { return {q.get(), s.get()}; }
};

TEST(CudaFp8, StreamingProductMatchesDequantizedReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(903);
  // Model widths (qkv, one token), a K past the last full 64-column chunk, N ending in half a CTA (16 rows), a
  // second pass of tokens (33 > 32), the largest M.
  for (const auto& [M, N, K] : {std::tuple{1, 5120, 2048}, std::tuple{8, 512, 160}, std::tuple{13, 176, 768},
                                std::tuple{33, 96, 1024}, std::tuple{64, 256, 2048}, std::tuple{3, 48, 48}}) {
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

// The MoE experts over FP8 weights against ref_expert (moe_decode_case.h) on the dequantized weights; slots with
// id -1 stay unwritten.
void run_moe_case(const MoeCase& c, std::mt19937& rng) {
  SCOPED_TRACE(testing::Message() << "N=" << c.N << " K=" << c.K << " E=" << c.E << " H=" << c.H << " I=" << c.I
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
  ZEST_ASSERT_OK(moe_experts_fp8(dx->get(), plan, w.get(), dgu.view(), ddn.view(), h.get(), out.get(), c.N, c.K, c.E,
                                 c.H, c.I, nullptr));
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
