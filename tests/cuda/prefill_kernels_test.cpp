// CUDA prefill kernels against plain f64 loops on fresh random inputs: the FlashAttention-style prefill
// attention (causal, GQA, packed variable-length sequences) and the grouped GEMMs of the MoE experts (gate/up
// with SiLU*up, down with the routing weights) over experts with 0, 1, 17 and 300 slots.
#ifdef ZEST_HAVE_CUDA
#include <numeric>

#include "cuda/cuda_test_util.h"
#include "cuda/prefill_attention_check.h"

namespace zest::cuda::test {
namespace {

// bf16 outputs: max abs err <= 2e-2 * max |ref| (P and h are rounded to bf16 before their second matmul).
constexpr double kTol = 2e-2;

// Causal attention of packed sequences through prefill_attention against an f64 reference
// (prefill_attention_check.h).
void run_prefill_case(const std::vector<int>& lens, int Hq, int Hkv, int row_pad, std::mt19937& rng) {
  check_prefill_attention(lens, Hq, Hkv, row_pad, kTol, rng);
}

TEST(CudaPrefillKernels, AttentionOddLengthsPackedGqa4) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(501);
  // Lengths around the 64-key and 128-query tiles, a single token and a long sequence, packed together.
  run_prefill_case({1, 17, 63, 65, 1000}, 4, 1, 0, rng);
}

TEST(CudaPrefillKernels, AttentionGqa1AndGqa8PaddedRows) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(502);
  run_prefill_case({129, 256, 7}, 3, 3, 8, rng);  // no grouping, row stride padded by 8 elements
  run_prefill_case({300, 128}, 16, 2, 0, rng);    // 8 query heads per kv head
}

// Sizes that take the pipelined kernel (max_seqlen <= 256, or nseq * 128 > max_seqlen: many short sequences).
TEST(CudaPrefillKernels, AttentionPipelinedKernelMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(505);
  run_prefill_case({1, 17, 63, 65, 300}, 4, 2, 0, rng);
  run_prefill_case({129, 256, 7}, 3, 3, 8, rng);
  // 6 key tiles of 128 (the triple buffer wraps), packed with enough short sequences to stay off the persistent kernel.
  run_prefill_case({700, 1, 2, 3, 4, 5}, 2, 1, 0, rng);
}

TEST(CudaPrefillKernels, AttentionRejectsBadShapes) {
  ZEST_REQUIRE_GPU();
  DevBuf<bf16> buf(4096);
  DevBuf<int32_t> cu(std::vector<int32_t>{0, 4});
  const bf16* p = buf.get();
  // Hq not a multiple of Hkv.
  EXPECT_EQ(prefill_attention(p, 1024, p, p, 1024, cu.get(), 1, 4, buf.get(), 6, 4, 128, 0.1f, nullptr).code(),
            ErrorCode::kInvalidArgument);
  // Row stride not a multiple of 8 elements.
  EXPECT_EQ(prefill_attention(p, 1020, p, p, 1020, cu.get(), 1, 4, buf.get(), 4, 2, 128, 0.1f, nullptr).code(),
            ErrorCode::kInvalidArgument);
  // No sequences.
  EXPECT_EQ(prefill_attention(p, 1024, p, p, 1024, cu.get(), 0, 4, buf.get(), 4, 2, 128, 0.1f, nullptr).code(),
            ErrorCode::kInvalidArgument);
}

// ---- grouped MoE GEMMs ---------------------------------------------------------------------------------------

// Routing of N tokens, K = 2, over E >= 8 experts with the given slot counts: expert 0 gets c0 slots, expert 1
// c1, expert 2 c2, expert 3 none; the rest of slot 0 goes to expert 5, slot 1 to experts 4 and 6. Tokens are
// shuffled so an expert's rows are scattered; token `empty` has an empty second slot.
void make_routing(int N, int c0, int c1, int c2, std::mt19937& rng, std::vector<int32_t>& ids, std::vector<float>& w,
                  int empty) {
  const int K = 2;
  std::vector<int> perm(N);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  ids.assign(static_cast<size_t>(N) * K, -1);
  w.assign(ids.size(), 0.f);
  std::uniform_real_distribution<float> d(0.05f, 1.f);
  for (int i = 0; i < N; ++i) {
    const int n = perm[i];
    ids[n * K] = i < c0 ? 0 : i < c0 + c1 ? 1 : i < c0 + c1 + c2 ? 2 : 5;
    ids[n * K + 1] = i < N / 2 ? 4 : 6;
    float a = d(rng), b = d(rng);
    if (a < b) std::swap(a, b);
    w[n * K] = round_bf16(a / (a + b));
    w[n * K + 1] = round_bf16(b / (a + b));
  }
  ids[empty * K + 1] = -1;
  w[empty * K + 1] = 0.f;
}

