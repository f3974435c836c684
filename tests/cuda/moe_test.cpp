// CUDA MoE kernels (router top-k, SERE re-routing, device plan, decode and prefill experts) against plain
// loops.
#ifdef ZEST_HAVE_CUDA
#include <numeric>
#include <set>
#include <tuple>

#include "cuda/cuda_test_util.h"
#include "cuda/route_case.h"

namespace zest::cuda::test {
namespace {

constexpr double kTol = 2e-2;  // bf16 outputs: max abs err <= 2e-2 * max |ref|

TEST(CudaRouter, SoftmaxTopkRenormMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(31);
  for (auto [N, E, K, use_bias] : {std::tuple{7, 128, 8, false}, {1, 128, 8, true}, {13, 60, 4, true}}) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " E=" << E << " K=" << K);
    auto logits = random_bf16(static_cast<size_t>(N) * E, rng, -3.f, 3.f);
    std::vector<float> bias(E);
    std::uniform_real_distribution<float> bd(-2.f, 0.f);
    for (auto& b : bias) b = bd(rng);
    auto dl = upload_bf16(logits);
    DevBuf<float> dbias(bias), dw(static_cast<size_t>(N) * K);
    DevBuf<int32_t> di(static_cast<size_t>(N) * K);
    di.poison();
    ZEST_ASSERT_OK(router_topk(dl->get(), use_bias ? dbias.get() : nullptr, di.get(), dw.get(), N, E, K, nullptr));
    sync_ok();
    std::vector<int32_t> ids;
    std::vector<float> w;
    ref_router_topk(logits.f, use_bias ? &bias : nullptr, N, E, K, ids, w);
    EXPECT_EQ(di.download(), ids);
    const auto gw = dw.download();
    for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(gw[i], w[i], 1e-2 * w[i] + 1e-6) << "slot " << i;
  }
}

// SERE reference, written from the algorithm's statement.
void ref_sere(std::vector<int32_t>& ids, std::vector<float>& w, const std::vector<float>& sim, int N, int E, int K,
              int S, float rho) {
  if (S <= 0 || S >= K) return;
  std::set<int> P;
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < S; ++k)
      if (ids[n * K + k] >= 0 && ids[n * K + k] < E) P.insert(ids[n * K + k]);
  std::vector<int> map(E);
  for (int u = 0; u < E; ++u) {
    map[u] = u;
    if (P.count(u) || P.empty()) continue;
    int best = -1;
    for (int v : P)  // ascending order: ties keep the lowest index
      if (best < 0 || sim[u * E + v] > sim[u * E + best]) best = v;
    if (!(rho > 0.f && sim[u * E + best] < rho)) map[u] = best;
  }
  for (int n = 0; n < N; ++n) {
    for (int k = S; k < K; ++k) {
      int& id = ids[n * K + k];
      if (id >= 0 && id < E) id = map[id];
    }
    for (int k = 1; k < K; ++k) {
      if (ids[n * K + k] < 0) continue;
      for (int j = 0; j < k; ++j)
        if (ids[n * K + j] == ids[n * K + k]) {
          w[n * K + j] += w[n * K + k];
          w[n * K + k] = 0.f;
          ids[n * K + k] = -1;
          break;
        }
    }
  }
}

// Random routing: K distinct experts per token, weights sorted descending and summing to 1.
void random_routing(int N, int E, int K, std::mt19937& rng, std::vector<int32_t>& ids, std::vector<float>& w,
                    int expert_limit = 0) {
  ids.resize(static_cast<size_t>(N) * K);
  w.resize(ids.size());
  std::uniform_real_distribution<float> d(0.05f, 1.f);
  const int pool = expert_limit > 0 ? expert_limit : E;
  for (int n = 0; n < N; ++n) {
    std::vector<int> all(pool);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    std::vector<float> ws(K);
    float s = 0;
    for (auto& v : ws) s += (v = d(rng));
    std::sort(ws.begin(), ws.end(), std::greater<float>());
    for (int k = 0; k < K; ++k) {
      ids[n * K + k] = all[k];
      w[n * K + k] = ws[k] / s;
    }
  }
}

