// Device pieces of MoE routing shared by the standalone kernels (router.cu, moe.cu) and the fused router epilogue
// of the small-M GEMM (rows_mma.cu): the SERE per-token fold, and one-CTA SERE re-routing and plan building for a
// few tokens. Each piece repeats the standalone kernel's arithmetic, so fused and separate launches agree bit for bit.
#pragma once
#include "kernels/cuda/common.cuh"

namespace zest::cuda {

// Rewrites one token's slots k >= S through map and folds duplicates into their first slot.
template <int kK>
__device__ __forceinline__ void sere_fold(int (&id)[kK], float (&w)[kK], int K, int S, int E, const int* map) {
#pragma unroll
  for (int k = 0; k < kK; ++k)
    if (k < K && k >= S && id[k] >= 0 && id[k] < E) id[k] = map[id[k]];
#pragma unroll
  for (int k = 1; k < kK; ++k) {
    if (k >= K || id[k] < 0) continue;
    bool done = false;
#pragma unroll
    for (int j = 0; j < k; ++j)
      if (!done && id[j] == id[k]) {
        w[j] += w[k];
        w[k] = 0.f;
        id[k] = -1;
        done = true;
      }
  }
}

template <int kK>
__device__ __forceinline__ void sere_load_token(const int32_t* ids, const float* weights, int n, int K, int (&id)[kK],
                                                float (&w)[kK]) {
#pragma unroll
  for (int k = 0; k < kK; ++k)
    if (k < K) {
      id[k] = ids[static_cast<size_t>(n) * K + k];
      w[k] = weights[static_cast<size_t>(n) * K + k];
    }
}

template <int kK>
__device__ __forceinline__ void sere_store_token(int32_t* ids, float* weights, int n, int K, const int (&id)[kK],
                                                 const float (&w)[kK]) {
#pragma unroll
  for (int k = 0; k < kK; ++k)
    if (k < K) {
      ids[static_cast<size_t>(n) * K + k] = id[k];
      weights[static_cast<size_t>(n) * K + k] = w[k];
    }
}

constexpr int kRouteCtaThreads = 256;  // the fused epilogue's CTA
constexpr int kRouteMaxE = 256;        // experts of the fused router epilogue (SERE: kRouteSereMaxE)
constexpr int kRouteSereMaxE = 128;
constexpr int kRouteMaxNK = 256;       // token slots of the fused plan (one per thread)

// Shared memory of cta_sere_small + cta_moe_plan.
struct RouteSmem {
  unsigned primary[kRouteMaxE / 32];
  int map[kRouteMaxE];
  int warp_counts[kRouteCtaThreads / 32][kRouteMaxE];  // per warp, then exclusive prefix over warps
  int counts[kRouteMaxE];
  int act_index[kRouteMaxE];
  int offset[kRouteMaxE];
};

// SERE re-routing of N <= kRouteCtaThreads tokens by one CTA of kRouteCtaThreads threads (E <= kRouteSereMaxE, K <= 16,
// 0 < S < K), with sere_reroute's semantics: P = primaries of all tokens, map[u] = argmax over P of sim[u, :]
// (ties: lowest) unless u in P or (rho > 0 and the best < rho), then the fold. ids/weights were written by this
// CTA (visible after the caller's barrier). Warp w owns rows w, w + 8, ...; its similarities are loaded together.
__device__ __forceinline__ void cta_sere_small(int32_t* ids, float* weights, const float* __restrict__ sim, int N, int E,
                                               int K, int S, float rho, RouteSmem& sm) {
  constexpr int kWarps = kRouteCtaThreads / 32;
  constexpr int kRows = kRouteSereMaxE / kWarps;  // 16
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float sv[kRows][kRouteSereMaxE / 32];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int u = warp + r * kWarps;
#pragma unroll
    for (int j = 0; j < kRouteSereMaxE / 32; ++j) {
      const int c = lane + 32 * j;
      sv[r][j] = u < E && c < E ? __ldg(sim + static_cast<size_t>(u) * E + c) : -INFINITY;
    }
  }
  if (tid < kRouteSereMaxE / 32) sm.primary[tid] = 0u;
  __syncthreads();
  for (int i = tid; i < N * S; i += kRouteCtaThreads) {
    const int v = ids[static_cast<size_t>(i / S) * K + i % S];
    if (v >= 0 && v < E) atomicOr(&sm.primary[v >> 5], 1u << (v & 31));
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int u = warp + r * kWarps;
    float best = -INFINITY;
    int bv = 0x7fffffff;
#pragma unroll
    for (int j = 0; j < kRouteSereMaxE / 32; ++j) {
      const int c = lane + 32 * j;
      if (c < E && ((sm.primary[c >> 5] >> (c & 31)) & 1u) && sv[r][j] > best) best = sv[r][j], bv = c;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int ov = __shfl_xor_sync(0xffffffffu, bv, o);
      if (ob > best || (ob == best && ov < bv)) best = ob, bv = ov;
    }
    if (lane == 0 && u < E) {
      const bool prim = (sm.primary[u >> 5] >> (u & 31)) & 1u;
      sm.map[u] = (prim || bv == 0x7fffffff || (rho > 0.f && best < rho)) ? u : bv;
    }
  }
  __syncthreads();
  if (tid < N) {
    int id[kRouterMaxTopK];
    float w[kRouterMaxTopK];
    sere_load_token(ids, weights, tid, K, id, w);
    sere_fold(id, w, K, S, E, sm.map);
    sere_store_token(ids, weights, tid, K, id, w);
  }
  __syncthreads();
}

