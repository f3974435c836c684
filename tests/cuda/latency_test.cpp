// Low-latency decode kernels (batch 1-16) against plain loops: the small-M GEMM with its weight tile in shared memory,
// the fused routing kernel (router GEMM + top-k + MoE plan in one cluster launch).
#ifdef ZEST_HAVE_CUDA
#include <numeric>
#include <tuple>

#include "cuda/cuda_test_util.h"
#include "cuda/fused_decode_case.h"
#include "cuda/paged_kv_case.h"
#include "cuda/route_case.h"

namespace zest::cuda::test {
namespace {

constexpr double kTol = 2e-2;  // bf16 outputs: max abs err <= 2e-2 * max |ref|

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

// y = x W^T through gemm() in column slices of 2 row tiles per SM, fewer than rows_ring takes: each slice runs the
// shared-memory tile kernel or the register-streamed one, whose chunk and reduction order rows_ring keeps.
std::vector<float> gemm_in_slices(const bf16* x, const bf16* w, int M, int N, int K) {
  int sms = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int slice = 16 * 2 * std::max(1, sms);
  std::vector<float> y(static_cast<size_t>(M) * N);
  DevBuf<bf16> part(static_cast<size_t>(M) * slice);
  for (int n0 = 0; n0 < N; n0 += slice) {
    const int ns = std::min(slice, N - n0);
    const Status st = gemm(x, w + static_cast<size_t>(n0) * K, part.get(), M, ns, K, nullptr);
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto got = download_bf16(part);
    for (int m = 0; m < M; ++m)
      for (int n = 0; n < ns; ++n)
        y[static_cast<size_t>(m) * N + n0 + n] = got[static_cast<size_t>(m) * ns + n];
  }
  return y;
}

// rows_ring (gemm() at these sizes) against the same product in slices of fewer tiles (gemm_in_slices): the same
// bits, and within kTol of a double reference.
void expect_ring_matches_streaming(int M, int N, int K, std::mt19937& rng) {
  auto x = random_bf16(static_cast<size_t>(M) * K, rng), w = random_bf16(static_cast<size_t>(N) * K, rng);
  auto dx = upload_bf16(x), dw = upload_bf16(w);
  DevBuf<bf16> ring(static_cast<size_t>(M) * N);
  ring.poison();
  ZEST_ASSERT_OK(gemm(dx->get(), dw->get(), ring.get(), M, N, K, nullptr));
  sync_ok();
  const auto got = download_bf16(ring);
  EXPECT_EQ(got, gemm_in_slices(dx->get(), dw->get(), M, N, K));
  ZEST_EXPECT_CLOSE(got, ref_gemm(x.f, w.f, M, N, K), kTol);
}

// The small-M GEMM for many row tiles (the lm_head: rows_ring, a persistent CTA per SM with a bulk-copy ring of 16-row
// tiles): the same bits as the shared-memory tile and register-streamed kernels (whose chunk and reduction order it
// keeps; reached on slices of fewer tiles) and within kTol of a double reference, for one and two token tiles (M = 1, 5, 8, 9, 16),
// K = 2048 (3 stages), 1056 (33 chunks: warps with one chunk less; 4 stages) and 32 (one chunk), N with a tile count
// that the SMs do not divide (some CTAs take one tile more; several trips round the ring). Then behind a kernel that
// writes x, with programmatic launches on (x is read only after the wait): the same bits again.
TEST(CudaLatencyGemm, RingMatchesStreamingKernelAndReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(913);
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int tiles = 10 * sms + 7;
  for (auto [M, K] : {std::pair{1, 2048}, std::pair{9, 2048}, std::pair{8, 1056}, std::pair{16, 1056},
                      std::pair{5, 32}, std::pair{16, 32}}) {
    const int N = 16 * tiles;
    SCOPED_TRACE(testing::Message() << "M=" << M << " N=" << N << " K=" << K);
    expect_ring_matches_streaming(M, N, K, rng);
  }
  // x written by the kernel before (an RMSNorm of a residual row block), programmatic launches on.
  const bool pdl = programmatic_launch();
  set_programmatic_launch(true);
  const int M = 8, K = 2048, N = 16 * tiles;
  auto r = random_bf16(static_cast<size_t>(M) * K, rng), nw = random_bf16(K, rng), w = random_bf16(static_cast<size_t>(N) * K, rng);
  auto dr = upload_bf16(r), dnw = upload_bf16(nw), dw = upload_bf16(w);
  DevBuf<bf16> xn(static_cast<size_t>(M) * K), chained(static_cast<size_t>(M) * N), alone(static_cast<size_t>(M) * N);
  for (int rep = 0; rep < 3; ++rep) {
    xn.poison();
    chained.poison();
    ZEST_ASSERT_OK(rmsnorm(dr->get(), dnw->get(), xn.get(), M, K, 1e-6f, nullptr));
    ZEST_ASSERT_OK(gemm(xn.get(), dw->get(), chained.get(), M, N, K, nullptr));
    sync_ok();
    alone.poison();
    ZEST_ASSERT_OK(gemm(xn.get(), dw->get(), alone.get(), M, N, K, nullptr));
    sync_ok();
    EXPECT_EQ(download_bf16(chained), download_bf16(alone)) << "repetition " << rep;
  }
  set_programmatic_launch(pdl);
}

// rows_ring with short rows (K = 256: 8 chunks, one per consumer warp, so every warp reads every stage; 4 stages) and
// 6-7 tiles per CTA, so each stage is refilled after its readers handed it back: the same bits as gemm_in_slices and
// within kTol of the reference, for one and two token tiles. Small enough for compute-sanitizer's racecheck
// (bench/gpu/racecheck.sh).
TEST(CudaLatencyGemm, RingRefillsItsStagesWithShortRows) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(917);
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  const int K = 256, N = 16 * (6 * sms + 5);
  for (int M : {1, 16}) {
    SCOPED_TRACE(testing::Message() << "M=" << M << " N=" << N << " K=" << K);
    expect_ring_matches_streaming(M, N, K, rng);
  }
}

// The qkv GEMM with L2 prefetches of a paged KV cache (gemm_kv_prefetch: the KV rows prefetched at M <= 2 on the
// shared-memory tile path): the same bits as gemm() and within bf16 tolerance of a double reference, for M = 1, 2, 3,
// 8, 9 and 16 sequences of mixed context lengths (1: nothing to prefetch; page boundaries; 1025) over a shuffled block
// table, at the model's qkv shape and an odd one, with 4 and 2 kv heads per row; a KvPrefetch without a cache falls
// back to gemm().
TEST(CudaLatencyGemm, KvPrefetchGemmMatchesGemm) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(907);
  for (auto [M, N, K, Hkv] : {std::tuple{1, 5120, 2048, 4}, std::tuple{2, 5120, 2048, 4}, std::tuple{8, 5120, 2048, 4},
                              std::tuple{9, 5120, 2048, 4}, std::tuple{16, 5120, 2048, 4}, std::tuple{3, 208, 1056, 2},
                              std::tuple{2, 208, 1056, 2}}) {
    SCOPED_TRACE(testing::Message() << "M=" << M << " N=" << N << " K=" << K << " Hkv=" << Hkv);
    std::vector<int32_t> lens(M);
    const int pick[] = {1, 16, 17, 1025, 300, 2, 33, 1024};
    for (int b = 0; b < M; ++b) lens[b] = pick[(b * 5 + M) % 8];
    const PagedKvCase cache(lens, Hkv, rng);
    auto x = random_bf16(static_cast<size_t>(M) * K, rng), w = random_bf16(static_cast<size_t>(N) * K, rng);
    auto dx = upload_bf16(x), dw = upload_bf16(w);
    const auto ref = ref_gemm(x.f, w.f, M, N, K);
    const KvPrefetch& kv = cache.kv;
    DevBuf<bf16> base(static_cast<size_t>(M) * N);
    base.poison();
    ZEST_ASSERT_OK(gemm(dx->get(), dw->get(), base.get(), M, N, K, nullptr));
    sync_ok();
    const auto want = download_bf16(base);
    ZEST_EXPECT_CLOSE(want, ref, kTol);
    for (bool with_cache : {true, false}) {  // no cache: plain gemm()
      SCOPED_TRACE(testing::Message() << (with_cache ? "cache" : "no cache"));
      KvPrefetch use = kv;
      if (!with_cache) use.k_cache = nullptr;
      DevBuf<bf16> dy(static_cast<size_t>(M) * N);
      dy.poison();
      ZEST_ASSERT_OK(gemm_kv_prefetch(dx->get(), dw->get(), dy.get(), M, N, K, use, nullptr));
      sync_ok();
      EXPECT_EQ(download_bf16(dy), want);
    }
    // The caches are read only.
    EXPECT_EQ(download_bf16(*cache.dk), cache.kc.f);
    EXPECT_EQ(download_bf16(*cache.dv), cache.vc.f);
  }
}

