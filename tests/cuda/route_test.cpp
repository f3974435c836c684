// Fused decode routing (moe_route: the compact kernel, logits gathered into CTA 0 by st.async on an mbarrier, top-k
// with the probabilities in registers, the plan from per-expert token masks; the cluster kernel for a single-CTA
// split) against the separate router_topk + moe_plan launches on its own logits, bit for bit.
#ifdef ZEST_HAVE_CUDA
#include <cstring>
#include <tuple>

#include "cuda/cuda_test_util.h"
#include "cuda/route_case.h"

namespace zest::cuda {
// router.cu: moe_route with the compact kernel's phase clocks (CTA 0 thread 0's clock64 at 8 points).
Status moe_route_phase_clocks(const bf16* xn, const bf16* router_w, const float* bias, int32_t* ids, float* weights,
                              bf16* logits, MoePlan* plan, int64_t* active_count_sum, int T, int H, int E, int K,
                              long long* clocks, cudaStream_t stream);
}  // namespace zest::cuda

namespace zest::cuda::test {
namespace {

// Everything one routing launch writes, downloaded.
struct RouteOut {
  std::vector<uint16_t> logits;  // bf16 bits
  std::vector<int32_t> ids;
  std::vector<uint32_t> weights;  // fp32 bits
  int num_active = -1, num_tiles = -1;
  std::vector<int32_t> active, offsets, sorted, tile_active, tile_start;
  std::vector<uint32_t> ready;
  int64_t count = -1;
};

// The MoE plan of two launches, equal entry for entry (the ready words too when `with_ready`).
void expect_plan_equal(const RouteOut& got, const RouteOut& ref, bool with_ready = true) {
  EXPECT_EQ(got.num_active, ref.num_active);
  EXPECT_EQ(got.num_tiles, ref.num_tiles);
  EXPECT_EQ(got.active, ref.active);
  EXPECT_EQ(got.offsets, ref.offsets);
  EXPECT_EQ(got.sorted, ref.sorted);
  EXPECT_EQ(got.tile_active, ref.tile_active);
  EXPECT_EQ(got.tile_start, ref.tile_start);
  if (with_ready) {
    EXPECT_EQ(got.ready, ref.ready);
  }
}

std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

template <typename T>
std::vector<T> download_n(const T* p, size_t n) {
  std::vector<T> v(n);
  if (n) {
    EXPECT_EQ(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return v;
}

// The plan's contents (first num_active / num_tiles entries) and the E + 1 ready words.
void download_plan(const MoePlan& plan, int T, int K, int E, RouteOut& o) {
  o.num_active = download_n(plan.num_active, 1)[0];
  o.num_tiles = download_n(plan.num_tiles, 1)[0];
  ASSERT_GE(o.num_active, 1);
  ASSERT_LE(o.num_active, E);
  ASSERT_GE(o.num_tiles, 0);
  ASSERT_LE(o.num_tiles, moe_max_tiles(T, K, E));
  o.active = download_n(plan.active_experts, o.num_active);
  o.offsets = download_n(plan.offsets, o.num_active + 1);
  o.sorted = download_n(plan.sorted_slots, static_cast<size_t>(T) * K);
  o.tile_active = download_n(plan.tile_active, o.num_tiles);
  o.tile_start = download_n(plan.tile_start, o.num_tiles);
  o.ready = download_n(plan.ready, E + 1);
}

// The separate launches on a launch's own logits: router_topk's ids and weights (bit for bit) and, with a plan,
// moe_plan's plan on those ids (ready words: the launch's must come back zero).
void expect_separate_launches_equal(const RouteOut& got, const bf16* logits, const float* bias, int T, int E, int K,
                                    bool with_plan) {
  for (int32_t id : got.ids) ASSERT_TRUE(id >= 0 && id < E);
  DevBuf<int32_t> si(static_cast<size_t>(T) * K);
  DevBuf<float> sw(static_cast<size_t>(T) * K);
  ZEST_ASSERT_OK(router_topk(logits, bias, si.get(), sw.get(), T, E, K, nullptr));
  sync_ok();
  EXPECT_EQ(si.download(), got.ids);
  EXPECT_EQ(bits_of(sw.download()), got.weights);
  if (!with_plan) return;
  DevBuf<int32_t> ids_again(got.ids);
  DevBuf<unsigned char> buf2(moe_plan_bytes(T, K, E));
  buf2.poison();
  MoePlan plan2;
  moe_plan_bind(plan2, buf2.get(), T, K, E);
  ZEST_ASSERT_OK(moe_plan(ids_again.get(), T, K, E, plan2, nullptr, nullptr));
  sync_ok();
  RouteOut sep;
  download_plan(plan2, T, K, E, sep);
  expect_plan_equal(sep, got, false);  // ready words: checked on the launch's below
  EXPECT_EQ(got.ready, std::vector<uint32_t>(E + 1, 0u));
}

// moe_route against the separate launches on its own logits: ids, weights and the plan equal bit for bit, the
// active-expert count added; without a plan the same logits, ids and weights as with it. Poisoned outputs catch
// anything left unwritten. T = 1 (its own plan path), 2, 3, 5, 7, 8, 9 and 16; E = 128 (the model), 256 and 160 (8
// experts per lane), 96, 40, 24 and 7 (a single-CTA split: the cluster kernel); K from 1 to 16; H from 32 (one chunk:
// idle warps) to 4096 (rows that do not fit 32 per CTA: clusters of 16 rows per CTA); with and without bias.
TEST(CudaRoute, MatchesSeparateLaunchesBitForBit) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(911);
  for (auto [T, E, K, H, use_bias] :
       {std::tuple{1, 128, 8, 2048, false}, std::tuple{8, 128, 8, 2048, false}, std::tuple{16, 128, 8, 2048, true},
        std::tuple{9, 128, 8, 4096, false}, std::tuple{2, 128, 8, 2048, true}, std::tuple{16, 256, 16, 512, false},
        std::tuple{5, 160, 6, 256, true}, std::tuple{7, 96, 6, 160, false}, std::tuple{5, 40, 4, 96, true},
        std::tuple{3, 24, 3, 64, false}, std::tuple{2, 7, 2, 32, true}, std::tuple{16, 64, 1, 128, false},
        std::tuple{1, 256, 16, 512, true}, std::tuple{1, 40, 5, 64, false}, std::tuple{1, 7, 1, 32, false}}) {
    SCOPED_TRACE(testing::Message() << "T=" << T << " E=" << E << " K=" << K << " H=" << H << " bias=" << use_bias);
    ASSERT_TRUE(moe_route_ok(T, H, E, K));
    const auto rc = make_route_case(T, E, K, H, rng, 5);
    auto& dx = rc->dx;
    auto& dw = rc->dw;
    auto& dbias = rc->dbias;
    auto& dwt = rc->dwt;
    auto& di = rc->di;
    auto& dl = rc->dl;
    auto& buf = rc->buf;
    auto& count = rc->count;
    auto run = [&](bool with_plan) {
      di.poison();
      dwt.poison();
      dl.poison();
      buf.poison();
      count.upload(std::vector<int64_t>{5});
      MoePlan plan;
      moe_plan_bind(plan, buf.get(), T, K, E);
      RouteOut o;
      EXPECT_TRUE(moe_route(dx->get(), dw->get(), use_bias ? dbias.get() : nullptr, di.get(), dwt.get(), dl.get(),
                            with_plan ? &plan : nullptr, with_plan ? count.get() : nullptr, T, H, E, K, nullptr)
                      .is_ok());
      sync_ok();
      o.logits = download_n(reinterpret_cast<const uint16_t*>(dl.get()), dl.size());
      o.ids = di.download();
      o.weights = bits_of(dwt.download());
      if (with_plan) {
        download_plan(plan, T, K, E, o);
        o.count = count.download()[0];
      }
      return o;
    };
    RouteOut planned;
    for (bool with_plan : {true, false}) {
      SCOPED_TRACE(testing::Message() << "plan " << with_plan);
      const RouteOut got = run(with_plan);
      expect_separate_launches_equal(got, dl.get(), use_bias ? dbias.get() : nullptr, T, E, K, with_plan);
      if (with_plan) {
        EXPECT_EQ(got.count, 5 + got.num_active);
        planned = got;
      } else {
        EXPECT_EQ(got.logits, planned.logits);
        EXPECT_EQ(got.ids, planned.ids);
        EXPECT_EQ(got.weights, planned.weights);
      }
    }
  }
}

// Ties: router rows repeated (row e = row e % D, D = 5 or 3), so the probabilities come in D distinct values and
// every top-k holds equal ones (K > D): the choices must go to the lowest experts, with the same ids, weights and
// plan as the separate launches. T = 1, 2, 3 and 8; with a bias of the same period (ties kept) and without.
TEST(CudaRoute, TiesMatchSeparateLaunches) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(914);
  for (auto [E, K, D, H] : {std::tuple{128, 8, 5, 2048}, std::tuple{24, 6, 3, 64}})
    for (int T : {1, 2, 3, 8})
      for (bool use_bias : {false, true}) {
        SCOPED_TRACE(testing::Message() << "T=" << T << " E=" << E << " K=" << K << " bias=" << use_bias);
        auto x = random_bf16(static_cast<size_t>(T) * H, rng, -2.f, 2.f);
        const float a = std::sqrt(3.f / H);
        auto base = random_bf16(static_cast<size_t>(D) * H, rng, -a, a);
        std::vector<uint16_t> wbits(static_cast<size_t>(E) * H);
        for (int e = 0; e < E; ++e)
          std::copy_n(base.bits.begin() + static_cast<size_t>(e % D) * H, H,
                      wbits.begin() + static_cast<size_t>(e) * H);
        std::vector<float> bias(E);
        std::uniform_real_distribution<float> bd(-1.f, 0.f);
        for (int e = 0; e < D; ++e) bias[e] = bd(rng);
        for (int e = D; e < E; ++e) bias[e] = bias[e % D];
        auto dx = upload_bf16(x);
        DevBuf<bf16> dw(wbits.size()), dl(static_cast<size_t>(T) * E);
        ASSERT_EQ(cudaMemcpy(dw.get(), wbits.data(), wbits.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
        DevBuf<float> dbias(bias), dwt(static_cast<size_t>(T) * K);
        DevBuf<int32_t> di(static_cast<size_t>(T) * K);
        DevBuf<unsigned char> buf(moe_plan_bytes(T, K, E));
        di.poison();
        dwt.poison();
        dl.poison();
        buf.poison();
        MoePlan plan;
        moe_plan_bind(plan, buf.get(), T, K, E);
        ZEST_ASSERT_OK(moe_route(dx->get(), dw.get(), use_bias ? dbias.get() : nullptr, di.get(), dwt.get(), dl.get(),
                                 &plan, nullptr, T, H, E, K, nullptr));
        sync_ok();
        RouteOut got;
        got.ids = di.download();
        got.weights = bits_of(dwt.download());
        download_plan(plan, T, K, E, got);
        // Token 0's choices include equal weights (K > D distinct probabilities).
        std::vector<uint32_t> w0(got.weights.begin(), got.weights.begin() + K);
        std::sort(w0.begin(), w0.end());
        EXPECT_NE(std::adjacent_find(w0.begin(), w0.end()), w0.end());
        expect_separate_launches_equal(got, dl.get(), use_bias ? dbias.get() : nullptr, T, E, K, true);
      }
}

// Repeated launches into one plan buffer on one stream (each launch rebuilds the plan; the next one must not see the
// previous one's masks or counts): alternating inputs, each launch's ids and sorted slots equal those of a launch of
// the same input into a fresh (poisoned) plan buffer.
TEST(CudaRoute, BackToBackLaunchesMatchFreshOnes) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(912);
  const int T = 8, E = 128, K = 8, H = 2048;
  const float a = std::sqrt(3.f / H);
  auto w = random_bf16(static_cast<size_t>(E) * H, rng, -a, a);
  auto dw = upload_bf16(w);
  std::vector<std::unique_ptr<DevBuf<bf16>>> xs;
  for (int i = 0; i < 3; ++i) xs.push_back(upload_bf16(random_bf16(static_cast<size_t>(T) * H, rng, -2.f, 2.f)));
  DevBuf<float> dwt(static_cast<size_t>(T) * K);
  DevBuf<int32_t> di(static_cast<size_t>(T) * K);
  DevBuf<unsigned char> buf(moe_plan_bytes(T, K, E));
  MoePlan plan;
  moe_plan_bind(plan, buf.get(), T, K, E);
  auto launch_once = [&](int input) {
    EXPECT_TRUE(moe_route(xs[input]->get(), dw->get(), nullptr, di.get(), dwt.get(), nullptr, &plan, nullptr, T, H, E,
                          K, nullptr)
                    .is_ok());
    sync_ok();
    RouteOut o;
    download_plan(plan, T, K, E, o);
    return std::make_pair(di.download(), o.sorted);
  };
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> fresh;
  for (int i = 0; i < 3; ++i) {
    buf.poison();
    fresh.push_back(launch_once(i));
  }
  buf.poison();
  for (int rep = 0; rep < 6; ++rep) EXPECT_EQ(launch_once(rep % 3), fresh[rep % 3]) << "launch " << rep;
}

// Where one compact-kernel launch spends its time (printed, not asserted: eager launches, no previous kernel): CTA 0's
// clock64 deltas between the start, the wait on the previous grid, the end of its router GEMM, the cluster barrier,
// the last logit landing, the end of warp 0's top-k, the barrier before the plan and the end of the plan. The launch
// with clocks must give the same ids, weights and plan as without.
TEST(CudaRoute, CompactKernelPhaseClocks) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(913);
  const int E = 128, K = 8, H = 2048;
  const float a = std::sqrt(3.f / H);
  auto w = random_bf16(static_cast<size_t>(E) * H, rng, -a, a);
  auto dw = upload_bf16(w);
  for (int T : {1, 2, 8}) {
    SCOPED_TRACE(testing::Message() << "T=" << T);
    auto dx = upload_bf16(random_bf16(static_cast<size_t>(T) * H, rng, -2.f, 2.f));
    DevBuf<float> dwt(static_cast<size_t>(T) * K);
    DevBuf<int32_t> di(static_cast<size_t>(T) * K);
    DevBuf<unsigned char> buf(moe_plan_bytes(T, K, E));
    DevBuf<long long> clocks(8);
    MoePlan plan;
    moe_plan_bind(plan, buf.get(), T, K, E);
    ZEST_ASSERT_OK(moe_route(dx->get(), dw->get(), nullptr, di.get(), dwt.get(), nullptr, &plan, nullptr, T, H, E, K,
                             nullptr));
    sync_ok();
    const auto ids = di.download();
    const auto wts = bits_of(dwt.download());
    RouteOut ref;
    download_plan(plan, T, K, E, ref);
    std::vector<long long> c;
    for (int rep = 0; rep < 5; ++rep) {  // the last of five launches (warm instruction cache and L2)
      di.poison();
      dwt.poison();
      buf.poison();
      clocks.poison();
      ZEST_ASSERT_OK(moe_route_phase_clocks(dx->get(), dw->get(), nullptr, di.get(), dwt.get(), nullptr, &plan,
                                            nullptr, T, H, E, K, clocks.get(), nullptr));
      sync_ok();
      c = clocks.download();
    }
    EXPECT_EQ(di.download(), ids);
    EXPECT_EQ(bits_of(dwt.download()), wts);
    RouteOut got;
    download_plan(plan, T, K, E, got);
    EXPECT_EQ(got.sorted, ref.sorted);
    EXPECT_EQ(got.active, ref.active);
    std::printf("[route phases T=%d] cycles: wait %lld | gemm %lld | cluster barrier %lld | logits landed %lld | "
                "top-k %lld | plan barrier %lld | plan %lld | after wait %lld\n",
                T, c[1] - c[0], c[2] - c[1], c[3] - c[2], c[4] - c[3], c[5] - c[4], c[6] - c[5], c[7] - c[6],
                c[7] - c[1]);
  }
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
