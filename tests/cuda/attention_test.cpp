// CUDA attention kernels (q/k norm + RoPE + KV write, paged decode attention, prefill attention) against
// plain f32 loops.
#ifdef ZEST_HAVE_CUDA
#include <numeric>

#include "cuda/cuda_test_util.h"
#include "cuda/fused_decode_case.h"
#include "cuda/prefill_attention_check.h"

namespace zest::cuda::test {
namespace {

constexpr float kEps = 1e-6f;
constexpr double kTol = 2e-2;  // bf16 outputs: max abs err <= 2e-2 * max |ref|

struct RopeCase {
  int T, Hq, Hkv, D;
  bool mrope;
};

void run_rope_case(const RopeCase& c, std::mt19937& rng) {
  const int heads = c.Hq + 2 * c.Hkv, row = heads * c.D, num_blocks = 4;
  auto qkv = random_bf16(static_cast<size_t>(c.T) * row, rng, -2.f, 2.f);
  auto qn = random_bf16(c.D, rng, 0.5f, 1.5f), kn = random_bf16(c.D, rng, 0.5f, 1.5f);
  std::uniform_int_distribution<int> pd(0, 6000);
  std::vector<int32_t> pos(3 * c.T);
  for (auto& p : pos) p = pd(rng);
  std::vector<int32_t> slots(c.T);
  for (int t = 0; t < c.T; ++t) slots[t] = t == 2 ? -1 : (t * 13 + 5) % (num_blocks * kKvBlock);
  RopeParams rope;
  rope.theta = 5e6f;
  if (c.mrope) rope.section_h = rope.section_w = 20;
  const int pos_stride = c.mrope ? c.T : 0;

  auto dqkv = upload_bf16(qkv), dqn = upload_bf16(qn), dkn = upload_bf16(kn);
  DevBuf<int32_t> dpos(pos), dslots(slots);
  const size_t cache_elems = static_cast<size_t>(num_blocks) * kKvBlock * c.Hkv * c.D;
  DevBuf<bf16> kc(cache_elems), vc(cache_elems);
  kc.poison();
  vc.poison();
  ZEST_ASSERT_OK(qk_norm_rope_kv(dqkv->get(), dqn->get(), dkn->get(), dpos.get(), pos_stride, rope, dslots.get(),
                                 kc.get(), vc.get(), c.T, c.Hq, c.Hkv, c.D, kEps, nullptr));
  sync_ok();

  std::vector<float> ref = qkv.f;
  const int half = c.D / 2;
  for (int t = 0; t < c.T; ++t)
    for (int h = 0; h < c.Hq + c.Hkv; ++h) {
      float* x = &ref[static_cast<size_t>(t) * row + h * c.D];
      const std::vector<float>& w = h < c.Hq ? qn.f : kn.f;
      double ss = 0;
      for (int d = 0; d < c.D; ++d) ss += static_cast<double>(x[d]) * x[d];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / c.D + kEps));
      std::vector<float> n(c.D);
      for (int d = 0; d < c.D; ++d) n[d] = round_bf16(round_bf16(x[d] * inv) * w[d]);
      for (int j = 0; j < half; ++j) {
        int axis = 0;
        if (c.mrope && j % 3 == 1 && j < 60) axis = 1;
        if (c.mrope && j % 3 == 2 && j < 60) axis = 2;
        const double p = pos[(c.mrope ? axis * c.T : 0) + t];
        const double ang = p / std::pow(5e6, 2.0 * j / c.D);
        const float cs = round_bf16(static_cast<float>(std::cos(ang))), sn = round_bf16(static_cast<float>(std::sin(ang)));
        x[j] = n[j] * cs - n[j + half] * sn;
        x[j + half] = n[j + half] * cs + n[j] * sn;
      }
    }
  ZEST_EXPECT_CLOSE(download_bf16(*dqkv), ref, kTol);

