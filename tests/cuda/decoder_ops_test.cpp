// Generic kernels of the CUDA text decoder (paged attention for any head_dim, contiguous prefill attention
// fallback, row gather/scatter, SERE statistics) against plain f32 loops on random inputs.
#ifdef ZEST_HAVE_CUDA
#include <numeric>
#include <set>
#include <tuple>

#include "cuda/cuda_test_util.h"

namespace zest::cuda::test {
namespace {

constexpr double kTol = 2e-2;  // bf16 outputs: max abs err <= 2e-2 * max |ref|

// Softmax attention of one query over keys 0..n-1 given by key(j)/val(j) pointers (f32 reference).
template <typename KeyFn, typename ValFn>
void ref_attend(const float* q, int n, int D, float scale, KeyFn key, ValFn val, float* out) {
  std::vector<double> s(n);
  double mx = -INFINITY;
  for (int j = 0; j < n; ++j) {
    double d = 0;
    const float* k = key(j);
    for (int i = 0; i < D; ++i) d += static_cast<double>(q[i]) * k[i];
    s[j] = d * scale;
    mx = std::max(mx, s[j]);
  }
  double sum = 0;
  for (int j = 0; j < n; ++j) sum += s[j] = std::exp(s[j] - mx);
  for (int i = 0; i < D; ++i) {
    double o = 0;
    for (int j = 0; j < n; ++j) o += s[j] * val(j)[i];
    out[i] = static_cast<float>(o / sum);
  }
}

struct PagedCase {
  int D, Hq, Hkv;
  std::vector<int> seq_lens;  // tokens in the cache per sequence
};

// Every token of every sequence is a query (each with its own length, as in chunked prefill); the kernel
// runs on a subset given by a row list and must leave the other output rows untouched.
void run_paged_case(const PagedCase& c, std::mt19937& rng) {
  SCOPED_TRACE(testing::Message() << "D=" << c.D << " Hq=" << c.Hq << " Hkv=" << c.Hkv);
  const int nseq = static_cast<int>(c.seq_lens.size());
  int max_blocks = 0, total_blocks = 0, T = 0;
  for (int n : c.seq_lens) {
    max_blocks = std::max(max_blocks, (n + kKvBlock - 1) / kKvBlock);
    total_blocks += (n + kKvBlock - 1) / kKvBlock;
    T += n;
  }
  const int num_blocks = total_blocks + 3;
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table(static_cast<size_t>(nseq) * max_blocks, -1);
  int next = 0;
  for (int s = 0; s < nseq; ++s)
    for (int b = 0; b < (c.seq_lens[s] + kKvBlock - 1) / kKvBlock; ++b) table[s * max_blocks + b] = perm[next++];
  const size_t row = static_cast<size_t>(c.Hkv) * c.D;
  auto kc = random_bf16(static_cast<size_t>(num_blocks) * kKvBlock * row, rng);
  auto vc = random_bf16(static_cast<size_t>(num_blocks) * kKvBlock * row, rng);
  const int q_stride = (c.Hq + 2) * c.D;  // q rows padded like a qkv buffer
  auto q = random_bf16(static_cast<size_t>(T) * q_stride, rng, -2.f, 2.f);
  std::vector<int32_t> seq_rows, ctx, rows;
  for (int s = 0; s < nseq; ++s)
    for (int i = 0; i < c.seq_lens[s]; ++i) {
      seq_rows.push_back(s);
      ctx.push_back(i + 1);
    }
  for (int t = 0; t < T; ++t)
    if (t % 3 != 1) rows.push_back(t);
  const float scale = 1.f / std::sqrt(static_cast<float>(c.D));

  auto dk = upload_bf16(kc), dv = upload_bf16(vc), dq = upload_bf16(q);
  DevBuf<int32_t> dtable(table), dseq(seq_rows), dctx(ctx), drows(rows);
  const int out_stride = c.Hq * c.D;
  DevBuf<bf16> out(static_cast<size_t>(T) * out_stride);
  out.poison();
  ZEST_ASSERT_OK(paged_attention(dq->get(), q_stride, dk->get(), dv->get(), dtable.get(), max_blocks, dseq.get(),
                                 dctx.get(), drows.get(), static_cast<int>(rows.size()), out.get(), out_stride, c.Hq,
                                 c.Hkv, c.D, scale, nullptr));
  sync_ok();
  const auto got = download_bf16(out);
  std::vector<float> g, r;
  for (int t = 0; t < T; ++t) {
    const bool listed = std::find(rows.begin(), rows.end(), t) != rows.end();
    for (int h = 0; h < c.Hq; ++h) {
      const float* o = &got[static_cast<size_t>(t) * out_stride + h * c.D];
      if (!listed) {
        for (int i = 0; i < c.D; ++i) ASSERT_TRUE(std::isnan(o[i])) << "unlisted row " << t << " was written";
        continue;
      }
      const int kvh = h / (c.Hq / c.Hkv);
      auto addr = [&](const std::vector<float>& cache, int j) {
        const size_t slot = static_cast<size_t>(table[seq_rows[t] * max_blocks + j / kKvBlock]) * kKvBlock + j % kKvBlock;
        return &cache[(slot * c.Hkv + kvh) * c.D];
      };
      std::vector<float> ref(c.D);
      ref_attend(&q.f[static_cast<size_t>(t) * q_stride + h * c.D], ctx[t], c.D, scale,
                 [&](int j) { return addr(kc.f, j); }, [&](int j) { return addr(vc.f, j); }, ref.data());
      g.insert(g.end(), o, o + c.D);
      r.insert(r.end(), ref.begin(), ref.end());
    }
  }
  ZEST_EXPECT_CLOSE(g, r, kTol);
}

TEST(CudaPagedAttention, AnyHeadDimPerTokenLengthsMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(71);
  run_paged_case({16, 4, 2, {1, 37, 5}}, rng);
  run_paged_case({64, 8, 2, {130, 16}}, rng);
  run_paged_case({128, 4, 4, {3, 200}}, rng);
  run_paged_case({256, 2, 1, {17}}, rng);
}

TEST(CudaPagedAttention, RejectsBadShapes) {
  ZEST_REQUIRE_GPU();
  DevBuf<bf16> b(64);
  DevBuf<int32_t> i(4);
  EXPECT_FALSE(paged_attention(b.get(), 16, b.get(), b.get(), i.get(), 1, nullptr, i.get(), nullptr, 1, b.get(), 16, 4, 3,
                               16, 1.f, nullptr)
                   .is_ok());
  EXPECT_FALSE(paged_attention(b.get(), 16, b.get(), b.get(), i.get(), 1, nullptr, i.get(), nullptr, 1, b.get(), 16, 4, 2,
                               258, 1.f, nullptr)
                   .is_ok());
}

// decode_attention with head_dim 16 goes through the generic kernel (one query per sequence).
TEST(CudaDecodeAttention, HeadDim16MatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(72);
  const int B = 3, Hq = 4, Hkv = 2, D = 16, max_blocks = 4;
  const std::vector<int32_t> lens = {1, 20, 64};
  std::vector<int32_t> table(B * max_blocks);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  const size_t row = static_cast<size_t>(Hkv) * D;
  auto kc = random_bf16(B * max_blocks * kKvBlock * row, rng), vc = random_bf16(B * max_blocks * kKvBlock * row, rng);
  const int q_stride = (Hq + 2 * Hkv) * D;
  auto q = random_bf16(static_cast<size_t>(B) * q_stride, rng, -2.f, 2.f);
  auto dk = upload_bf16(kc), dv = upload_bf16(vc), dq = upload_bf16(q);
  DevBuf<int32_t> dtable(table), dlens(lens);
  DevBuf<bf16> out(static_cast<size_t>(B) * Hq * D);
  DecodeAttention p;
  p.batch = B;
  p.q_heads = Hq;
  p.kv_heads = Hkv;
  p.head_dim = D;
  p.max_context = 64;
  p.max_blocks = max_blocks;
  p.scale = 0.25f;
  DevBuf<unsigned char> ws(decode_attention_workspace_bytes(p));
  ZEST_ASSERT_OK(decode_attention(p, dq->get(), q_stride, dk->get(), dv->get(), dtable.get(), dlens.get(), out.get(),
                                  ws.get(), nullptr));
  sync_ok();
  std::vector<float> ref(static_cast<size_t>(B) * Hq * D);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h) {
      auto addr = [&](const std::vector<float>& cache, int j) {
        const size_t slot = static_cast<size_t>(table[b * max_blocks + j / kKvBlock]) * kKvBlock + j % kKvBlock;
        return &cache[(slot * Hkv + h / 2) * D];
      };
      ref_attend(&q.f[static_cast<size_t>(b) * q_stride + h * D], lens[b], D, p.scale,
                 [&](int j) { return addr(kc.f, j); }, [&](int j) { return addr(vc.f, j); }, &ref[(b * Hq + h) * D]);
    }
  ZEST_EXPECT_CLOSE(download_bf16(out), ref, kTol);
}

// prefill_attention with head_dim 16 and 48 (contiguous, causal, packed sequences) through the generic kernel.
TEST(CudaPrefillAttention, GenericHeadDimMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(73);
  for (int D : {16, 48}) {
    SCOPED_TRACE(testing::Message() << "D=" << D);
    const std::vector<int> lens = {1, 33, 140};
    const int Hq = 4, Hkv = 2, row = (Hq + 2 * Hkv) * D;
    std::vector<int32_t> cu = {0};
    for (int n : lens) cu.push_back(cu.back() + n);
    const int T = cu.back();
    auto qkv = random_bf16(static_cast<size_t>(T) * row, rng, -2.f, 2.f);
    auto dqkv = upload_bf16(qkv);
    DevBuf<int32_t> dcu(cu);
    DevBuf<bf16> out(static_cast<size_t>(T) * Hq * D);
    const float scale = 1.f / std::sqrt(static_cast<float>(D));
    ZEST_ASSERT_OK(prefill_attention(dqkv->get(), row, dqkv->get() + Hq * D, dqkv->get() + (Hq + Hkv) * D, row, dcu.get(),
                                     static_cast<int>(lens.size()), 140, out.get(), Hq, Hkv, D, scale, nullptr));
    sync_ok();
    std::vector<float> ref(static_cast<size_t>(T) * Hq * D);
    for (size_t s = 0; s < lens.size(); ++s)
      for (int i = 0; i < lens[s]; ++i)
        for (int h = 0; h < Hq; ++h) {
          const int t = cu[s] + i, kvh = h / (Hq / Hkv);
          ref_attend(&qkv.f[static_cast<size_t>(t) * row + h * D], i + 1, D, scale,
                     [&](int j) { return &qkv.f[static_cast<size_t>(cu[s] + j) * row + (Hq + kvh) * D]; },
                     [&](int j) { return &qkv.f[static_cast<size_t>(cu[s] + j) * row + (Hq + Hkv + kvh) * D]; },
                     &ref[(static_cast<size_t>(t) * Hq + h) * D]);
        }
    ZEST_EXPECT_CLOSE(download_bf16(out), ref, kTol);
  }
}

TEST(CudaRows, GatherAndScatterMatchLoops) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(74);
  const int rows = 9, hidden = 20, n = 4;
  auto src = random_bf16(static_cast<size_t>(rows) * hidden, rng);
  auto small = random_bf16(static_cast<size_t>(n) * hidden, rng);
  const std::vector<int32_t> idx = {7, 0, 3, 8};
  auto dsrc = upload_bf16(src), dsmall = upload_bf16(small);
  DevBuf<int32_t> didx(idx);
  DevBuf<bf16> gathered(static_cast<size_t>(n) * hidden);
  ZEST_ASSERT_OK(gather_rows(dsrc->get(), didx.get(), gathered.get(), n, hidden, nullptr));
  sync_ok();
  std::vector<float> ref;
  for (int r = 0; r < n; ++r) ref.insert(ref.end(), &src.f[idx[r] * hidden], &src.f[idx[r] * hidden] + hidden);
  EXPECT_EQ(download_bf16(gathered), ref);

