// The MoE prefill experts (moe_experts_prefill: the warp-specialised persistent grouped GEMMs, TMA + cp.async producer
// warpgroup, mbarrier ring, two wgmma consumer warpgroups; the wgmma kernel for widths off their tiles) against a
// plain f64 host reference and against moe_experts_prefill_wmma on fresh random data: routing with odd slot counts
// per expert, empty experts, empty slots (id -1), one expert that every token picks, T = 1, 17, 333 and 4096, model
// widths and widths off the kernels' tiles; and the down kernel storing bf16 slots against its fp32 slots, value for
// value.
#ifdef ZEST_HAVE_CUDA
#include <numeric>

#include "cuda/cuda_test_util.h"
#include "cuda/moe_decode_case.h"

namespace zest::cuda::test {
namespace {

// slot outputs: max abs err <= 2e-2 * max |ref| (g, u and h are rounded to bf16 before the next product, so a
// one-ulp difference in a bf16 rounding of the reference moves an output by up to ~1% of its magnitude).
constexpr double kTol = 2e-2;

// Uniform values in [lo, hi) rounded to bf16, from a xorshift64* stream seeded by `rng` (fast enough for the
// weights of many experts at model widths).
HostBF16 fast_random_bf16(size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  uint64_t s = (static_cast<uint64_t>(rng()) << 32 | rng()) ^ 0x9E3779B97F4A7C15ull;
  HostBF16 h;
  h.bits.resize(n);
  h.f.resize(n);
  for (size_t i = 0; i < n; ++i) {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    const float u = static_cast<float>((s * 0x2545F4914F6CDD1Dull) >> 40) * (1.f / 16777216.f);
    h.bits[i] = f32_to_bf16(lo + (hi - lo) * u);
    h.f[i] = bf16_to_f32(h.bits[i]);
  }
  return h;
}

struct Case {
  int N, K, E, H, I;
  int used_experts;  // slots pick among experts [0, used_experts); the rest have no slots
  int all_expert;    // >= 0: slot 0 of every token is this expert
  int checked;       // tokens checked against the host reference (spread over [0, N)); all when >= N
};

// Random routing: K distinct experts per token, weights positive and summing to ~1 (bf16-rounded); every 11th
// token's last slot is empty (id -1, weight 0).
void make_routing(const Case& c, std::mt19937& rng, std::vector<int32_t>& ids, std::vector<float>& w) {
  ids.assign(static_cast<size_t>(c.N) * c.K, -1);
  w.assign(ids.size(), 0.f);
  std::uniform_int_distribution<int> pick(0, c.used_experts - 1);
  std::uniform_real_distribution<float> d(0.05f, 1.f);
  for (int n = 0; n < c.N; ++n) {
    int32_t* row = &ids[static_cast<size_t>(n) * c.K];
    float sum = 0;
    for (int k = 0; k < c.K; ++k) {
      int e = (k == 0 && c.all_expert >= 0) ? c.all_expert : pick(rng);
      while (std::find(row, row + k, e) != row + k) e = pick(rng);
      row[k] = e;
      w[static_cast<size_t>(n) * c.K + k] = d(rng);
      sum += w[static_cast<size_t>(n) * c.K + k];
    }
    for (int k = 0; k < c.K; ++k) w[static_cast<size_t>(n) * c.K + k] = round_bf16(w[static_cast<size_t>(n) * c.K + k] / sum);
    if (n % 11 == 5 && c.K > 1) {
      row[c.K - 1] = -1;
      w[static_cast<size_t>(n) * c.K + c.K - 1] = 0.f;
    }
  }
}

// Runs moe_experts_prefill_wmma and moe_experts_prefill on the same data and plan; checks the latter against the host
// reference on the checked tokens and against the wmma kernels on every slot.
void run_case(const Case& c, std::mt19937& rng) {
  SCOPED_TRACE(testing::Message() << "N=" << c.N << " K=" << c.K << " E=" << c.E << " H=" << c.H << " I=" << c.I
                                  << " used experts " << c.used_experts << " all-token expert " << c.all_expert);
  std::vector<int32_t> ids;
  std::vector<float> w;
  make_routing(c, rng, ids, w);
  auto x = fast_random_bf16(static_cast<size_t>(c.N) * c.H, rng);
  const float ag = std::sqrt(3.f / c.H), ad = std::sqrt(3.f / c.I);
  auto gu = fast_random_bf16(static_cast<size_t>(c.E) * 2 * c.I * c.H, rng, -ag, ag);
  auto dn = fast_random_bf16(static_cast<size_t>(c.E) * c.H * c.I, rng, -ad, ad);
  auto dx = upload_bf16(x), dgu = upload_bf16(gu), ddn = upload_bf16(dn);
  const size_t slots = static_cast<size_t>(c.N) * c.K;
  DevBuf<int32_t> di(ids);
  DevBuf<float> dw(w), out(slots * c.H);
  DevBuf<bf16> h(slots * c.I);
  DevBuf<unsigned char> buf(moe_plan_bytes(c.N, c.K, c.E));
  MoePlan plan;
  moe_plan_bind(plan, buf.get(), c.N, c.K, c.E);
  ZEST_ASSERT_OK(moe_plan_prefill(di.get(), c.N, c.K, c.E, plan, nullptr, nullptr));
  auto run = [&](bool wmma) {
    out.poison();
    h.poison();
    const Status s = wmma ? moe_experts_prefill_wmma(dx->get(), plan, dw.get(), dgu->get(), ddn->get(), h.get(),
                                                     out.get(), c.N, c.K, c.E, c.H, c.I, nullptr)
                          : moe_experts_prefill(dx->get(), plan, dw.get(), dgu->get(), ddn->get(), h.get(), out.get(),
                                                c.N, c.K, c.E, c.H, c.I, nullptr);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return out.download();
  };
  const std::vector<float> wmma_all = run(true);

  // Host reference for the checked tokens.
  std::vector<int> tokens;
  if (c.checked >= c.N) {
    tokens.resize(c.N);
    std::iota(tokens.begin(), tokens.end(), 0);
  } else {
    std::uniform_int_distribution<int> pick(0, c.N - 1);
    tokens = {0, c.N - 1};
    while (static_cast<int>(tokens.size()) < c.checked) tokens.push_back(pick(rng));
  }
  std::vector<float> ref;
  std::vector<size_t> ref_at;  // flat index into the slot outputs of each reference value
  for (int n : tokens)
    for (int k = 0; k < c.K; ++k) {
      const size_t slot = static_cast<size_t>(n) * c.K + k;
      if (ids[slot] < 0) continue;
      const auto row = ref_expert(&x.f[static_cast<size_t>(n) * c.H], gu, dn, ids[slot], c.H, c.I, w[slot]);
      ref.insert(ref.end(), row.begin(), row.end());
      for (int r = 0; r < c.H; ++r) ref_at.push_back(slot * c.H + r);
    }

  const std::vector<float> f32 = run(false);  // h now holds moe_experts_prefill's gate/up output
  {
    std::vector<float> got(ref.size());
    for (size_t i = 0; i < ref.size(); ++i) got[i] = f32[ref_at[i]];
    ZEST_EXPECT_CLOSE(got, ref, kTol);
    // Every written slot against the wmma kernels (themselves checked against the reference in prefill_kernels_test),
    // same tolerance; empty slots stay unwritten (NaN poison).
    double err = 0, mx = 0;
    int unwritten_empty = 0, empty = 0;
    for (size_t s = 0; s < slots; ++s) {
      if (ids[s] < 0) {
        ++empty;
        unwritten_empty += std::isnan(f32[s * c.H]) ? 1 : 0;
        continue;
      }
      for (size_t i = s * c.H; i < (s + 1) * c.H; ++i) {
        err = std::max(err, std::isnan(f32[i]) ? INFINITY : std::fabs(static_cast<double>(f32[i]) - wmma_all[i]));
        mx = std::max(mx, std::fabs(static_cast<double>(wmma_all[i])));
      }
    }
    EXPECT_GT(mx, 0.0);
    EXPECT_LE(err, kTol * mx) << "against the wmma kernels: max err " << err << " max |out| " << mx;
    EXPECT_EQ(unwritten_empty, empty) << "an empty slot was written";
  }

  // The bf16 slots (the decoders' prefill experts where moe_prefill_bf16_slots allows): every written value equals the
  // fp32 one exactly (both hold bf16(bf16(C) * w)); empty slots stay unwritten. Sizes the kernel does not take are
  // refused with an error, as moe_prefill_bf16_slots says.
  {
    SCOPED_TRACE("bf16 slots");
    DevBuf<bf16> ob(slots * c.H);
    ob.poison();
    const bool takes = moe_prefill_bf16_slots(h.get(), ddn->get(), c.E, c.H, c.I);
    const Status s =
        moe_prefill_down(h.get(), plan, dw.get(), ddn->get(), ob.get(), c.N, c.K, c.E, c.H, c.I, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(s.is_ok(), takes) << s.to_string();
    if (takes) {
      const std::vector<float> got = download_bf16(ob);
      size_t differ = 0, unwritten_empty = 0, empty = 0, compared = 0;
      for (size_t sl = 0; sl < slots; ++sl) {
        if (ids[sl] < 0) {
          ++empty;
          unwritten_empty += std::isnan(got[sl * c.H]) ? 1 : 0;
          continue;
        }
        for (size_t i = sl * c.H; i < (sl + 1) * c.H; ++i, ++compared)
          differ += (got[i] == f32[i] && !std::isnan(f32[i])) ? 0 : 1;
      }
      EXPECT_GT(compared, 0u);
      EXPECT_EQ(differ, 0u) << "of " << compared << " slot values";
      EXPECT_EQ(unwritten_empty, empty) << "an empty slot was written";
    }
  }
}

TEST(CudaMoePrefillWs, ModelWidthsFewTokens) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(901);
  run_case({1, 8, 16, 2048, 768, 12, -1, 1}, rng);    // one token: 8 experts of one row
  run_case({17, 8, 16, 2048, 768, 12, -1, 17}, rng);  // odd counts, experts 12..15 empty
}

TEST(CudaMoePrefillWs, ModelWidths4096TokensOneExpertEverywhere) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(902);
  // Expert 7 in every token's first slot (4096 rows: 32 row tiles), the other slots over experts 0..11 (odd
  // counts, ~2600 rows each), experts 12..15 empty; 16 tokens against the reference, all slots against the wmma
  // kernels.
  run_case({4096, 8, 16, 2048, 768, 12, 7, 16}, rng);
}

TEST(CudaMoePrefillWs, SmallWidthsAllSlots) {
  ZEST_REQUIRE_GPU();
  std::mt19937 rng(903);
  run_case({333, 2, 8, 256, 128, 6, 0, 333}, rng);   // expert 0: 333 rows (last tile 77), 6 and 7 empty
  run_case({77, 2, 8, 384, 192, 8, -1, 77}, rng);    // widths off the warp-specialised tiles (runs the wgmma kernel)
  run_case({130, 4, 16, 512, 256, 5, -1, 130}, rng);  // K = 4 over 5 experts: ~100 rows each
}

}  // namespace
}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