  const auto kgot = download_bf16(kc), vgot = download_bf16(vc);
  std::vector<float> kref, kg, vref, vg;
  for (int t = 0; t < c.T; ++t) {
    if (slots[t] < 0) continue;
    for (int h = 0; h < c.Hkv; ++h)
      for (int d = 0; d < c.D; ++d) {
        const size_t dst = (static_cast<size_t>(slots[t]) * c.Hkv + h) * c.D + d;
        kref.push_back(ref[static_cast<size_t>(t) * row + (c.Hq + h) * c.D + d]);
        kg.push_back(kgot[dst]);
        vref.push_back(qkv.f[static_cast<size_t>(t) * row + (c.Hq + c.Hkv + h) * c.D + d]);
        vg.push_back(vgot[dst]);
      }
  }
  ZEST_EXPECT_CLOSE(kg, kref, kTol);
  ZEST_EXPECT_CLOSE(vg, vref, 0.0);
  // A slot no token maps to keeps its poison.
  std::vector<bool> used(num_blocks * kKvBlock, false);
  for (int s : slots)
    if (s >= 0) used[s] = true;
  const int unused = static_cast<int>(std::find(used.begin(), used.end(), false) - used.begin());
  EXPECT_TRUE(std::isnan(kgot[static_cast<size_t>(unused) * c.Hkv * c.D]));
}

TEST(CudaRope, MropeNormAndKvWriteMatchReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(21);
  run_rope_case({5, 4, 2, 128, true}, rng);
}

TEST(CudaRope, OneDimensionalRopeWithSmallHeadDim) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(22);
  run_rope_case({3, 6, 3, 64, false}, rng);
}

// unaligned_q: the query rows start one element past a 16-byte boundary (the scalar query loads).
void run_decode_case(const std::vector<int>& lens, int Hq, int Hkv, std::mt19937& rng, bool unaligned_q = false) {
  const int B = static_cast<int>(lens.size()), D = 128;
  const int max_ctx = *std::max_element(lens.begin(), lens.end());
  const int max_blocks = (max_ctx + kKvBlock - 1) / kKvBlock + 1;
  const int num_blocks = B * max_blocks;
  // Each sequence gets a random set of physical blocks.
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> bt(perm.begin(), perm.end());
  const size_t cache_elems = static_cast<size_t>(num_blocks) * kKvBlock * Hkv * D;
  auto kc = random_bf16(cache_elems, rng, -1.5f, 1.5f), vc = random_bf16(cache_elems, rng);
  const int q_stride = (Hq + 2 * Hkv) * D;
  const int shift = unaligned_q ? 1 : 0;
  auto q = random_bf16(static_cast<size_t>(B) * q_stride + shift, rng, -1.5f, 1.5f);

  DecodeAttention p;
  p.batch = B;
  p.q_heads = Hq;
  p.kv_heads = Hkv;
  p.max_context = max_ctx;
  p.max_blocks = max_blocks;
  p.scale = 1.f / std::sqrt(static_cast<float>(D));
  auto dk = upload_bf16(kc), dv = upload_bf16(vc), dq = upload_bf16(q);
  DevBuf<int32_t> dbt(bt), dlens(std::vector<int32_t>(lens.begin(), lens.end()));
  DevBuf<unsigned char> ws(decode_attention_workspace_bytes(p));
  ASSERT_EQ(cudaMemset(ws.get(), 0, ws.size()), cudaSuccess);
  DevBuf<bf16> out(static_cast<size_t>(B) * Hq * D);
  out.poison();
  ZEST_ASSERT_OK(decode_attention(p, dq->get() + shift, q_stride, dk->get(), dv->get(), dbt.get(), dlens.get(),
                                  out.get(), ws.get(), nullptr));
  sync_ok();
  const auto got = download_bf16(out);

  std::vector<float> ref(got.size());
  const int G = Hq / Hkv;
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < Hq; ++h) {
      std::vector<const float*> ks, vs;
      for (int t = 0; t < lens[b]; ++t) {
        const size_t off = ((static_cast<size_t>(bt[b * max_blocks + t / kKvBlock]) * kKvBlock + t % kKvBlock) * Hkv +
                            h / G) * D;
        ks.push_back(&kc.f[off]);
        vs.push_back(&vc.f[off]);
      }
      ref_attend(&q.f[shift + static_cast<size_t>(b) * q_stride + h * D], ks, vs, D, p.scale, &ref[(static_cast<size_t>(b) * Hq + h) * D]);
    }
  ZEST_EXPECT_CLOSE(got, ref, kTol);

  // A second launch on the same workspace gives the same bits (the split counters were reset).
  ZEST_ASSERT_OK(decode_attention(p, dq->get() + shift, q_stride, dk->get(), dv->get(), dbt.get(), dlens.get(), out.get(),
                                  ws.get(), nullptr));
  sync_ok();
  const auto again = download_bf16(out);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(again[i], got[i]) << "element " << i;

  // With counters of its own (DecodeAttention::counters) the workspace is partials only: filled with 0xff bytes (a
  // counter there would read -1 and no split would merge), the output poisoned, twice: the same bits.
  DevBuf<int32_t> counters(std::vector<int32_t>(static_cast<size_t>(B) * Hkv, 0));
  DecodeAttention pc = p;
  pc.counters = counters.get();
  ASSERT_LE(decode_attention_workspace_bytes(pc), ws.size());
  for (int round = 0; round < 2; ++round) {
    ASSERT_EQ(cudaMemset(ws.get(), 0xff, ws.size()), cudaSuccess);
    out.poison();
    ZEST_ASSERT_OK(decode_attention(pc, dq->get() + shift, q_stride, dk->get(), dv->get(), dbt.get(), dlens.get(),
                                    out.get(), ws.get(), nullptr));
    sync_ok();
    const auto own = download_bf16(out);
    for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(own[i], got[i]) << "round " << round << " element " << i;
  }
}