// moe_plan_prefill against a host reference: active experts ascending, offsets, slots sorted by expert then
// slot, tiles of kMoeTileM per active expert; and against moe_plan (the same bytes).
void run_plan_case(int N, int K, int E, int expert_limit, std::mt19937& rng) {
  SCOPED_TRACE(testing::Message() << "N=" << N << " K=" << K << " E=" << E << " experts used " << expert_limit);
  std::vector<int32_t> ids(static_cast<size_t>(N) * K);
  std::uniform_int_distribution<int> pick(0, expert_limit - 1);
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) {
      int e;
      do {
        e = pick(rng);
      } while (std::find(&ids[static_cast<size_t>(n) * K], &ids[static_cast<size_t>(n) * K + k], e) !=
               &ids[static_cast<size_t>(n) * K + k]);
      ids[static_cast<size_t>(n) * K + k] = e;
    }
  for (size_t i = 3; i < ids.size(); i += 97) ids[i] = -1;  // empty slots
  std::vector<int> ref_active, ref_off = {0}, ref_sorted, ref_tile_active, ref_tile_start;
  for (int e = 0; e < E; ++e) {
    std::vector<int> slots;
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] == e) slots.push_back(static_cast<int>(i));
    if (slots.empty()) continue;
    const int j = static_cast<int>(ref_active.size());
    ref_active.push_back(e);
    for (int r = 0; r < static_cast<int>(slots.size()); r += kMoeTileM) {
      ref_tile_active.push_back(j);
      ref_tile_start.push_back(ref_off.back() + r);
    }
    ref_sorted.insert(ref_sorted.end(), slots.begin(), slots.end());
    ref_off.push_back(ref_off.back() + static_cast<int>(slots.size()));
  }
  DevBuf<int32_t> di(ids);
  for (int which = 0; which < 2; ++which) {
    SCOPED_TRACE(which == 0 ? "moe_plan_prefill" : "moe_plan");
    DevBuf<unsigned char> buf(moe_plan_bytes(N, K, E));
    buf.poison();
    MoePlan plan;
    moe_plan_bind(plan, buf.get(), N, K, E);
    DevBuf<int64_t> count(std::vector<int64_t>{7});
    if (which == 0)
      ZEST_ASSERT_OK(moe_plan_prefill(di.get(), N, K, E, plan, count.get(), nullptr));
    else
      ZEST_ASSERT_OK(moe_plan(di.get(), N, K, E, plan, count.get(), nullptr));
    sync_ok();
    int na = 0, nt = 0;
    ASSERT_EQ(cudaMemcpy(&na, plan.num_active, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(&nt, plan.num_tiles, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(na, static_cast<int>(ref_active.size()));
    ASSERT_EQ(nt, static_cast<int>(ref_tile_active.size()));
    std::vector<int> act(na), off(na + 1), sorted(ref_sorted.size()), ta(nt), ts(nt);
    ASSERT_EQ(cudaMemcpy(act.data(), plan.active_experts, na * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(off.data(), plan.offsets, (na + 1) * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(sorted.data(), plan.sorted_slots, sorted.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(ta.data(), plan.tile_active, nt * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(ts.data(), plan.tile_start, nt * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(act, ref_active);
    EXPECT_EQ(off, ref_off);
    EXPECT_EQ(sorted, ref_sorted);
    EXPECT_EQ(ta, ref_tile_active);
    EXPECT_EQ(ts, ref_tile_start);
    EXPECT_EQ(count.download()[0], 7 + na);
  }
}

TEST(CudaPrefillKernels, PlanForManyTokensMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(521);
  run_plan_case(3000, 8, 128, 128, rng);  // Qwen3-30B-A3B routing shape, uneven 32-slot groups
  run_plan_case(8192, 8, 128, 128, rng);  // the 8k prefill: 8 groups of 32 slots per load round, 8 rounds per warp
  run_plan_case(1, 8, 128, 128, rng);     // a single token
  run_plan_case(777, 4, 256, 40, rng);    // 216 experts without slots, E at the shared-memory limit
  run_plan_case(50, 2, 8, 8, rng);        // fewer slots than warps
}

struct GroupedCase {
  int N, E, H, I, c0, c1, c2;
};

void run_grouped_case(const GroupedCase& c, bool wmma, std::mt19937& rng) {
  SCOPED_TRACE(testing::Message() << "N=" << c.N << " E=" << c.E << " H=" << c.H << " I=" << c.I << " counts " << c.c0
                                  << "," << c.c1 << "," << c.c2 << (wmma ? " wmma" : ""));
  const int K = 2;
  std::vector<int32_t> ids;
  std::vector<float> w;
  make_routing(c.N, c.c0, c.c1, c.c2, rng, ids, w, c.N / 3);
  auto x = random_bf16(static_cast<size_t>(c.N) * c.H, rng);
  const float ag = std::sqrt(3.f / c.H), ad = std::sqrt(3.f / c.I);
  auto gu = random_bf16(static_cast<size_t>(c.E) * 2 * c.I * c.H, rng, -ag, ag);
  auto dn = random_bf16(static_cast<size_t>(c.E) * c.H * c.I, rng, -ad, ad);
  auto dx = upload_bf16(x), dgu = upload_bf16(gu), ddn = upload_bf16(dn);
  DevBuf<int32_t> di(ids);
  DevBuf<float> dw(w), out(static_cast<size_t>(c.N) * K * c.H);
  DevBuf<bf16> h(static_cast<size_t>(c.N) * K * c.I);
  DevBuf<unsigned char> buf(moe_plan_bytes(c.N, K, c.E));
  out.poison();
  h.poison();
  MoePlan plan;
  moe_plan_bind(plan, buf.get(), c.N, K, c.E);
  ZEST_ASSERT_OK(moe_plan(di.get(), c.N, K, c.E, plan, nullptr, nullptr));
  if (wmma)
    ZEST_ASSERT_OK(moe_experts_prefill_wmma(dx->get(), plan, dw.get(), dgu->get(), ddn->get(), h.get(), out.get(), c.N,
                                            K, c.E, c.H, c.I, nullptr));
  else
    ZEST_ASSERT_OK(moe_experts_prefill(dx->get(), plan, dw.get(), dgu->get(), ddn->get(), h.get(), out.get(), c.N, K,
                                       c.E, c.H, c.I, nullptr));
  sync_ok();
  const auto got_all = out.download();
  std::vector<float> got, ref, hv(c.I);
  for (int n = 0; n < c.N; ++n)
    for (int k = 0; k < K; ++k) {
      const int e = ids[n * K + k];
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
        ref.push_back(round_bf16(static_cast<float>(y)) * w[n * K + k]);
        got.push_back(got_all[(static_cast<size_t>(n) * K + k) * c.H + r]);
      }
    }
  ZEST_EXPECT_CLOSE(got, ref, kTol);
  // The empty slot is not written.
  EXPECT_TRUE(std::isnan(got_all[(static_cast<size_t>(c.N / 3) * K + 1) * c.H]));
}

TEST(CudaPrefillKernels, GroupedExpertsWith0_1_17_300Rows) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(511);
  // Expert 0: 300 slots (three 128-row CTAs, the last partial), 1: 17, 2: 1, 3 and 7: none.
  run_grouped_case({320, 8, 256, 128, 300, 17, 1}, false, rng);
}

TEST(CudaPrefillKernels, GroupedExpertsModelWidths) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(512);
  // Qwen3-30B-A3B widths (H 2048, I 768): 17, 1 and 0 slots, then a 130-slot expert.
  run_grouped_case({40, 8, 2048, 768, 17, 1, 0}, false, rng);
  run_grouped_case({150, 10, 2048, 768, 130, 3, 1}, false, rng);
}

// Sizes the warp-specialised kernels do not take run the wgmma kernel (128 x 128 tiles).
TEST(CudaPrefillKernels, GroupedGemmWgmmaFallbackMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(515);
  run_grouped_case({60, 8, 384, 192, 40, 1, 1}, false, rng);      // widths off the 256-row tiles
  run_grouped_case({320, 260, 256, 128, 300, 17, 1}, false, rng);  // more than 256 experts
}

TEST(CudaPrefillKernels, PreviousWmmaGroupedExpertsMatchReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(513);
  run_grouped_case({200, 8, 256, 128, 150, 17, 1}, true, rng);
}

TEST(CudaPrefillKernels, GroupedGemmsRejectWidthsOffTheirTiles) {
  ZEST_REQUIRE_GPU();
  const int N = 4, K = 2, E = 8;
  DevBuf<unsigned char> buf(moe_plan_bytes(N, K, E));
  MoePlan plan;
  moe_plan_bind(plan, buf.get(), N, K, E);
  DevBuf<bf16> p(1024);
  DevBuf<float> f(1024);
  EXPECT_EQ(moe_prefill_gate_up(p.get(), plan, p.get(), p.get(), N, K, E, 192, 64, nullptr).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(moe_prefill_down(p.get(), plan, f.get(), p.get(), f.get(), N, K, E, 256, 96, nullptr).code(),
            ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
