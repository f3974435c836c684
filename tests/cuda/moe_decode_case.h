// A decode-experts test case shared by the one-token and streaming experts tests: a random routing of N tokens over
// K of E experts (optionally a pool of experts, one hot expert, SERE-folded holes, repeated ids) and the host
// reference of one (token, slot) through gate/up, SiLU * up and down, rounded to bf16 where the kernels round.
#pragma once
#ifdef ZEST_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/cuda_test_util.h"

namespace zest::cuda::test {

struct MoeCase {
  int N, K, E, H, I;
  int pool;          // experts that receive tokens (0 = all E)
  int hot;           // >= 0: every token's first slot goes to this expert
  int holes;         // slots set to -1 (SERE-folded), spread over the batch
  bool dup = false;  // every slot of a token names its first slot's expert (ids not distinct)
};

struct Routing {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

inline Routing make_routing(const MoeCase& c, std::mt19937& rng) {
  Routing r;
  r.ids.resize(static_cast<size_t>(c.N) * c.K);
  r.w.resize(r.ids.size());
  std::uniform_real_distribution<float> d(0.05f, 1.f);
  const int pool = c.pool > 0 ? c.pool : c.E;
  for (int n = 0; n < c.N; ++n) {
    std::vector<int> all(pool);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    if (c.hot >= 0) std::iter_swap(all.begin(), std::find(all.begin(), all.end(), c.hot));
    float s = 0;
    std::vector<float> ws(c.K);
    for (auto& v : ws) s += (v = d(rng));
    for (int k = 0; k < c.K; ++k) {
      r.ids[n * c.K + k] = c.dup ? all[0] : all[k];
      r.w[n * c.K + k] = round_bf16(ws[k] / s);
    }
  }
  for (int i = 0; i < c.holes; ++i) {
    const size_t slot = (static_cast<size_t>(i) * 7919 + 3) % r.ids.size();
    r.ids[slot] = -1;
    r.w[slot] = 0.f;
  }
  return r;
}

// Host reference of one token row xr [H] through expert e (gate_up [E, 2I, H], down [E, H, I]) times its routing
// weight w: H values, with h and the outputs rounded to bf16 where the kernels round.
inline std::vector<float> ref_expert(const float* xr, const HostBF16& gu, const HostBF16& dn, int e, int H, int I,
                                     float w) {
  std::vector<float> hv(I), out(H);
  for (int i = 0; i < I; ++i) {
    double g = 0, u = 0;
    const float* wg = &gu.f[(static_cast<size_t>(e) * 2 * I + i) * H];
    const float* wu = wg + static_cast<size_t>(I) * H;
    for (int j = 0; j < H; ++j) {
      g += static_cast<double>(xr[j]) * wg[j];
      u += static_cast<double>(xr[j]) * wu[j];
    }
    const float gb = round_bf16(static_cast<float>(g)), ub = round_bf16(static_cast<float>(u));
    hv[i] = round_bf16(round_bf16(gb / (1.f + std::exp(-gb))) * ub);
  }
  for (int r = 0; r < H; ++r) {
    double y = 0;
    const float* wd = &dn.f[(static_cast<size_t>(e) * H + r) * I];
    for (int i = 0; i < I; ++i) y += static_cast<double>(hv[i]) * wd[i];
    out[r] = round_bf16(static_cast<float>(y)) * w;
  }
  return out;
}

// Host reference of slot (n, k): its slot_out row of H values (x [N, H]).
inline std::vector<float> ref_slot(const MoeCase& c, const HostBF16& x, const HostBF16& gu, const HostBF16& dn,
                                   const Routing& route, int n, int k) {
  return ref_expert(&x.f[static_cast<size_t>(n) * c.H], gu, dn, route.ids[n * c.K + k], c.H, c.I,
                    route.w[n * c.K + k]);
}

}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
