// Device-side bodies of the MoE routing steps, shared by their own kernels and by the fused decode routing
// kernel (moe_route_plan): router softmax + top-k for one token (one warp), SERE re-routing and the expert
// plan (one CTA each, any multiple of 32 threads).
#pragma once
#include "kernels/cuda/common.cuh"

namespace zest::cuda {

constexpr int kRouteMaxExperts = 1024;
constexpr int kRouteMaxTopK = 16;

// One warp: p = softmax(logits row + bias), top-K (ties: lowest index) renormalised to sum 1, rounded to bf16
// precision, written to ids[0..K) and weights[0..K). p is an E-float scratch row in shared memory.
__device__ __forceinline__ void route_token_warp(const bf16* __restrict__ row, const float* __restrict__ bias,
                                                 float* p, int E, int K, int32_t* __restrict__ ids,
                                                 float* __restrict__ weights) {
  const int lane = threadIdx.x & 31;
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
  float sel_v[kRouteMaxTopK];
  int sel_i[kRouteMaxTopK];
  float total = 0.f;
#pragma unroll
  for (int k = 0; k < kRouteMaxTopK; ++k) {
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
    for (int k = 0; k < kRouteMaxTopK; ++k) {
      if (k >= K) break;
      ids[k] = sel_i[k];
      weights[k] = bf16_round(sel_v[k] / total);
    }
  }
}

// One CTA: SERE re-routing of ids/weights [N, K] in place (see sere_reroute in kernels.h).
__device__ __forceinline__ void sere_reroute_block(int32_t* __restrict__ ids, float* __restrict__ weights,
                                                   const float* __restrict__ sim, int N, int E, int K, int S,
                                                   float rho) {
  __shared__ int primary[kRouteMaxExperts];
  __shared__ int map[kRouteMaxExperts];
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
    int id[kRouteMaxTopK];
    float w[kRouteMaxTopK];
#pragma unroll
    for (int k = 0; k < kRouteMaxTopK; ++k) {
      if (k < K) {
        id[k] = ti[k];
        w[k] = tw[k];
        if (k >= S && id[k] >= 0 && id[k] < E) id[k] = map[id[k]];
      }
    }
#pragma unroll
    for (int k = 1; k < kRouteMaxTopK; ++k) {
      if (k >= K || id[k] < 0) continue;
#pragma unroll
      for (int j = 0; j < kRouteMaxTopK; ++j) {
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
    for (int k = 0; k < kRouteMaxTopK; ++k) {
      if (k < K) {
        ti[k] = id[k];
        tw[k] = w[k];
      }
    }
  }
}

// One CTA: the expert plan of ids [NK] (see moe_plan in kernels.h); adds the active count to
// *active_count_sum when it is not null. ids are read with plain loads: the fused kernel writes them itself.
__device__ __forceinline__ void moe_plan_block(const int32_t* ids, int NK, int E, const MoePlan& plan,
                                               int64_t* active_count_sum) {
  __shared__ int counts[kRouteMaxExperts];
  __shared__ int act_index[kRouteMaxExperts];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  for (int e = warp; e < E; e += nwarps) {
    int c = 0;
    for (int base = 0; base < NK; base += 32) {
      const int i = base + lane;
      const int id = i < NK ? ids[i] : -1;
      c += __popc(__ballot_sync(0xffffffffu, id == e));
    }
    if (lane == 0) counts[e] = c;
  }
  __syncthreads();
  if (warp == 0) {  // warp-parallel scans: active list, offsets and prefill tiles
    int na = 0, off = 0, nt = 0;
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int e = e0 + lane;
      const int c = e < E ? counts[e] : 0;
      const int tiles = (c + kMoeTileM - 1) / kMoeTileM;
      const unsigned act = __ballot_sync(0xffffffffu, c > 0);
      int cs = c, ts = tiles;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int a = __shfl_up_sync(0xffffffffu, cs, o), b = __shfl_up_sync(0xffffffffu, ts, o);
        if (lane >= o) {
          cs += a;
          ts += b;
        }
      }
      const int idx = na + __popc(act & ((1u << lane) - 1));
      const int my_off = off + cs - c, my_tile = nt + ts - tiles;
      if (e < E) act_index[e] = c > 0 ? idx : -1;
      if (c > 0) {
        plan.active_experts[idx] = e;
        plan.offsets[idx] = my_off;
        for (int r = 0; r < tiles; ++r) {
          plan.tile_active[my_tile + r] = idx;
          plan.tile_start[my_tile + r] = my_off + r * kMoeTileM;
        }
      }
      na += __popc(act);
      off += __shfl_sync(0xffffffffu, cs, 31);
      nt += __shfl_sync(0xffffffffu, ts, 31);
    }
    if (lane == 0) {
      plan.offsets[na] = off;
      *plan.num_active = na;
      *plan.num_tiles = nt;
      if (active_count_sum) *active_count_sum += na;
    }
  }
  __syncthreads();
  for (int e = warp; e < E; e += nwarps) {
    if (counts[e] == 0) continue;
    int pos = plan.offsets[act_index[e]];
    for (int base = 0; base < NK; base += 32) {
      const int i = base + lane;
      const int id = i < NK ? ids[i] : -1;
      const unsigned m = __ballot_sync(0xffffffffu, id == e);
      if (id == e) plan.sorted_slots[pos + __popc(m & ((1u << lane) - 1))] = i;
      pos += __popc(m);
    }
  }
}

}  // namespace zest::cuda
