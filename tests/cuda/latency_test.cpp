// Low-latency decode kernels (batch 1-16) against plain loops: the small-M GEMM with its weight tile in shared memory,
// the fused routing kernel (router GEMM + top-k + MoE plan in one cluster launch) and the synthetic decoder with
// these variants (graph capture, SERE).
#ifdef ZEST_HAVE_CUDA
#include <numeric>
#include <tuple>

#include "cuda/cuda_test_util.h"
#include "kernels/cuda/synthetic_decoder.h"

namespace zest::cuda::test {
namespace {

constexpr double kTol = 2e-2;  // bf16 outputs: max abs err <= 2e-2 * max |ref|

struct OptionScope {
  DecodeOption opt;
  OptionScope(DecodeOption o, int v) : opt(o) { set_decode_option(o, v); }
  ~OptionScope() { set_decode_option(opt, default_decode_option(opt)); }
};

// y = x W^T in double.
std::vector<float> ref_gemm(const std::vector<float>& x, const std::vector<float>& w, int M, int N, int K) {
  std::vector<float> y(static_cast<size_t>(M) * N);
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double acc = 0;
      for (int k = 0; k < K; ++k)
        acc += static_cast<double>(x[static_cast<size_t>(m) * K + k]) * w[static_cast<size_t>(n) * K + k];
      y[static_cast<size_t>(m) * N + n] = static_cast<float>(acc);
    }
  return y;
}

// Small-M GEMM, weight tile bulk-copied into shared memory before the PDL wait (kGemmVariant 4), at the model's
// shapes (qkv 5120 x 2048, o 2048 x 4096, router 128 x 2048) and odd ones; M = 1, 8, 9 and 16 (one or two token
// tiles). Shapes with more tiles than resident CTAs fall back to the streaming kernel and must match as well.
TEST(CudaLatencyGemm, SharedMemoryTileMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(901);
  OptionScope opt(DecodeOption::kGemmVariant, 4);
  for (auto [M, N, K] : {std::tuple{1, 5120, 2048}, std::tuple{1, 2048, 4096}, std::tuple{16, 2048, 4096},
                         std::tuple{9, 128, 2048}, std::tuple{8, 48, 96}, std::tuple{3, 208, 1056},
                         std::tuple{16, 16, 32}, std::tuple{5, 16 * 1000, 64}}) {
    SCOPED_TRACE(testing::Message() << "M=" << M << " N=" << N << " K=" << K);
    auto x = random_bf16(static_cast<size_t>(M) * K, rng), w = random_bf16(static_cast<size_t>(N) * K, rng);
    auto dx = upload_bf16(x), dw = upload_bf16(w);
    DevBuf<bf16> dy(static_cast<size_t>(M) * N);
    dy.poison();
    ZEST_ASSERT_OK(gemm(dx->get(), dw->get(), dy.get(), M, N, K, nullptr));
    sync_ok();
    ZEST_EXPECT_CLOSE(download_bf16(dy), ref_gemm(x.f, w.f, M, N, K), kTol);
  }
}

// Router reference on given logits: softmax(logits + bias) in double, top-K (ties: lowest index), weights
// renormalised and rounded to bf16.
void ref_topk(const std::vector<float>& logits, const std::vector<float>* bias, int T, int E, int K,
              std::vector<int32_t>& ids, std::vector<float>& w) {
  ids.assign(static_cast<size_t>(T) * K, 0);
  w.assign(ids.size(), 0.f);
  for (int t = 0; t < T; ++t) {
    std::vector<double> p(E);
    double mx = -INFINITY;
    for (int e = 0; e < E; ++e) mx = std::max(mx, p[e] = logits[t * E + e] + (bias ? (*bias)[e] : 0.f));
    for (auto& v : p) v = std::exp(v - mx);
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    double top = 0;
    for (int k = 0; k < K; ++k) top += p[order[k]];
    for (int k = 0; k < K; ++k) {
      ids[t * K + k] = order[k];
      w[t * K + k] = round_bf16(static_cast<float>(p[order[k]] / top));
    }
  }
}

// Fused routing against the separate steps' definitions: logits within bf16 tolerance of a double GEMM; the ids and
// weights equal the router reference applied to the kernel's own logits (the top-k is exact arithmetic on them); the
// plan equals a plan built on the host from the returned ids. T = 1 and 16, odd T, E, K and H, with and without bias,
// with and without the plan.
TEST(CudaLatencyRoute, FusedRoutingMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(902);
  for (auto [T, E, K, H, use_bias] :
       {std::tuple{1, 128, 8, 2048, false}, std::tuple{16, 128, 8, 2048, true}, std::tuple{5, 40, 4, 96, true},
        std::tuple{16, 256, 16, 512, false}, std::tuple{3, 24, 3, 64, false}, std::tuple{9, 128, 8, 4096, false},
        std::tuple{2, 7, 2, 32, true}}) {
    SCOPED_TRACE(testing::Message() << "T=" << T << " E=" << E << " K=" << K << " H=" << H);
    ASSERT_TRUE(moe_route_ok(T, H, E, K));
    auto x = random_bf16(static_cast<size_t>(T) * H, rng, -2.f, 2.f);
    const float a = std::sqrt(3.f / H);
    auto w = random_bf16(static_cast<size_t>(E) * H, rng, -a, a);
    std::vector<float> bias(E);
    std::uniform_real_distribution<float> bd(-1.f, 0.f);
    for (auto& b : bias) b = bd(rng);
    auto dx = upload_bf16(x), dw = upload_bf16(w);
    DevBuf<float> dbias(bias), dwt(static_cast<size_t>(T) * K);
    DevBuf<int32_t> di(static_cast<size_t>(T) * K);
    DevBuf<bf16> dl(static_cast<size_t>(T) * E);
    DevBuf<unsigned char> buf(moe_plan_bytes(T, K, E));
    DevBuf<int64_t> count(std::vector<int64_t>{3});
    for (bool with_plan : {true, false}) {
      di.poison();
      dwt.poison();
      dl.poison();
      buf.poison();
      MoePlan plan;
      moe_plan_bind(plan, buf.get(), T, K, E);
      ZEST_ASSERT_OK(moe_route(dx->get(), dw->get(), use_bias ? dbias.get() : nullptr, di.get(), dwt.get(), dl.get(),
                               with_plan ? &plan : nullptr, with_plan ? count.get() : nullptr, T, H, E, K, nullptr));
      sync_ok();
      const auto logits = download_bf16(dl);
      ZEST_EXPECT_CLOSE(logits, ref_gemm(x.f, w.f, T, E, H), kTol);
      std::vector<int32_t> ref_ids;
      std::vector<float> ref_w;
      ref_topk(logits, use_bias ? &bias : nullptr, T, E, K, ref_ids, ref_w);
      const auto ids = di.download();
      ASSERT_EQ(ids, ref_ids);
      const auto gw = dwt.download();
      for (size_t i = 0; i < ref_w.size(); ++i) EXPECT_NEAR(gw[i], ref_w[i], 1e-2 * ref_w[i] + 1e-6) << "slot " << i;
      if (!with_plan) continue;
      // Host plan: active experts ascending, their slots in slot order, tiles of kMoeTileM.
      std::vector<std::vector<int>> per(E);
      for (int s = 0; s < T * K; ++s) per[ids[s]].push_back(s);
      std::vector<int> act, off{0}, sorted;
      int tiles = 0;
      for (int e = 0; e < E; ++e)
        if (!per[e].empty()) {
          act.push_back(e);
          sorted.insert(sorted.end(), per[e].begin(), per[e].end());
          off.push_back(static_cast<int>(sorted.size()));
          tiles += (static_cast<int>(per[e].size()) + kMoeTileM - 1) / kMoeTileM;
        }
      const int na = static_cast<int>(act.size());
      int got_na = 0, got_nt = 0;
      ASSERT_EQ(cudaMemcpy(&got_na, plan.num_active, 4, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(&got_nt, plan.num_tiles, 4, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(got_na, na);
      EXPECT_EQ(got_nt, tiles);
      std::vector<int> gact(na), goff(na + 1), gsorted(sorted.size()), gtile_active(tiles), gtile_start(tiles);
      ASSERT_EQ(cudaMemcpy(gact.data(), plan.active_experts, na * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(goff.data(), plan.offsets, (na + 1) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(gsorted.data(), plan.sorted_slots, sorted.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(gtile_active.data(), plan.tile_active, tiles * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(gtile_start.data(), plan.tile_start, tiles * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(gact, act);
      EXPECT_EQ(goff, off);
      EXPECT_EQ(gsorted, sorted);
      for (int j = 0, tile = 0; j < na; ++j)
        for (int s = off[j]; s < off[j + 1]; s += kMoeTileM, ++tile) {
          EXPECT_EQ(gtile_active[tile], j);
          EXPECT_EQ(gtile_start[tile], s);
        }
      EXPECT_EQ(count.download()[0], 3 + na);
      count.upload(std::vector<int64_t>{3});
    }
  }
  // Sizes outside the fused kernel's range are refused with an error, not launched.
  EXPECT_FALSE(moe_route_ok(17, 2048, 128, 8));
  EXPECT_FALSE(moe_route_ok(1, 2048, 17, 8));
  EXPECT_FALSE(moe_route_ok(1, 100, 128, 8));
  EXPECT_FALSE(moe_route(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, 17, 2048, 128, 8,
                         nullptr)
                   .is_ok());
}

// The synthetic decoder with the low-latency variants (fused routing, shared-memory GEMM tiles) captures and replays
// its graphs at batch 1 and 5, with and without SERE; expert counts stay within what top-8 (or SERE's S=2 union)
// allows and the tokens are valid.
TEST(CudaLatencyDecoder, LowLatencyVariantsRunInGraphs) {
  ZEST_REQUIRE_GPU();
  auto cfg = synthetic_config("qwen3-30b-a3b", 2);
  ASSERT_TRUE(cfg.ok());
  SyntheticOptions opt;
  opt.max_batch = 5;
  opt.context = 50;
  opt.sere_primary = 2;
  OptionScope route(DecodeOption::kRouteFused, 1);
  OptionScope gemm_v(DecodeOption::kGemmVariant, 4);
  auto dec = SyntheticDecoder::create(*cfg, opt);
  ASSERT_TRUE(dec.ok()) << dec.status().to_string();
  SyntheticDecoder& d = **dec;
  for (int batch : {1, 5})
    for (bool sere : {false, true}) {
      SCOPED_TRACE(testing::Message() << "batch " << batch << " sere " << sere);
      ZEST_ASSERT_OK(d.replay(batch, sere));
      ZEST_ASSERT_OK(d.reset_expert_counts());
      for (int i = 0; i < 3; ++i) ZEST_ASSERT_OK(d.replay(batch, sere));
      auto mean = d.mean_distinct_experts(3);
      ASSERT_TRUE(mean.ok());
      EXPECT_GE(*mean, sere ? 2.0 : 8.0);
      EXPECT_LE(*mean, sere ? 2.0 * batch : 8.0 * batch);
      auto toks = d.last_tokens(batch);
      ASSERT_TRUE(toks.ok());
      for (int t : *toks) EXPECT_TRUE(t >= 0 && t < cfg->vocab);
    }
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