// The MoE plan (moe_plan's result: active experts ascending, offsets, slots sorted by expert then slot, prefill
// tiles, active count added to *count_sum) of NK <= kRouteMaxNK slot ids (written by this CTA; < 0 skipped) by one
// CTA of kRouteCtaThreads threads, E <= kRouteMaxE. Slot i is thread i; its rank among equal ids comes from the
// warp's match mask plus the counts of the earlier warps.
__device__ __forceinline__ void cta_moe_plan(const int32_t* ids, int NK, int E, MoePlan plan, int64_t* count_sum,
                                             RouteSmem& sm) {
  constexpr int kWarps = kRouteCtaThreads / 32;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int i = tid; i < kWarps * kRouteMaxE; i += kRouteCtaThreads) (&sm.warp_counts[0][0])[i] = 0;
  __syncthreads();
  const int id = tid < NK ? ids[tid] : -1;
  const bool valid = id >= 0 && id < E;
  const unsigned peers = __match_any_sync(0xffffffffu, valid ? id : E + lane);
  const unsigned before = peers & ((1u << lane) - 1u);
  if (valid && before == 0) sm.warp_counts[warp][id] = __popc(peers);
  __syncthreads();
  for (int e = tid; e < E; e += kRouteCtaThreads) {
    int c = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int t = sm.warp_counts[w][e];
      sm.warp_counts[w][e] = c;
      c += t;
    }
    sm.counts[e] = c;
  }
  __syncthreads();
  if (warp == 0) {  // the scans of moe_plan_kernel: active list, offsets and prefill tiles
    int na = 0, off = 0, nt = 0;
    for (int e0 = 0; e0 < E; e0 += 32) {
      const int e = e0 + lane;
      const int c = e < E ? sm.counts[e] : 0;
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
      if (e < E) {
        sm.act_index[e] = c > 0 ? idx : -1;
        sm.offset[e] = my_off;
      }
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
      if (count_sum) *count_sum += na;
    }
  }
  __syncthreads();
  if (valid) plan.sorted_slots[sm.offset[id] + sm.warp_counts[warp][id] + __popc(before)] = tid;
}

}  // namespace zest::cuda
