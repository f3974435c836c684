// Causal GQA prefill attention of packed sequences `lens` over a [T, (Hq + 2 Hkv) * 128 + pad] qkv buffer of fresh
// random bf16 values, through prefill_attention, checked against an f64 softmax per (token, head): max abs err <=
// tol * max |ref|.
#pragma once
#ifdef ZEST_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cuda/cuda_test_util.h"

namespace zest::cuda::test {

inline void check_prefill_attention(const std::vector<int>& lens, int Hq, int Hkv, int pad, double tol,
                                    std::mt19937& rng) {
  SCOPED_TRACE(testing::Message() << "Hq=" << Hq << " Hkv=" << Hkv << " pad=" << pad << " seqs=" << lens.size()
                                  << " first len=" << lens[0]);
  const int D = 128, row = (Hq + 2 * Hkv) * D + pad;
  std::vector<int32_t> cu = {0};
  for (int l : lens) cu.push_back(cu.back() + l);
  const int T = cu.back(), max_len = *std::max_element(lens.begin(), lens.end());
  auto qkv = random_bf16(static_cast<size_t>(T) * row, rng, -2.f, 2.f);
  auto dqkv = upload_bf16(qkv);
  DevBuf<int32_t> dcu(cu);
  DevBuf<bf16> out(static_cast<size_t>(T) * Hq * D);
  out.poison();
  const float scale = 1.f / std::sqrt(128.f);
  const bf16* base = dqkv->get();
  const bf16* k = base + Hq * D;
  const bf16* v = base + (Hq + Hkv) * D;
  const int nseq = static_cast<int>(lens.size());
  ZEST_ASSERT_OK(
      prefill_attention(base, row, k, v, row, dcu.get(), nseq, max_len, out.get(), Hq, Hkv, D, scale, nullptr));
  sync_ok();
  const auto got = download_bf16(out);
  std::vector<float> ref(got.size());
  std::vector<double> p, acc(D);
  for (size_t sq = 0; sq < lens.size(); ++sq)
    for (int i = 0; i < lens[sq]; ++i)
      for (int h = 0; h < Hq; ++h) {
        const int t = cu[sq] + i, kvh = h / (Hq / Hkv);
        const float* qr = &qkv.f[static_cast<size_t>(t) * row + h * D];
        p.assign(i + 1, 0.0);
        double mx = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          const float* kr = &qkv.f[static_cast<size_t>(cu[sq] + j) * row + (Hq + kvh) * D];
          double d = 0;
          for (int c = 0; c < D; ++c) d += static_cast<double>(qr[c]) * kr[c];
          p[j] = d * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (auto& x : p) sum += (x = std::exp(x - mx));
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int j = 0; j <= i; ++j) {
          const float* vr = &qkv.f[static_cast<size_t>(cu[sq] + j) * row + (Hq + Hkv + kvh) * D];
          for (int c = 0; c < D; ++c) acc[c] += p[j] * vr[c];
        }
        float* o = &ref[(static_cast<size_t>(t) * Hq + h) * D];
        for (int c = 0; c < D; ++c) o[c] = static_cast<float>(acc[c] / sum);
      }
  ZEST_EXPECT_CLOSE(got, ref, tol);
}

}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