// gemm_kv_prefetch with KvPrefetch::norm_w (x the residual row, normalised by the GEMM's CTAs) against the separate
// norm (moe_combine_add_rmsnorm with only empty slots: x unchanged, y = RMSNorm(x), the arithmetic the one-token
// experts' folded combine uses) followed by gemm(): bit for bit, with and without the KV cache (the norm weights in
// the registers of the lanes of an absent token row); the normalised GEMM within kTol of a double reference. One token
// row; K from 256 to 2048 (odd chunk counts included); the lm_head's many row tiles (151936 x 2048, and 1024 tiles at
// K = 256), where the norm folds into rows_ring; and the sizes it refuses.
TEST(CudaLatencyGemm, NormFoldedGemmMatchesNormThenGemm) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(908);
  const float eps = 1e-6f;
  for (auto [N, K] : {std::pair{5120, 2048}, std::pair{208, 256}, std::pair{64, 1056}, std::pair{151936, 2048},
                      std::pair{16 * 1024, 256}}) {
    SCOPED_TRACE(testing::Message() << "N=" << N << " K=" << K);
    ASSERT_TRUE(gemm_kv_norm_ok(1, N, K));
    auto x = random_bf16(K, rng, -3.f, 3.f), w = random_bf16(static_cast<size_t>(N) * K, rng),
         nw = random_bf16(K, rng, 0.5f, 1.5f);
    auto dx = upload_bf16(x), dw = upload_bf16(w), dnw = upload_bf16(nw);
    DevBuf<bf16> xn(K), base(N);
    DevBuf<float> slots(K);
    DevBuf<int32_t> ids(std::vector<int32_t>{-1});
    DevBuf<bf16> xcopy(K);
    ASSERT_EQ(cudaMemcpy(xcopy.get(), dx->get(), K * 2, cudaMemcpyDeviceToDevice), cudaSuccess);
    ZEST_ASSERT_OK(moe_combine_add_rmsnorm(xcopy.get(), slots.get(), ids.get(), 1, dnw->get(), xn.get(), 1, K, eps,
                                           nullptr));
    ZEST_ASSERT_OK(gemm(xn.get(), dw->get(), base.get(), 1, N, K, nullptr));
    sync_ok();
    const auto want = download_bf16(base);
    EXPECT_EQ(download_bf16(xcopy), x.f);  // only empty slots: x unchanged
    // Double reference: y = bf16(bf16(x * rsqrt(mean(x^2) + eps)) * w), then the GEMM.
    double ss = 0;
    for (float v : x.f) ss += static_cast<double>(v) * v;
    const double inv = 1.0 / std::sqrt(ss / K + eps);
    std::vector<float> y(K);
    for (int k = 0; k < K; ++k) y[k] = round_bf16(round_bf16(static_cast<float>(x.f[k] * inv)) * nw.f[k]);
    ZEST_EXPECT_CLOSE(want, ref_gemm(y, w.f, 1, N, K), kTol);
    const int max_blocks = 4;
    std::vector<int32_t> bt(max_blocks);
    std::iota(bt.begin(), bt.end(), 0);
    DevBuf<int32_t> dbt(bt), dlens(std::vector<int32_t>{40});
    auto kc = random_bf16(static_cast<size_t>(max_blocks) * kKvBlock * 2 * 128, rng);
    auto dk = upload_bf16(kc), dv = upload_bf16(kc);
    KvPrefetch kv;
    kv.norm_w = dnw->get();
    kv.norm_eps = eps;
    kv.k_cache = dk->get();
    kv.v_cache = dv->get();
    kv.block_table = dbt.get();
    kv.context_lens = dlens.get();
    kv.batch = 1;
    kv.max_blocks = max_blocks;
    kv.row_bytes = 2 * 128 * 2;
    for (bool with_cache : {true, false}) {
      SCOPED_TRACE(testing::Message() << (with_cache ? "cache" : "no cache"));
      KvPrefetch use = kv;
      if (!with_cache) use.k_cache = nullptr;
      DevBuf<bf16> dy(N);
      dy.poison();
      ZEST_ASSERT_OK(gemm_kv_prefetch(dx->get(), dw->get(), dy.get(), 1, N, K, use, nullptr));
      sync_ok();
      EXPECT_EQ(download_bf16(dy), want);
    }
  }
  EXPECT_FALSE(gemm_kv_norm_ok(2, 5120, 2048));  // one token row only
  EXPECT_FALSE(gemm_kv_norm_ok(1, 5120, 4096));  // one round: K <= 2048
  EXPECT_FALSE(gemm_kv_norm_ok(1, 5120, 128));   // every warp takes a chunk: K >= 256
}