TEST(CudaDecodeAttention, BatchOneLongContext) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(23);
  run_decode_case({5000}, 32, 4, rng);
}

TEST(CudaDecodeAttention, MixedLengthsGqa8) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(24);
  run_decode_case({1, 37, 16, 1025, 300}, 32, 4, rng);
}

TEST(CudaDecodeAttention, Gqa16AndGqa1) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(25);
  run_decode_case({77, 5}, 16, 1, rng);
  run_decode_case({129, 3}, 4, 4, rng);
}

TEST(CudaDecodeAttention, UnalignedQueries) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(26);
  run_decode_case({1025, 3, 40}, 32, 4, rng, true);
  run_decode_case({1}, 16, 1, rng, true);
}

// Both page loops (tensor cores for 8 query heads per kv head and 16-byte aligned query rows; CUDA cores, which the
// unaligned rows take): long and short contexts, lengths at and around page boundaries (masked tokens of the last
// page), several sequences per launch; same f32 reference.
TEST(CudaDecodeAttention, BothPageLoopsMatchReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(27);
  for (bool unaligned : {false, true}) {  // tensor cores, then the CUDA-core page loop
    SCOPED_TRACE(testing::Message() << "unaligned q " << unaligned);
    run_decode_case({5000}, 32, 4, rng, unaligned);
    run_decode_case({1, 15, 16, 17, 33, 1025, 300}, 32, 4, rng, unaligned);
    run_decode_case({64, 2}, 8, 1, rng, true);
  }
}

// decode_attention_fused against a host reference: q/k norm + RoPE, the current token's k/v stored at its slot (k
// within bf16 tolerance, v bit for bit) and attended, attention in double (output within kTol = 2e-2 of max |ref|).
// The cache is random; rows past each sequence's context in its last page hold NaN (never attended: no NaN may reach
// the output) and the current token's slot holds stale random values. A second launch on the same workspace with
// counters of its own (DecodeAttention::counters; the workspace then filled with 0xff bytes, the output poisoned)
// gives the same bits.
void run_fused_case(const std::vector<int>& lens, int Hkv, bool mrope, std::mt19937& rng) {
  SCOPED_TRACE(testing::Message() << "B=" << lens.size() << " Hkv=" << Hkv << " mrope=" << mrope
                                  << " first len=" << lens[0]);
  const FusedDecodeCase c = make_fused_decode_case(lens, Hkv, mrope, /*nan_tail=*/true, rng);
  const int B = c.B, Hq = c.Hq, D = c.D, q_stride = c.q_stride;
  const DecodeAttention& p = c.p;

  // The rows of a cache at the current tokens' slots.
  const auto at_slots = [&](const std::vector<float>& cache) {
    std::vector<float> rows;
    for (int b = 0; b < B; ++b) {
      const auto row = cache.begin() + static_cast<size_t>(c.slots[b]) * Hkv * D;
      rows.insert(rows.end(), row, row + static_cast<size_t>(Hkv) * D);
    }
    return rows;
  };
  // Host reference.
  const FusedDecodeRef r = fused_decode_reference(c);
  const std::vector<float>& ref = r.out;
  const std::vector<float> kr = at_slots(r.kref), vr = at_slots(r.vref);

  DevBuf<int32_t> dbt(c.bt), dlens(std::vector<int32_t>(lens.begin(), lens.end())), dpos(c.pos), dslots(c.slots);
  auto dqn = upload_bf16(c.qn), dkn = upload_bf16(c.kn), dq = upload_bf16(c.qkv);
  DevBuf<unsigned char> ws(decode_attention_workspace_bytes(p));
  ASSERT_EQ(cudaMemset(ws.get(), 0, ws.size()), cudaSuccess);
  // The second launch takes counters of its own (DecodeAttention::counters) and a workspace of 0xff bytes.
  DecodeAttention p2 = p;
  DevBuf<int32_t> counters(std::vector<int32_t>(static_cast<size_t>(B) * Hkv, 0));
  p2.counters = counters.get();
  auto dk = upload_bf16(c.kc), dv = upload_bf16(c.vc);
  DevBuf<bf16> out(static_cast<size_t>(B) * Hq * D);
  out.poison();
  ZEST_ASSERT_OK(decode_attention_fused(p, dq->get(), q_stride, dqn->get(), dkn->get(), dpos.get(), c.pos_stride,
                                        c.rope, dslots.get(), dk->get(), dv->get(), dbt.get(), dlens.get(), out.get(),
                                        ws.get(), kEps, nullptr));
  sync_ok();
  const auto got = download_bf16(out);
  ZEST_EXPECT_CLOSE(got, ref, kTol);
  // The current tokens' k and v at their slots.
  const auto kg = at_slots(download_bf16(*dk)), vg = at_slots(download_bf16(*dv));
  ZEST_EXPECT_CLOSE(kg, kr, kTol);
  EXPECT_EQ(vg, vr);

  ASSERT_EQ(cudaMemset(ws.get(), 0xff, ws.size()), cudaSuccess);
  out.poison();
  ZEST_ASSERT_OK(decode_attention_fused(p2, dq->get(), q_stride, dqn->get(), dkn->get(), dpos.get(), c.pos_stride,
                                        c.rope, dslots.get(), dk->get(), dv->get(), dbt.get(), dlens.get(), out.get(),
                                        ws.get(), kEps, nullptr));
  sync_ok();
  const auto again = download_bf16(out);
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(again[i], got[i]) << "element " << i;
}

