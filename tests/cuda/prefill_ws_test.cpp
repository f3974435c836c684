// The persistent warp-specialised prefill attention kernel (TMA producer, mbarrier ring, two consumer warpgroups;
// prefill_attention takes it when max_seqlen > 256 and nseq * 128 <= max_seqlen) and the streaming q/k norm + RoPE +
// KV-write kernel against plain host loops on fresh random inputs.
#ifdef ZEST_HAVE_CUDA
#include <numeric>

#include "cuda/cuda_test_util.h"
#include "cuda/prefill_attention_check.h"

namespace zest::cuda::test {
namespace {

// Attention outputs are bf16 and P is rounded to bf16 before the PV GEMM: max abs err <= 2e-2 * max |ref|.
constexpr double kAttnTol = 2e-2;

// Causal GQA attention of the packed sequences `lens` against an f64 softmax per (token, head)
// (prefill_attention_check.h).
void attention_case(const std::vector<int>& lens, int Hq, int Hkv, int pad, std::mt19937& rng) {
  check_prefill_attention(lens, Hq, Hkv, pad, kAttnTol, rng);
}

TEST(CudaPrefillWs, VarlenOddLengthsAndLengthOne) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(9001);
  // Lengths around the 64-row halves and 128-row tiles, a single token packed with them, each with one sequence long
  // enough for the persistent kernel.
  attention_case({1, 17, 63, 65, 700}, 4, 2, 0, rng);
  attention_case({1, 300}, 2, 1, 0, rng);
  attention_case({129, 256, 7, 520}, 3, 3, 8, rng);  // no grouping, row stride padded by 8 elements
}

TEST(CudaPrefillWs, WholeTilesOnlyTakeTheTmaPath) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(9002);
  attention_case({128, 384, 256}, 4, 1, 0, rng);  // every tile whole: no cp.async fallback
}

TEST(CudaPrefillWs, LongSequencesGqa8WrapTheRing) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(9003);
  // 8 query heads per kv head; 1100 tokens = 9 key tiles (the 2-stage ring wraps several times), packed with a
  // sequence that ends 1 row into a tile.
  attention_case({1100, 129}, 8, 1, 0, rng);
}

TEST(CudaPrefillWs, PersistentCtasTakeManyItems) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(9005);
  // 32 heads x 5 query tiles x 3 sequences = 480 items, more than the CTAs (one per SM): the K/V ring and the Q/O
  // tiles carry over from item to item, partial and whole tiles alternate.
  attention_case({600, 250, 5}, 32, 4, 0, rng);
}

TEST(CudaPrefillWs, LongSingleSequence) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(9004);
  attention_case({2000}, 2, 1, 0, rng);
}