// sere_reroute (at E = 64: the per-CTA map kernel) against the host reference, exactly.
TEST(CudaSere, RerouteMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(32);
  const int N = 33, E = 64, K = 8;
  // Similarity quantised to tenths so that ties occur (lowest index must win).
  std::vector<float> sim(E * E);
  std::uniform_int_distribution<int> q(0, 9);
  for (int u = 0; u < E; ++u) {
    sim[u * E + u] = 1.f;
    for (int v = u + 1; v < E; ++v) sim[u * E + v] = sim[v * E + u] = q(rng) / 10.f;
  }
  DevBuf<float> dsim(sim);
  for (auto [S, rho] : {std::pair{2, 0.f}, {2, 0.75f}, {1, 0.f}, {0, 0.f}, {8, 0.f}}) {
    SCOPED_TRACE(testing::Message() << "S=" << S << " rho=" << rho);
    std::vector<int32_t> ids;
    std::vector<float> w;
    random_routing(N, E, K, rng, ids, w);
    // A padding token (all -1) must not enter the primary set.
    for (int k = 0; k < K; ++k) {
      ids[5 * K + k] = -1;
      w[5 * K + k] = 0.f;
    }
    DevBuf<int32_t> di(ids);
    DevBuf<float> dw(w);
    ZEST_ASSERT_OK(sere_reroute(di.get(), dw.get(), dsim.get(), N, E, K, S, rho, nullptr));
    sync_ok();
    auto rids = ids;
    auto rw = w;
    ref_sere(rids, rw, sim, N, E, K, S, rho);
    EXPECT_EQ(di.download(), rids);
    EXPECT_EQ(dw.download(), rw);
    if (S == 2 && rho == 0.f) {
      // Pure re-routing: every used expert is primary, and the gate mass of each token is unchanged.
      std::set<int> P, used;
      for (int n = 0; n < N; ++n)
        for (int k = 0; k < K; ++k) {
          if (k < S && ids[n * K + k] >= 0) P.insert(ids[n * K + k]);
          if (rids[n * K + k] >= 0) used.insert(rids[n * K + k]);
        }
      EXPECT_EQ(used, P);
    }
  }
}

// Both kernels' paths (the per-CTA map kernel for E <= 128, the single-CTA kernel above): float4 rows (E % 4 == 0) or
// scalar ones, rows and columns past the first 128, tokens past a CTA's threads, K above 8. Exact comparison (ids
// equal, weights bit-identical).
TEST(CudaSere, RerouteMatchesReferenceAcrossShapes) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(34);
  struct Shape {
    int N, E, K, S;
    float rho;
  };
  for (const Shape sh : {Shape{256, 128, 8, 2, 0.f}, Shape{256, 128, 8, 2, 0.75f}, Shape{1500, 130, 12, 3, 0.f},
                         Shape{7, 257, 4, 1, 0.6f}, Shape{40, 1024, 16, 2, 0.f}, Shape{2100, 64, 6, 1, 0.f},
                         Shape{1, 128, 8, 2, 0.f}, Shape{300, 127, 16, 3, 0.5f}, Shape{513, 37, 5, 2, 0.f}}) {
    const int N = sh.N, E = sh.E, K = sh.K, S = sh.S;
    SCOPED_TRACE(testing::Message() << "N=" << N << " E=" << E << " K=" << K << " S=" << S << " rho=" << sh.rho);
    std::vector<float> sim(static_cast<size_t>(E) * E);
    std::uniform_int_distribution<int> q(0, 9);  // tenths, so that ties occur
    for (int u = 0; u < E; ++u) {
      sim[static_cast<size_t>(u) * E + u] = 1.f;
      for (int v = u + 1; v < E; ++v)
        sim[static_cast<size_t>(u) * E + v] = sim[static_cast<size_t>(v) * E + u] = q(rng) / 10.f;
    }
    std::vector<int32_t> ids;
    std::vector<float> w;
    random_routing(N, E, K, rng, ids, w);
    for (int k = 0; k < K; ++k) {
      ids[(N / 2) * K + k] = -1;
      w[(N / 2) * K + k] = 0.f;
    }
    DevBuf<float> dsim(sim);
    DevBuf<int32_t> di(ids);
    DevBuf<float> dw(w);
    ZEST_ASSERT_OK(sere_reroute(di.get(), dw.get(), dsim.get(), N, E, K, S, sh.rho, nullptr));
    sync_ok();
    ref_sere(ids, w, sim, N, E, K, S, sh.rho);
    EXPECT_EQ(di.download(), ids);
    EXPECT_EQ(dw.download(), w);
  }
}

