// MoE routing: softmax + top-k + renormalisation (one warp per token) and SERE re-routing (one CTA per layer).
#include "kernels/cuda/common.cuh"

namespace zest::cuda {

namespace {

constexpr int kRouterWarps = 4;
constexpr int kMaxExperts = 1024;
constexpr int kMaxTopK = 16;

__global__ void __launch_bounds__(kRouterWarps * 32) router_topk_kernel(const bf16* __restrict__ logits,
                                                                        const float* __restrict__ bias,
                                                                        int32_t* __restrict__ ids,
                                                                        float* __restrict__ weights, int N, int E,
                                                                        int K) {
  pdl_wait();
  extern __shared__ float probs_all[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n = blockIdx.x * kRouterWarps + warp;
  if (n >= N) return;
  float* p = probs_all + warp * E;
  const bf16* row = logits + static_cast<size_t>(n) * E;
  float mx = -INFINITY;
  for (int e = lane; e < E; e += 32) {
    const float v = __bfloat162float(row[e]) + (bias ? bias[e] : 0.f);
    p[e] = v;
    mx = fmaxf(mx, v);
  }
  mx = warp_max(mx);
  float sum = 0.f;
  for (int e = lane; e < E; e += 32) {
    const float v = expf(p[e] - mx);
    p[e] = v;
    sum += v;
  }
  sum = warp_sum(sum);
  const float inv = 1.f / sum;
  for (int e = lane; e < E; e += 32) p[e] *= inv;
  __syncwarp();
  // K rounds of warp argmax (ties: lowest index); chosen entries are marked -1.
  float sel_v[kMaxTopK];
  int sel_i[kMaxTopK];
  float total = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxTopK; ++k) {
    if (k >= K) break;
    float best = -1.f;
    int bi = 0x7fffffff;
    for (int e = lane; e < E; e += 32) {
      const float v = p[e];
      if (v > best) {
        best = v;
        bi = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > best || (ov == best && oi < bi)) {
        best = ov;
        bi = oi;
      }
    }
    sel_v[k] = best;
    sel_i[k] = bi;
    total += best;
    __syncwarp();
    if (lane == 0) p[bi] = -1.f;
    __syncwarp();
  }
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < kMaxTopK; ++k) {
      if (k >= K) break;
      ids[static_cast<size_t>(n) * K + k] = sel_i[k];
      weights[static_cast<size_t>(n) * K + k] = bf16_round(sel_v[k] / total);
    }
  }
}

__global__ void __launch_bounds__(1024) sere_reroute_kernel(int32_t* __restrict__ ids, float* __restrict__ weights,
                                                            const float* __restrict__ sim, int N, int E, int K,
                                                            int S, float rho) {
  pdl_wait();
  __shared__ int primary[kMaxExperts];
  __shared__ int map[kMaxExperts];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int e = threadIdx.x; e < E; e += blockDim.x) primary[e] = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < N * S; i += blockDim.x) {
    const int id = ids[(i / S) * K + i % S];
    if (id >= 0 && id < E) primary[id] = 1;
  }
  __syncthreads();
  // A warp per expert row u (4 rows per pass, their loads issued together): best primary v by similarity
  // (ties: lowest v).
  for (int ub = warp; ub < E; ub += nwarps * 4) {
    float best[4];
    int bv[4];
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      best[r] = -INFINITY;
      bv[r] = 0x7fffffff;
    }
    for (int v0 = 0; v0 < E; v0 += 128) {
      float sv[4][4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int u = ub + r * nwarps;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int v = v0 + q * 32 + lane;
          sv[r][q] = u < E && v < E ? __ldg(sim + static_cast<size_t>(u) * E + v) : -INFINITY;
        }
      }
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int v = v0 + q * 32 + lane;
          if (v < E && primary[v] && sv[r][q] > best[r]) {
            best[r] = sv[r][q];
            bv[r] = v;
          }
        }
    }
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int u = ub + r * nwarps;
      float b = best[r];
      int bi = bv[r];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, b, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > b || (ov == b && oi < bi)) {
          b = ov;
          bi = oi;
        }
      }
      if (lane == 0 && u < E)
        map[u] = (primary[u] || bi == 0x7fffffff || (rho > 0.f && b < rho)) ? u : bi;
    }
  }
  __syncthreads();
  for (int n = threadIdx.x; n < N; n += blockDim.x) {
    int32_t* ti = ids + static_cast<size_t>(n) * K;
    float* tw = weights + static_cast<size_t>(n) * K;
    int id[kMaxTopK];
    float w[kMaxTopK];
#pragma unroll
    for (int k = 0; k < kMaxTopK; ++k) {
      if (k < K) {
        id[k] = ti[k];
        w[k] = tw[k];
        if (k >= S && id[k] >= 0 && id[k] < E) id[k] = map[id[k]];
      }
    }
#pragma unroll
    for (int k = 1; k < kMaxTopK; ++k) {
      if (k >= K || id[k] < 0) continue;
#pragma unroll
      for (int j = 0; j < kMaxTopK; ++j) {
        if (j >= k) break;
        if (id[j] == id[k]) {
          w[j] += w[k];
          w[k] = 0.f;
          id[k] = -1;
          break;
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kMaxTopK; ++k) {
      if (k < K) {
        ti[k] = id[k];
        tw[k] = w[k];
      }
    }
  }
}

}  // namespace

Status router_topk(const bf16* logits, const float* bias, int32_t* ids, float* weights, int N, int E, int K,
                   cudaStream_t stream) {
  if (N <= 0 || E <= 0 || E > kMaxExperts || K <= 0 || K > kMaxTopK || K > E)
    return invalid_argument("router_topk: need N > 0, 0 < E <= 1024 and 0 < K <= min(16, E) (N=" + std::to_string(N) +
                            " E=" + std::to_string(E) + " K=" + std::to_string(K) + ")");
  const size_t smem = static_cast<size_t>(kRouterWarps) * E * sizeof(float);
  return launch("router_topk", router_topk_kernel, dim3((N + kRouterWarps - 1) / kRouterWarps),
                dim3(kRouterWarps * 32), smem, stream, logits, bias, ids, weights, N, E, K);
}

Status sere_reroute(int32_t* ids, float* weights, const float* sim, int N, int E, int K, int S, float rho,
                    cudaStream_t stream) {
  if (S <= 0 || S >= K) return Status::ok();
  if (N <= 0 || E <= 0 || E > kMaxExperts || K > kMaxTopK)
    return invalid_argument("sere_reroute: need N > 0, 0 < E <= 1024 and K <= 16 (N=" + std::to_string(N) +
                            " E=" + std::to_string(E) + " K=" + std::to_string(K) + ")");
  if (!sim) return invalid_argument("sere_reroute: the similarity matrix is null");
  return launch("sere_reroute", sere_reroute_kernel, dim3(1), dim3(1024), 0, stream, ids, weights, sim, N, E, K, S,
                rho);
}

}  // namespace zest::cuda