// Fused routing against the separate steps' definitions: logits within bf16 tolerance of a double GEMM; the ids and
// weights equal the router reference applied to the kernel's own logits (the top-k is exact arithmetic on them); the
// plan equals a plan built on the host from the returned ids. T = 1 and 16, odd T, E, K and H (E = 7: a single-CTA
// split, which the cluster kernel serves), with and without bias, with and without the plan.
TEST(CudaLatencyRoute, FusedRoutingMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(902);
  for (auto [T, E, K, H, use_bias] :
       {std::tuple{1, 128, 8, 2048, false}, std::tuple{16, 128, 8, 2048, true}, std::tuple{5, 40, 4, 96, true},
        std::tuple{16, 256, 16, 512, false}, std::tuple{3, 24, 3, 64, false}, std::tuple{9, 128, 8, 4096, false},
        std::tuple{2, 7, 2, 32, true}}) {
    SCOPED_TRACE(testing::Message() << "T=" << T << " E=" << E << " K=" << K << " H=" << H);
    ASSERT_TRUE(moe_route_ok(T, H, E, K));
    const auto rc = make_route_case(T, E, K, H, rng, 3);
    auto& x = rc->x;
    auto& w = rc->w;
    auto& bias = rc->bias;
    auto& dx = rc->dx;
    auto& dw = rc->dw;
    auto& dbias = rc->dbias;
    auto& dwt = rc->dwt;
    auto& di = rc->di;
    auto& dl = rc->dl;
    auto& buf = rc->buf;
    auto& count = rc->count;
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
      ref_router_topk(logits, use_bias ? &bias : nullptr, T, E, K, ref_ids, ref_w);
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

// Decode attention with q/k norm + RoPE + KV write folded in, against (1) a host reference (norm + RoPE, the new
// token's k/v at its position, attention in double) within bf16 tolerance and (2) the separate kernels
// qk_norm_rope_kv + decode_attention (output and k cache within 1e-2, v cache bit for bit). Mixed lengths (1, 5, 16,
// 17, 33, 64, 300, 1025 tokens: the current token first, last and inside a page), random block tables, stale cache
// contents at the current slot, 1-D RoPE and M-RoPE, batch 1, 3 and 5.
void run_fused_attention_case(const std::vector<int>& lens, int Hkv, bool mrope, std::mt19937& rng) {
  SCOPED_TRACE(testing::Message() << "B=" << lens.size() << " Hkv=" << Hkv << " mrope=" << mrope
                                  << " first len=" << lens[0]);
  const FusedDecodeCase c = make_fused_decode_case(lens, Hkv, mrope, /*nan_tail=*/false, rng);
  const int B = c.B, Hq = c.Hq, D = c.D, q_stride = c.q_stride;
  const DecodeAttention& p = c.p;
  ASSERT_TRUE(decode_attention_fused_ok(p, reinterpret_cast<const bf16*>(0x1000), q_stride));

  DevBuf<int32_t> dbt(c.bt), dlens(std::vector<int32_t>(lens.begin(), lens.end())), dpos(c.pos), dslots(c.slots);
  auto dqn = upload_bf16(c.qn), dkn = upload_bf16(c.kn);
  DevBuf<unsigned char> ws(decode_attention_workspace_bytes(p));
  ASSERT_EQ(cudaMemset(ws.get(), 0, ws.size()), cudaSuccess);
  // Fused.
  auto dk1 = upload_bf16(c.kc), dv1 = upload_bf16(c.vc), dq1 = upload_bf16(c.qkv);
  DevBuf<bf16> out1(static_cast<size_t>(B) * Hq * D);
  out1.poison();
  ZEST_ASSERT_OK(decode_attention_fused(p, dq1->get(), q_stride, dqn->get(), dkn->get(), dpos.get(), c.pos_stride,
                                        c.rope, dslots.get(), dk1->get(), dv1->get(), dbt.get(), dlens.get(),
                                        out1.get(), ws.get(), 1e-6f, nullptr));
  sync_ok();
  // Separate kernels.
  auto dk2 = upload_bf16(c.kc), dv2 = upload_bf16(c.vc), dq2 = upload_bf16(c.qkv);
  DevBuf<bf16> out2(static_cast<size_t>(B) * Hq * D);
  ZEST_ASSERT_OK(qk_norm_rope_kv(dq2->get(), dqn->get(), dkn->get(), dpos.get(), c.pos_stride, c.rope, dslots.get(),
                                 dk2->get(), dv2->get(), B, Hq, Hkv, D, 1e-6f, nullptr));
  ZEST_ASSERT_OK(decode_attention(p, dq2->get(), q_stride, dk2->get(), dv2->get(), dbt.get(), dlens.get(), out2.get(),
                                  ws.get(), nullptr));
  sync_ok();
  const auto got = download_bf16(out1);
  // The same arithmetic as the separate kernels (up to the compiler's contractions in the RoPE products).
  ZEST_EXPECT_CLOSE(got, download_bf16(out2), 1e-2);
  ZEST_EXPECT_CLOSE(download_bf16(*dk1), download_bf16(*dk2), 1e-2);
  EXPECT_EQ(download_bf16(*dv1), download_bf16(*dv2));
  // The input rows are left as they were.
  EXPECT_EQ(download_bf16(*dq1), c.qkv.f);

  // Host reference.
  const FusedDecodeRef r = fused_decode_reference(c);
  ZEST_EXPECT_CLOSE(got, r.out, kTol);
  ZEST_EXPECT_CLOSE(download_bf16(*dk1), r.kref, kTol);
  ZEST_EXPECT_CLOSE(download_bf16(*dv1), r.vref, 0.0);
}

// Both merges: the cluster merge (up to 8 (sequence, kv head) pairs and 2048 tokens: 1025 tokens at 4 kv heads, three
// sequences at one) and global partials with a last-CTA merge (10 pairs at Hkv = 2, which the bulk-copy ring does not
// serve; contexts above 2048 tokens).
TEST(CudaLatencyAttention, FusedNormRopeKvMatchesReferenceAndSeparateKernels) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(903);
  run_fused_attention_case({1025}, 4, false, rng);
  run_fused_attention_case({1, 16, 17, 300, 1025}, 2, true, rng);
  run_fused_attention_case({33, 5, 64}, 1, false, rng);
  run_fused_attention_case({2049, 700}, 1, false, rng);
}

// MoE combine + residual add + RMSNorm (the register path for hidden <= 2048 and the loop above it): x equals the
// host's fp32 sum of the non-empty slots in slot order, rounded as the kernel rounds (bit for bit); y within bf16
// tolerance of a host RMSNorm. Empty slots hold NaN (they must not be read into the sum); K = 8 and 10 (two groups
// of loads), T = 1 and 16.
TEST(CudaLatencyNorm, CombineAddRmsnormMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(905);
  for (auto [rows, K, hidden] : {std::tuple{1, 8, 2048}, std::tuple{16, 8, 2048}, std::tuple{3, 10, 520},
                                 std::tuple{2, 8, 4096}}) {
    SCOPED_TRACE(testing::Message() << "rows=" << rows << " K=" << K << " hidden=" << hidden);
    auto x = random_bf16(static_cast<size_t>(rows) * hidden, rng), w = random_bf16(hidden, rng, 0.5f, 1.5f);
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    std::vector<float> slots(static_cast<size_t>(rows) * K * hidden);
    for (auto& v : slots) v = d(rng);
    std::vector<int32_t> ids(static_cast<size_t>(rows) * K);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = i % 3 == 1 ? -1 : static_cast<int32_t>(i % 128);
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] < 0)
        for (int h = 0; h < hidden; ++h) slots[i * hidden + h] = NAN;
    auto dx = upload_bf16(x), dw = upload_bf16(w);
    DevBuf<float> ds(slots);
    DevBuf<int32_t> di(ids);
    DevBuf<bf16> dy(x.f.size());
    dy.poison();
    ZEST_ASSERT_OK(
        moe_combine_add_rmsnorm(dx->get(), ds.get(), di.get(), K, dw->get(), dy.get(), rows, hidden, 1e-6f, nullptr));
    sync_ok();
    std::vector<float> xs(x.f.size()), yref(x.f.size());
    for (int n = 0; n < rows; ++n) {
      double ss = 0;
      for (int h = 0; h < hidden; ++h) {
        float acc = 0.f;
        for (int k = 0; k < K; ++k)
          if (ids[n * K + k] >= 0) acc += slots[(static_cast<size_t>(n) * K + k) * hidden + h];
        const float v = round_bf16(x.f[n * hidden + h] + round_bf16(acc));
        xs[n * hidden + h] = v;
        ss += static_cast<double>(v) * v;
      }
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / hidden + 1e-6));
      for (int h = 0; h < hidden; ++h) yref[n * hidden + h] = round_bf16(round_bf16(xs[n * hidden + h] * inv) * w.f[h]);
    }
    EXPECT_EQ(download_bf16(*dx), xs);
    ZEST_EXPECT_CLOSE(download_bf16(dy), yref, kTol);
  }
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