// decode_attention_fused picks its kernel by size; the cases reach each: the cluster merge in its compact form (batch
// 1 at one token and 1025 tokens; Hkv = 2 with M-RoPE) and its full form (1500 tokens: more than 5 pages per split),
// the bulk-copy ring (8 sequences at 4 kv heads: 32 (sequence, kv head) pairs, mixed lengths around page boundaries
// with M-RoPE, and 8 x 1025), and the page-loop kernel with the global merge (37 sequences: above 32 pairs; Hkv = 2
// at 5 sequences: 10 pairs, which the ring does not serve). Long contexts: the test after it.
TEST(CudaDecodeAttention, FusedMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(41);
  run_fused_case({1}, 4, false, rng);
  run_fused_case({1025}, 4, false, rng);
  run_fused_case({1500}, 4, false, rng);
  run_fused_case({1, 15, 16, 17, 33, 64, 300, 1025}, 4, true, rng);
  run_fused_case(std::vector<int>(8, 1025), 4, false, rng);
  std::vector<int> mixed(37);
  for (int i = 0; i < 37; ++i) mixed[i] = 1 + (i * 389) % 1100;
  run_fused_case(mixed, 4, false, rng);
  run_fused_case({129, 40}, 2, true, rng);
  run_fused_case({1, 16, 17, 300, 1025}, 2, true, rng);
}

// The cases of few sequences with long contexts, where a split holds more pages than the bulk-copy ring has stages
// (each stage refilled after its readers handed it back): one sequence of 5000 tokens with M-RoPE, and 700, 2049 and 3
// tokens over two kv-head groups (Hkv = 8). A test of its own so that compute-sanitizer's racecheck can run the ring's
// reuse of stages in its time (bench/gpu/racecheck.sh).
TEST(CudaDecodeAttention, FusedRefillsTheRingStages) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(43);
  run_fused_case({5000}, 4, true, rng);
  run_fused_case({700, 2049, 3}, 8, false, rng);
}

TEST(CudaDecodeAttention, RejectsOddHeadDim) {
  ZEST_REQUIRE_GPU();
  DecodeAttention p;
  p.batch = 1;
  p.q_heads = 8;
  p.kv_heads = 2;
  p.head_dim = 63;
  p.max_context = 16;
  p.max_blocks = 1;
  DevBuf<unsigned char> ws(4096);
  const Status s = decode_attention(p, nullptr, 0, nullptr, nullptr, nullptr, nullptr, nullptr, ws.get(), nullptr);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
}

TEST(CudaPrefillAttention, CausalVarlenGqaMatchesReference) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(26);
  check_prefill_attention({1, 70, 130, 64}, 8, 2, 0, kTol, rng);
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