struct HostPlan {
  std::vector<int> active, offsets, sorted;
};
HostPlan ref_plan(const std::vector<int32_t>& ids, int E) {
  HostPlan p;
  for (int e = 0; e < E; ++e) {
    const size_t before = p.sorted.size();
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == e) p.sorted.push_back(static_cast<int>(i));
    if (p.sorted.size() > before) {
      p.active.push_back(e);
      p.offsets.push_back(static_cast<int>(before));
    }
  }
  p.offsets.push_back(static_cast<int>(p.sorted.size()));
  return p;
}

TEST(CudaMoePlan, ListsTokensPerActiveExpert) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(33);
  // The kernel's paths: a slot per thread (160 slots), slots staged in shared memory (2400 slots; 600 slots with
  // 300 experts), slots read from global memory (4400, over the 4096 staged).
  for (auto [N, K, E] : {std::tuple{40, 4, 32}, std::tuple{300, 8, 64}, std::tuple{150, 4, 300},
                         std::tuple{1100, 4, 64}}) {
  SCOPED_TRACE(testing::Message() << "N=" << N << " K=" << K << " E=" << E);
  std::vector<int32_t> ids;
  std::vector<float> w;
  random_routing(N, E, K, rng, ids, w, E - 12);  // the last 12 experts get no tokens
  ids[7] = -1;
  ids[100] = -1;
  DevBuf<int32_t> di(ids);
  DevBuf<unsigned char> buf(moe_plan_bytes(N, K, E));
  buf.poison();
  MoePlan plan;
  moe_plan_bind(plan, buf.get(), N, K, E);
  DevBuf<int64_t> count(std::vector<int64_t>{5});
  ZEST_ASSERT_OK(moe_plan(di.get(), N, K, E, plan, count.get(), nullptr));
  sync_ok();
  const HostPlan ref = ref_plan(ids, E);
  const int na = static_cast<int>(ref.active.size());
  int got_na = 0, got_nt = 0;
  ASSERT_EQ(cudaMemcpy(&got_na, plan.num_active, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&got_nt, plan.num_tiles, 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(got_na, na);
  std::vector<int> act(na), off(na + 1), sorted(ref.sorted.size());
  ASSERT_EQ(cudaMemcpy(act.data(), plan.active_experts, na * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(off.data(), plan.offsets, (na + 1) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(sorted.data(), plan.sorted_slots, sorted.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(act, ref.active);
  EXPECT_EQ(off, ref.offsets);
  EXPECT_EQ(sorted, ref.sorted);
  int tiles = 0;
  for (int j = 0; j < na; ++j) tiles += (ref.offsets[j + 1] - ref.offsets[j] + kMoeTileM - 1) / kMoeTileM;
  EXPECT_EQ(got_nt, tiles);
  EXPECT_EQ(count.download()[0], 5 + na);
  }
}

struct MoeCase {
  int N, K, E, H, I, expert_limit;
};

// Runs the plan + experts (decode or prefill path) and compares every written slot with the reference.
void run_moe_case(const MoeCase& c, bool prefill, std::mt19937& rng) {
  SCOPED_TRACE(testing::Message() << (prefill ? "prefill" : "decode") << " N=" << c.N << " K=" << c.K << " E=" << c.E
                                  << " H=" << c.H << " I=" << c.I);
  std::vector<int32_t> ids;
  std::vector<float> w;
  random_routing(c.N, c.E, c.K, rng, ids, w, c.expert_limit);
  ids[c.K - 1] = -1;  // an empty slot
  w[c.K - 1] = 0.f;
  for (auto& v : w) v = round_bf16(v);
  auto x = random_bf16(static_cast<size_t>(c.N) * c.H, rng);
  const float ag = std::sqrt(3.f / c.H), ad = std::sqrt(3.f / c.I);
  auto gu = random_bf16(static_cast<size_t>(c.E) * 2 * c.I * c.H, rng, -ag, ag);
  auto dn = random_bf16(static_cast<size_t>(c.E) * c.H * c.I, rng, -ad, ad);
  auto dx = upload_bf16(x), dgu = upload_bf16(gu), ddn = upload_bf16(dn);
  DevBuf<int32_t> di(ids);
  DevBuf<float> dw(w), out(static_cast<size_t>(c.N) * c.K * c.H);
  DevBuf<bf16> h(static_cast<size_t>(c.N) * c.K * c.I);
  DevBuf<unsigned char> buf(moe_plan_bytes(c.N, c.K, c.E));
  out.poison();
  MoePlan plan;
  moe_plan_bind(plan, buf.get(), c.N, c.K, c.E);
  ZEST_ASSERT_OK(moe_plan(di.get(), c.N, c.K, c.E, plan, nullptr, nullptr));
  if (prefill)
    ZEST_ASSERT_OK(moe_experts_prefill(dx->get(), plan, dw.get(), dgu->get(), ddn->get(), h.get(), out.get(), c.N, c.K,
                                       c.E, c.H, c.I, nullptr));
  else
    ZEST_ASSERT_OK(moe_experts_decode(dx->get(), plan, dw.get(), dgu->get(), ddn->get(), h.get(), out.get(), c.N, c.K,
                                      c.E, c.H, c.I, nullptr));
  sync_ok();
  const auto got_all = out.download();
  std::vector<float> got, ref;
  std::vector<float> hv(c.I);
  for (int n = 0; n < c.N; ++n)
    for (int k = 0; k < c.K; ++k) {
      const int e = ids[n * c.K + k];
      if (e < 0) continue;
      for (int i = 0; i < c.I; ++i) {
        double g = 0, u = 0;
        const float* wg = &gu.f[(static_cast<size_t>(e) * 2 * c.I + i) * c.H];
        const float* wu = wg + static_cast<size_t>(c.I) * c.H;
        for (int j = 0; j < c.H; ++j) {
          g += static_cast<double>(x.f[static_cast<size_t>(n) * c.H + j]) * wg[j];
          u += static_cast<double>(x.f[static_cast<size_t>(n) * c.H + j]) * wu[j];
        }
        const float gb = round_bf16(static_cast<float>(g)), ub = round_bf16(static_cast<float>(u));
        hv[i] = round_bf16(round_bf16(gb / (1.f + std::exp(-gb))) * ub);
      }
      for (int r = 0; r < c.H; ++r) {
        double y = 0;
        const float* wd = &dn.f[(static_cast<size_t>(e) * c.H + r) * c.I];
        for (int i = 0; i < c.I; ++i) y += static_cast<double>(hv[i]) * wd[i];
        ref.push_back(round_bf16(static_cast<float>(y)) * w[n * c.K + k]);
        got.push_back(got_all[(static_cast<size_t>(n) * c.K + k) * c.H + r]);
      }
    }
  ZEST_EXPECT_CLOSE(got, ref, kTol);
}

TEST(CudaMoeExperts, DecodeBatchOne) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(34);
  run_moe_case({1, 8, 128, 256, 64, 0}, false, rng);
}

TEST(CudaMoeExperts, DecodeTensorCoreModelShapesAndLongTokenLists) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(37);
  run_moe_case({2, 8, 16, 2048, 768, 0}, false, rng);
  // 37 tokens over 6 of 16 experts: more than one 16-token pass per expert, 10 experts without tokens.
  run_moe_case({37, 4, 16, 256, 96, 6}, false, rng);
}

TEST(CudaMoeExperts, DecodeModelLikeWidthsLongTokenLists) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(38);
  // Widths like the models' (multiples of 256): one token; then 37 tokens over 6 of 16 experts (two 16-token
  // passes per expert, a pass of 9-16 tokens uses the second n-tile, idle experts skipped).
  run_moe_case({1, 8, 32, 512, 256, 0}, false, rng);
  run_moe_case({37, 4, 16, 512, 768, 6}, false, rng);
}

TEST(CudaMoeExperts, DecodeOddSizesIdleExpertsAndLongTokenLists) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(35);
  run_moe_case({5, 4, 16, 72, 40, 0}, false, rng);
  // 37 tokens over 6 of 16 experts: lists longer than one pass of 8 tokens, 10 experts without tokens.
  run_moe_case({37, 4, 16, 264, 56, 6}, false, rng);
}

TEST(CudaMoeExperts, PrefillGroupedGemmMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(36);
  run_moe_case({150, 4, 8, 128, 64, 6}, true, rng);
  run_moe_case({3, 2, 8, 192, 128, 0}, true, rng);
}

TEST(CudaMoeExperts, PrefillWidthsNotMultipleOf64UseGenericPath) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(37);
  run_moe_case({40, 4, 16, 16, 24, 0}, true, rng);
  run_moe_case({21, 2, 8, 72, 40, 3}, true, rng);
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