  for (bool add : {false, true}) {
    auto dst = upload_bf16(src);
    ZEST_ASSERT_OK(scatter_rows(dsmall->get(), didx.get(), dst->get(), n, hidden, add, nullptr));
    sync_ok();
    std::vector<float> expect = src.f;
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < hidden; ++i) {
        float& e = expect[idx[r] * hidden + i];
        e = add ? round_bf16(e + small.f[r * hidden + i]) : small.f[r * hidden + i];
      }
    EXPECT_EQ(download_bf16(*dst), expect) << (add ? "add" : "replace");
  }
}

// SERE statistics after a device re-routing, against counts taken by plain loops on the same ids.
TEST(CudaSereStats, CountsMatchLoops) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(75);
  const int N = 37, K = 8, E = 64, S = 2;
  std::vector<int32_t> ids(N * K);
  std::vector<float> w(N * K, 0.125f);
  std::vector<int> experts(E);
  std::iota(experts.begin(), experts.end(), 0);
  for (int n = 0; n < N; ++n) {
    std::shuffle(experts.begin(), experts.end(), rng);
    std::copy(experts.begin(), experts.begin() + K, ids.begin() + n * K);
  }
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<float> sim(E * E);
  for (int a = 0; a < E; ++a)
    for (int b = 0; b < E; ++b) sim[a * E + b] = a == b ? 1.f : u(rng);
  DevBuf<int32_t> dbefore(ids), dafter(ids);
  DevBuf<float> dw(w), dsim(sim);
  ZEST_ASSERT_OK(sere_reroute(dafter.get(), dw.get(), dsim.get(), N, E, K, S, 0.5f, nullptr));
  std::vector<int64_t> zero(6, 0);
  DevBuf<int64_t> counts(zero);
  for (int rep = 0; rep < 2; ++rep)
    ZEST_ASSERT_OK(sere_stats(dbefore.get(), dafter.get(), N, K, S, E, counts.get(), nullptr));
  sync_ok();
  const auto after = dafter.download();
  const auto got = counts.download();
  std::set<int> b_set, a_set, p_set;
  int64_t rerouted = 0;
  for (int i = 0; i < N * K; ++i) {
    b_set.insert(ids[i]);
    if (after[i] >= 0) a_set.insert(after[i]);
    if (i % K < S) p_set.insert(ids[i]);
    rerouted += after[i] != ids[i];
  }
  EXPECT_GT(rerouted, 0);
  EXPECT_EQ(got[0], 2);
  EXPECT_EQ(got[1], 2 * static_cast<int64_t>(b_set.size()));
  EXPECT_EQ(got[2], 2 * static_cast<int64_t>(a_set.size()));
  EXPECT_EQ(got[3], 2 * static_cast<int64_t>(a_set.size() - p_set.size()));
  EXPECT_EQ(got[4], 2 * rerouted);
  EXPECT_EQ(got[5], 2 * static_cast<int64_t>(N) * K);
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
