// Random router inputs of one routing test case on the host and the device: T token rows x [T, H] in [-2, 2], router
// weights w [E, H] scaled by sqrt(3 / H), a bias in [-1, 0) per expert, and the output buffers (weights, ids,
// logits, a MoE plan, the active-expert count starting at `count0`); and the router's host reference.
#pragma once
#ifdef ZEST_HAVE_CUDA
#include <cmath>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/cuda_test_util.h"

namespace zest::cuda::test {

struct RouteCase {
  HostBF16 x, w;
  std::vector<float> bias;
  std::unique_ptr<DevBuf<bf16>> dx, dw;
  DevBuf<float> dbias, dwt;
  DevBuf<int32_t> di;
  DevBuf<bf16> dl;
  DevBuf<unsigned char> buf;
  DevBuf<int64_t> count;
};

inline std::unique_ptr<RouteCase> make_route_case(int T, int E, int K, int H, std::mt19937& rng, int64_t count0) {
  auto c = std::make_unique<RouteCase>();
  c->x = random_bf16(static_cast<size_t>(T) * H, rng, -2.f, 2.f);
  const float a = std::sqrt(3.f / H);
  c->w = random_bf16(static_cast<size_t>(E) * H, rng, -a, a);
  c->bias.resize(E);
  std::uniform_real_distribution<float> bd(-1.f, 0.f);
  for (auto& b : c->bias) b = bd(rng);
  c->dx = upload_bf16(c->x);
  c->dw = upload_bf16(c->w);
  c->dbias.resize(E);
  c->dbias.upload(c->bias);
  c->dwt.resize(static_cast<size_t>(T) * K);
  c->di.resize(static_cast<size_t>(T) * K);
  c->dl.resize(static_cast<size_t>(T) * E);
  c->buf.resize(moe_plan_bytes(T, K, E));
  c->count.resize(1);
  c->count.upload(std::vector<int64_t>{count0});
  return c;
}

// Router reference on given logits [T, E]: softmax(logits + bias) in double, top-K (ties: lowest index), the K
// weights renormalised and rounded to bf16.
inline void ref_router_topk(const std::vector<float>& logits, const std::vector<float>* bias, int T, int E, int K,
                            std::vector<int32_t>& ids, std::vector<float>& w) {
  ids.assign(static_cast<size_t>(T) * K, 0);
  w.assign(ids.size(), 0.f);
  for (int t = 0; t < T; ++t) {
    std::vector<double> p(E);
    double mx = -INFINITY;
    for (int e = 0; e < E; ++e) mx = std::max(mx, p[e] = logits[t * E + e] + (bias ? (*bias)[e] : 0.f));
    for (auto& v : p) v = std::exp(v - mx);
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
    double top = 0;
    for (int k = 0; k < K; ++k) top += p[order[k]];
    for (int k = 0; k < K; ++k) {
      ids[t * K + k] = order[k];
      w[t * K + k] = round_bf16(static_cast<float>(p[order[k]] / top));
    }
  }
}

}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