TEST(CudaPrefillWs, RejectsBadShapes) {
  ZEST_REQUIRE_GPU();
  DevBuf<bf16> buf(4096);
  DevBuf<int32_t> cu(std::vector<int32_t>{0, 4});
  const bf16* p = buf.get();
  EXPECT_EQ(prefill_attention(p, 1024, p, p, 1024, cu.get(), 1, 4, buf.get(), 6, 4, 128, 0.1f, nullptr).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(prefill_attention(p, 1020, p, p, 1020, cu.get(), 1, 4, buf.get(), 4, 2, 128, 0.1f, nullptr).code(),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(prefill_attention(p + 1, 1024, p, p, 1024, cu.get(), 1, 4, buf.get(), 4, 2, 128, 0.1f, nullptr).code(),
            ErrorCode::kInvalidArgument);
}

// ---- q/k norm + RoPE + KV write ------------------------------------------------------------------------------

constexpr float kEps = 1e-6f;
// q/k outputs are bf16 (the reference rounds where the kernel rounds: normalised value, times weight, cos, sin):
// max abs err <= 1e-2 * max |ref|; the v rows are copies (exact).
constexpr double kRopeTol = 1e-2;

struct RopeShape {
  int T, Hq, Hkv, D;
  bool mrope, with_slots;
};

void rope_case(const RopeShape& c, std::mt19937& rng) {
  SCOPED_TRACE(testing::Message() << "T=" << c.T << " Hq=" << c.Hq << " Hkv=" << c.Hkv << " D=" << c.D
                                  << " mrope=" << c.mrope << " slots=" << c.with_slots);
  const int heads = c.Hq + 2 * c.Hkv, row = heads * c.D;
  const int num_blocks = (c.T + 2 * kKvBlock - 1) / kKvBlock + 1;
  auto qkv = random_bf16(static_cast<size_t>(c.T) * row, rng, -2.f, 2.f);
  auto qn = random_bf16(c.D, rng, 0.5f, 1.5f), kn = random_bf16(c.D, rng, 0.5f, 1.5f);
  std::uniform_int_distribution<int> pd(0, 9000);
  std::vector<int32_t> pos(3 * c.T);
  for (auto& p : pos) p = pd(rng);
  // Distinct slots in a shuffled order, every 7th token skipped (-1).
  std::vector<int32_t> perm(num_blocks * kKvBlock);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> slots(c.T);
  for (int t = 0; t < c.T; ++t) slots[t] = t % 7 == 3 ? -1 : perm[t];
  RopeParams rope;
  rope.theta = 1e6f;
  if (c.mrope) rope.section_h = rope.section_w = 20;
  const int pos_stride = c.mrope ? c.T : 0;

  auto dqkv = upload_bf16(qkv), dqn = upload_bf16(qn), dkn = upload_bf16(kn);
  DevBuf<int32_t> dpos(pos), dslots(slots);
  const size_t cache_elems = static_cast<size_t>(num_blocks) * kKvBlock * c.Hkv * c.D;
  DevBuf<bf16> kc(cache_elems), vc(cache_elems);
  kc.poison();
  vc.poison();
  ZEST_ASSERT_OK(qk_norm_rope_kv(dqkv->get(), dqn->get(), dkn->get(), dpos.get(), pos_stride, rope,
                                 c.with_slots ? dslots.get() : nullptr, kc.get(), vc.get(), c.T, c.Hq, c.Hkv, c.D, kEps,
                                 nullptr));
  sync_ok();

  std::vector<float> ref = qkv.f;
  const int half = c.D / 2;
  std::vector<float> n(c.D);
  for (int t = 0; t < c.T; ++t)
    for (int h = 0; h < c.Hq + c.Hkv; ++h) {
      float* x = &ref[static_cast<size_t>(t) * row + h * c.D];
      const std::vector<float>& w = h < c.Hq ? qn.f : kn.f;
      double ss = 0;
      for (int d = 0; d < c.D; ++d) ss += static_cast<double>(x[d]) * x[d];
      const float inv = static_cast<float>(1.0 / std::sqrt(ss / c.D + kEps));
      for (int d = 0; d < c.D; ++d) n[d] = round_bf16(round_bf16(x[d] * inv) * w[d]);
      for (int j = 0; j < half; ++j) {
        int axis = 0;
        if (c.mrope && j % 3 == 1 && j < 60) axis = 1;
        if (c.mrope && j % 3 == 2 && j < 60) axis = 2;
        const double p = pos[(c.mrope ? axis * c.T : 0) + t];
        const double ang = p / std::pow(1e6, 2.0 * j / c.D);
        const float cs = round_bf16(static_cast<float>(std::cos(ang)));
        const float sn = round_bf16(static_cast<float>(std::sin(ang)));
        x[j] = n[j] * cs - n[j + half] * sn;
        x[j + half] = n[j + half] * cs + n[j] * sn;
      }
    }
  ZEST_EXPECT_CLOSE(download_bf16(*dqkv), ref, kRopeTol);
  if (!c.with_slots) return;
  const auto kgot = download_bf16(kc), vgot = download_bf16(vc);
  std::vector<float> kref, kg, vref, vg;
  std::vector<bool> used(num_blocks * kKvBlock, false);
  for (int t = 0; t < c.T; ++t) {
    if (slots[t] < 0) continue;
    used[slots[t]] = true;
    for (int h = 0; h < c.Hkv; ++h)
      for (int d = 0; d < c.D; ++d) {
        const size_t dst = (static_cast<size_t>(slots[t]) * c.Hkv + h) * c.D + d;
        kref.push_back(ref[static_cast<size_t>(t) * row + (c.Hq + h) * c.D + d]);
        kg.push_back(kgot[dst]);
        vref.push_back(qkv.f[static_cast<size_t>(t) * row + (c.Hq + c.Hkv + h) * c.D + d]);
        vg.push_back(vgot[dst]);
      }
  }
  ZEST_EXPECT_CLOSE(kg, kref, kRopeTol);
  ZEST_EXPECT_CLOSE(vg, vref, 0.0);
  // Slots no token maps to keep their poison.
  for (size_t s = 0; s < used.size(); ++s)
    if (!used[s]) {
      EXPECT_TRUE(std::isnan(kgot[s * c.Hkv * c.D])) << "slot " << s;
      EXPECT_TRUE(std::isnan(vgot[s * c.Hkv * c.D + c.D - 1])) << "slot " << s;
    }
}

TEST(CudaRopeStream, DecodeSizes) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(9101);
  for (int T : {1, 3, 64}) rope_case({T, 32, 4, 128, false, true}, rng);
  rope_case({5, 4, 2, 128, true, true}, rng);
  rope_case({2, 6, 3, 128, false, false}, rng);  // no cache write
}

TEST(CudaRopeStream, PrefillSizes) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(9102);
  rope_case({256, 32, 4, 128, false, true}, rng);
  rope_case({1001, 32, 4, 128, true, true}, rng);  // T % 4 != 0: the last CTA has one token
  rope_case({777, 3, 1, 128, false, true}, rng);   // 5 heads: rows of a CTA span tokens unevenly
  rope_case({300, 32, 4, 128, false, false}, rng);  // no cache write
}

TEST(CudaRopeStream, OtherHeadDimTakesThePerWarpKernel) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(9103);
  rope_case({300, 6, 3, 64, true, true}, rng);
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
