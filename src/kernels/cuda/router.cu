// MoE routing: softmax + top-k + renormalisation (one warp per token) and SERE re-routing (one CTA per layer).
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"

namespace zest::cuda {

namespace {

constexpr int kRouterWarps = 4;
constexpr int kMaxExperts = 1024;
constexpr int kMaxTopK = 16;

// One token's router by one warp: p = softmax(fp32 logits + bias) over E (scratch p: E floats, shared memory),
// top-K by p (ties: lowest index) sorted descending, weights renormalised to sum 1 and rounded to bf16 precision.
// K <= kMaxTopK.
// logit(e) gives the router logit of expert e; ids_copy (may be null) receives the ids too.
template <typename Logit>
__device__ __forceinline__ void warp_router_topk(Logit logit, const float* bias, float* p, int E, int K,
                                                 int32_t* ids, float* weights, int lane, int* ids_copy = nullptr) {
  float mx = -INFINITY;
#pragma unroll 4
  for (int e = lane; e < E; e += 32) {  // unrolled: the loads of 4 columns per lane are in flight together
    const float v = logit(e) + (bias ? bias[e] : 0.f);
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
      ids[k] = sel_i[k];
      weights[k] = bf16_round(sel_v[k] / total);
      if (ids_copy) ids_copy[k] = sel_i[k];
    }
  }
}

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
  const bf16* row = logits + static_cast<size_t>(n) * E;
  warp_router_topk([row](int e) { return __bfloat162float(row[e]); }, bias, probs_all + warp * E, E, K,
                   ids + static_cast<size_t>(n) * K, weights + static_cast<size_t>(n) * K, lane);
}

// ---- fused routing for decode batches ---------------------------------------------------------------------------
// Router GEMM + softmax/top-k/renormalisation + MoE plan in one launch, for T <= 16 tokens. The grid is one thread-
// block cluster of C CTAs; CTA r owns experts [r * E / C, (r + 1) * E / C) (at most 16 rows of the router weight).
// Before waiting on the previous kernel it bulk-copies its rows into shared memory (rows padded by 16 bytes); after
// the wait its warps split the hidden dimension (mma.m16n8k16 as in the small-M GEMM, tokens as B fragments), the
// warps' sums are reduced in fixed order and the bf16-rounded logits are stored into CTA 0's shared memory
// (distributed shared memory). After one cluster barrier CTA 0 runs the router (one warp per token, the same code as
// router_topk) and builds the plan (slot per thread, as moe_plan's decode path). No global-memory fences or counters.
constexpr int kRouteThreads = 256;
constexpr int kRouteWarps = kRouteThreads / 32;
constexpr int kRouteMaxT = 16;
constexpr int kRouteMaxE = 256;
constexpr int kRouteChunks = 8;  // 32-wide k chunks in flight per warp

struct RouteParams {
  const bf16* xn;       // [T, H]
  const bf16* w;        // [E, H]
  const float* bias;    // [E] or null
  int32_t* ids;         // [T, K]
  float* weights;       // [T, K]
  bf16* logits;         // [T, E] or null
  MoePlan plan;
  int make_plan;
  int64_t* count_sum;
  long long* clocks;  // compact kernel, when not null: CTA 0 thread 0's clock64 at 8 points (phase diagnostics)
  int T, H, E, K;
};

__global__ void __launch_bounds__(kRouteThreads, 1) moe_route_kernel(RouteParams p) {
  extern __shared__ __align__(128) unsigned char wsm[];  // [rows][H * 2 + 16]
  __shared__ __align__(8) uint64_t bar;
  __shared__ float red[kRouteWarps][8][32];
  __shared__ float logit_s[kRouteMaxT][kRouteMaxE];  // CTA 0: every logit, [token][expert]
  __shared__ float probs[kRouteWarps][kRouteMaxE];
  __shared__ int ids_s[kRouteMaxT * kMaxTopK];
  step_timeline_phase(0);
  __shared__ int scratch[kRouteWarps * kRouteMaxE];
  __shared__ int counts[kRouteMaxE], offset_of[kRouteMaxE];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int rank = static_cast<int>(cluster_rank()), C = static_cast<int>(cluster_size());
  const int rows = p.E / C, e0 = rank * rows;
  const uint32_t row_bytes = static_cast<uint32_t>(p.H) * 2, stride = row_bytes + 16;
  if (tid == 0) {
    mbar_init(&bar);
    mbar_arrive_expect_tx(&bar, rows * row_bytes);
    for (int r = 0; r < rows; ++r) bulk_load(wsm + r * stride, p.w + static_cast<size_t>(e0 + r) * p.H, row_bytes, &bar);
  }
  cluster_arrive_relaxed();  // every CTA of the cluster runs before any distributed shared-memory store
  __syncthreads();
  pdl_wait_only();
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");  // the next kernel may launch right after the wait
  const int T = p.T, chunks = p.H / 32;
  const bf16* x0p = g < T ? p.xn + static_cast<size_t>(g) * p.H + tq * 8 : nullptr;
  const bf16* x1p = g + 8 < T ? p.xn + static_cast<size_t>(g + 8) * p.H + tq * 8 : nullptr;
  const bool two = T > 8;
  const unsigned char* a_lo = g < rows ? wsm + g * stride + tq * 16 : nullptr;
  const unsigned char* a_hi = g + 8 < rows ? wsm + (g + 8) * stride + tq * 16 : nullptr;
  float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
  bool landed = false;
  for (int cb = warp; cb < chunks; cb += kRouteWarps * kRouteChunks) {
    uint4 xa[kRouteChunks], xb[kRouteChunks];
    load_token_chunks(xa, xb, x0p, x1p, cb, kRouteWarps, chunks);
    if (!landed) {
      mbar_wait(&bar, 0);
      landed = true;
    }
#pragma unroll
    for (int u = 0; u < kRouteChunks; ++u) {
      const int c = cb + u * kRouteWarps;
      if (c >= chunks) break;
      const uint4 lo = a_lo ? *reinterpret_cast<const uint4*>(a_lo + c * 64) : make_uint4(0, 0, 0, 0);
      const uint4 hi = a_hi ? *reinterpret_cast<const uint4*>(a_hi + c * 64) : make_uint4(0, 0, 0, 0);
      mma16816(acc[0], lo.x, hi.x, lo.y, hi.y, xa[u].x, xa[u].y);
      mma16816(acc[0], lo.z, hi.z, lo.w, hi.w, xa[u].z, xa[u].w);
      if (two) {
        mma16816(acc[1], lo.x, hi.x, lo.y, hi.y, xb[u].x, xb[u].y);
        mma16816(acc[1], lo.z, hi.z, lo.w, hi.w, xb[u].z, xb[u].w);
      }
    }
  }
  if (!landed) mbar_wait(&bar, 0);  // no chunk for this warp: the copy must still land before the CTA exits
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][n * 4 + i][lane] = acc[n][i];
  __syncthreads();
  cluster_wait();
  {
    const int v = tid >> 5, l = tid & 31;  // one (accumulator, lane) per thread
    const int n = v >> 2, i = v & 3;
    const int t = n * 8 + (l & 3) * 2 + (i & 1);
    const int r = (l >> 2) + (i >> 1) * 8;
    if (t < T && r < rows) {
      float s = 0.f;
#pragma unroll
      for (int ww = 0; ww < kRouteWarps; ++ww) s += red[ww][v][l];
      st_cluster_f32(cluster_map(&logit_s[t][e0 + r], 0), bf16_round(s));
    }
  }
  cluster_arrive();
  cluster_wait();
  if (rank != 0) return;
  const int E = p.E, K = p.K;
  if (p.logits)
    for (int i = tid; i < T * E; i += kRouteThreads)
      p.logits[i] = __float2bfloat16(logit_s[i / E][i % E]);
  for (int t = warp; t < T; t += kRouteWarps) {
    const float* row = logit_s[t];
    warp_router_topk([row](int e) { return row[e]; }, p.bias, probs[warp], E, K, p.ids + static_cast<size_t>(t) * K,
                     p.weights + static_cast<size_t>(t) * K, lane, ids_s + t * K);
  }
  if (!p.make_plan) return;
  __syncthreads();
  // The plan, slot per thread (T * K <= 256 slots): rank among equal ids from the warp's match mask and the counts of
  // earlier warps; the shared warp scan turns the counts into the active list, offsets and tiles.
  const int NK = T * K;
  int my_id = tid < NK ? ids_s[tid] : -1;
  if (my_id >= E) my_id = -1;
  for (int i = tid; i < kRouteWarps * E; i += kRouteThreads) scratch[i] = 0;
  const unsigned peers = __match_any_sync(0xffffffffu, my_id >= 0 ? my_id : E + lane);
  const unsigned below = peers & ((1u << lane) - 1u);
  __syncthreads();
  if (my_id >= 0 && below == 0) scratch[warp * E + my_id] = __popc(peers);
  __syncthreads();
  for (int e = tid; e < E; e += kRouteThreads) {
    int c = 0;
#pragma unroll
    for (int w = 0; w < kRouteWarps; ++w) {
      const int t = scratch[w * E + e];
      scratch[w * E + e] = c;
      c += t;
    }
    counts[e] = c;
  }
  __syncthreads();
  if (warp == 0) moe_plan_scan_warp(counts, E, p.plan, offset_of, p.count_sum);
  __syncthreads();
  if (my_id >= 0) p.plan.sorted_slots[offset_of[my_id] + scratch[warp * E + my_id] + __popc(below)] = tid;
}

// ---- fused routing, compact ------------------------------------------------------------------------------------
// moe_route_kernel's arithmetic (same logits, ids, weights and plan, bit for bit) with a shorter chain after the
// wait and less code: each CTA's logits go to CTA 0 by st.async completing bytes on an mbarrier of CTA 0 (CTA 0 waits
// for exactly T * E * 4 bytes; the other CTAs exit after their stores, no second cluster barrier); warp t of CTA 0
// runs token t's top-k with the probabilities in registers (redux max / min on order-preserving keys, lane k keeps
// the k-th choice, so the rounds are a loop and not unrolled code); the plan comes from per-expert token masks
// (shared-memory atomicOr of the top-k lanes): one warp scans (count, active, tiles) packed in one integer, and
// each slot's sorted position is its expert's offset plus the tokens below it in the mask (one token: from the
// chosen ids alone, no block barrier). kMT m16 tiles of router rows per CTA (rows <= 16 kMT), kEP experts per lane
// (E <= 32 kEP).
// The plan entries that do not depend on the routing (the ready words; with one token the offsets and tiles, 0..K,
// and the counts) are written by the threads of CTA 0 once their x loads are in flight, off the chain; with one token
// each chosen id's sorted position is counted over the K ids in shared memory (no warp reductions).
constexpr int kRoute2MaxRows = 32;

__device__ __forceinline__ void st_async_f32(uint32_t addr, float v, uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(addr),
               "r"(__float_as_uint(v)), "r"(bar)
               : "memory");
}

template <int kMT, int kEP>
__global__ void __launch_bounds__(kRouteThreads, 1) moe_route_compact_kernel(RouteParams p) {
  extern __shared__ __align__(128) unsigned char wsm[];  // [rows][H * 2 + 16]
  __shared__ __align__(8) uint64_t wbar, lbar;
  __shared__ float red[kRouteWarps][kMT * 8][32];
  __shared__ float logit_s[kRouteMaxT][kRouteMaxE];  // CTA 0: every logit, [token][expert]
  __shared__ int ids_s[kRouteMaxT * kMaxTopK];
  __shared__ unsigned tok_mask[kRouteMaxE];  // CTA 0: bit t set when token t chose the expert
  __shared__ int offset_of[kRouteMaxE];
  step_timeline_phase(0);  // the CTA is resident
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int rank = static_cast<int>(cluster_rank()), C = static_cast<int>(cluster_size());
  const int T = p.T, E = p.E, K = p.K;
  const int rows = E / C, e0 = rank * rows;
  const uint32_t row_bytes = static_cast<uint32_t>(p.H) * 2, stride = row_bytes + 16;
  const bool stamp = p.clocks && rank == 0 && tid == 0;
  if (stamp) p.clocks[0] = clock64();
  if (tid == 0) {
    mbar_init(&wbar);
    mbar_arrive_expect_tx(&wbar, rows * row_bytes);
    for (int r = 0; r < rows; ++r)
      bulk_load(wsm + r * stride, p.w + static_cast<size_t>(e0 + r) * p.H, row_bytes, &wbar);
    if (rank == 0) {
      mbar_init(&lbar);  // its one arrival now; the phase completes when all T * E logits have landed
      mbar_arrive_expect_tx(&lbar, static_cast<uint32_t>(T * E) * 4u);
    }
  }
  if (rank == 0) tok_mask[tid] = 0u;
  // The bias is a weight: loaded before the wait by the warps that run a token's top-k.
  float bias_r[kEP];
#pragma unroll
  for (int i = 0; i < kEP; ++i) {
    const int e = lane + 32 * i;
    bias_r[i] = rank == 0 && warp < T && p.bias && e < E ? __ldg(p.bias + e) : 0.f;
  }
  cluster_arrive_relaxed();  // CTA 0's mbarrier is initialised before any CTA stores into it (wait below)
  __syncthreads();
  pdl_wait();
  if (stamp) p.clocks[1] = clock64();
  // Plan entries that do not depend on the routing, written by warps 1-7 of CTA 0 once their x loads are in flight
  // (warp 0, whose top-k and plan are the chain at one token, writes none of them).
  auto early_plan = [&]() {
    if (rank != 0 || !p.make_plan || warp == 0) return;
    const int w = tid - 32;
    for (int e = w; e <= E; e += kRouteThreads - 32) p.plan.ready[e] = 0u;  // nothing ready or claimed
    if (T == 1) {
      if (w < K) {
        p.plan.offsets[w] = w;
        p.plan.tile_active[w] = w;
        p.plan.tile_start[w] = w;
      } else if (w == K) {
        p.plan.offsets[K] = K;
        *p.plan.num_active = K;
        *p.plan.num_tiles = K;
        if (p.count_sum) count_add(p.count_sum, K);
      }
    }
  };
  const int chunks = p.H / 32;
  const bf16* x0p = g < T ? p.xn + static_cast<size_t>(g) * p.H + tq * 8 : nullptr;
  const bf16* x1p = g + 8 < T ? p.xn + static_cast<size_t>(g + 8) * p.H + tq * 8 : nullptr;
  const bool two = T > 8;
  const unsigned char* a_lo[kMT];
  const unsigned char* a_hi[kMT];
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    a_lo[m] = m * 16 + g < rows ? wsm + (m * 16 + g) * stride + tq * 16 : nullptr;
    a_hi[m] = m * 16 + g + 8 < rows ? wsm + (m * 16 + g + 8) * stride + tq * 16 : nullptr;
  }
  float acc[kMT][2][4];
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[m][0][i] = acc[m][1][i] = 0.f;
  bool landed = false;
  for (int cb = warp; cb < chunks; cb += kRouteWarps * kRouteChunks) {
    uint4 xa[kRouteChunks], xb[kRouteChunks];
    load_token_chunks(xa, xb, x0p, x1p, cb, kRouteWarps, chunks);
    if (!landed) {
      early_plan();
      mbar_wait(&wbar, 0);
      landed = true;
    }
#pragma unroll
    for (int u = 0; u < kRouteChunks; ++u) {
      const int c = cb + u * kRouteWarps;
      if (c >= chunks) break;
#pragma unroll
      for (int m = 0; m < kMT; ++m) {
        const uint4 lo = a_lo[m] ? *reinterpret_cast<const uint4*>(a_lo[m] + c * 64) : make_uint4(0, 0, 0, 0);
        const uint4 hi = a_hi[m] ? *reinterpret_cast<const uint4*>(a_hi[m] + c * 64) : make_uint4(0, 0, 0, 0);
        mma16816(acc[m][0], lo.x, hi.x, lo.y, hi.y, xa[u].x, xa[u].y);
        mma16816(acc[m][0], lo.z, hi.z, lo.w, hi.w, xa[u].z, xa[u].w);
        if (two) {
          mma16816(acc[m][1], lo.x, hi.x, lo.y, hi.y, xb[u].x, xb[u].y);
          mma16816(acc[m][1], lo.z, hi.z, lo.w, hi.w, xb[u].z, xb[u].w);
        }
      }
    }
  }
  if (!landed) {  // no chunk for this warp: the copy must still land before the CTA exits
    early_plan();
    mbar_wait(&wbar, 0);
  }
  if (stamp) p.clocks[2] = clock64();
#pragma unroll
  for (int m = 0; m < kMT; ++m)
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][m * 8 + n * 4 + i][lane] = acc[m][n][i];
  __syncthreads();
  cluster_wait();
  if (stamp) p.clocks[3] = clock64();
  const uint32_t lbar0 = cluster_map(&lbar, 0);
#pragma unroll
  for (int m = 0; m < kMT; ++m) {
    const int v = tid >> 5, l = tid & 31;  // one (accumulator, lane) per thread
    const int n = v >> 2, i = v & 3;
    const int t = n * 8 + (l & 3) * 2 + (i & 1);
    const int r = m * 16 + (l >> 2) + (i >> 1) * 8;
    if (t < T && r < rows) {
      float s = 0.f;
#pragma unroll
      for (int ww = 0; ww < kRouteWarps; ++ww) s += red[ww][m * 8 + v][l];
      s = bf16_round(s);
      if (p.logits) p.logits[static_cast<size_t>(t) * E + e0 + r] = __float2bfloat16(s);
      st_async_f32(cluster_map(&logit_s[t][e0 + r], 0), s, lbar0);
    }
  }
  if (rank != 0) return;
  mbar_wait(&lbar, 0);
  if (stamp) p.clocks[4] = clock64();
  // Top-k, warp t for token t: router_topk's arithmetic (softmax in the same per-lane order and the same butterfly
  // sum, K rounds of argmax with ties to the lowest expert, weights renormalised in selection order, bf16-rounded).
  int my_i = 0;  // lane k < K: the k-th choice of the warp's (last) token
  for (int t = warp; t < T; t += kRouteWarps) {
    float pr[kEP];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < kEP; ++i) {
      const int e = lane + 32 * i;
      pr[i] = e < E ? logit_s[t][e] + bias_r[i] : -INFINITY;
      mx = fmaxf(mx, pr[i]);
    }
    mx = warp_max(mx);
    // exp(-inf) = 0 for lanes past E: adding it leaves the sum as it is (no branch per value).
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < kEP; ++i) {
      pr[i] = expf(pr[i] - mx);
      sum += pr[i];
    }
    sum = warp_sum(sum);
    const float inv = 1.f / sum;
    unsigned key[kEP];  // probability bits + 1 (order-preserving for p >= 0); 0 = taken or no expert
#pragma unroll
    for (int i = 0; i < kEP; ++i) key[i] = lane + 32 * i < E ? __float_as_uint(pr[i] * inv) + 1u : 0u;
    float total = 0.f, my_v = 0.f;
#pragma unroll 1
    for (int k = 0; k < K; ++k) {
      unsigned bk = 0u;
      int bi = 0x7fffffff;
#pragma unroll
      for (int i = 0; i < kEP; ++i)
        if (key[i] > bk) {
          bk = key[i];
          bi = lane + 32 * i;
        }
      const unsigned wk = __reduce_max_sync(0xffffffffu, bk);
      const int wi = __reduce_min_sync(0xffffffffu, bk == wk ? bi : 0x7fffffff);
      const float best = __uint_as_float(wk - 1u);
      total += best;
      if (lane == k) {
        my_v = best;
        my_i = wi;
      }
#pragma unroll
      for (int i = 0; i < kEP; ++i)
        if (lane + 32 * i == wi) key[i] = 0u;
    }
    if (lane < K) {
      p.ids[t * K + lane] = my_i;
      p.weights[t * K + lane] = bf16_round(my_v / total);
      ids_s[t * K + lane] = my_i;
      atomicOr(&tok_mask[my_i], 1u << t);
    }
  }
  if (stamp) p.clocks[5] = clock64();
  if (!p.make_plan) return;
  if (T == 1) {
    // One token: warp 0 holds the K distinct ids (lane k the k-th); an id's sorted position is the number of chosen
    // ids below it, counted over ids_s (the offsets, tiles and counts were written early). Each active expert has
    // one slot and one tile.
    if (warp != 0) return;
    if (stamp) p.clocks[6] = clock64();
    int pos = 0;
    __syncwarp();  // ids_s[0..K) written by this warp's lanes
#pragma unroll
    for (int k = 0; k < kMaxTopK; ++k)
      if (k < K) pos += ids_s[k] < my_i ? 1 : 0;
    if (lane < K) {
      p.plan.active_experts[pos] = my_i;
      p.plan.sorted_slots[pos] = lane;
    }
    if (stamp) p.clocks[7] = clock64();
    return;
  }
  __syncthreads();
  if (warp != 0) return;
  if (stamp) p.clocks[6] = clock64();
  // The plan by warp 0: lane l owns experts [l kEP, l kEP + kEP); one scan of (slots, active experts, tiles).
  unsigned msk[kEP];
  int packed = 0;
#pragma unroll
  for (int j = 0; j < kEP; ++j) {
    const int e = lane * kEP + j;
    msk[j] = e < E ? tok_mask[e] : 0u;
    const int c = __popc(msk[j]);
    packed += c + (c > 0 ? 1 << 10 : 0) + (((c + kMoeTileM - 1) / kMoeTileM) << 20);
  }
  int incl = packed;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int a = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += a;
  }
  const int excl = incl - packed;
  int off = excl & 1023, idx = (excl >> 10) & 1023, tile = excl >> 20;
#pragma unroll
  for (int j = 0; j < kEP; ++j) {
    const int e = lane * kEP + j;
    const int c = __popc(msk[j]);
    if (e < E) offset_of[e] = off;
    if (c > 0) {
      p.plan.active_experts[idx] = e;
      p.plan.offsets[idx] = off;
      const int tiles = (c + kMoeTileM - 1) / kMoeTileM;
      for (int r = 0; r < tiles; ++r) {
        p.plan.tile_active[tile + r] = idx;
        p.plan.tile_start[tile + r] = off + r * kMoeTileM;
      }
      ++idx;
      tile += tiles;
      off += c;
    }
  }
  if (lane == 31) {
    p.plan.offsets[idx] = off;
    *p.plan.num_active = idx;
    *p.plan.num_tiles = tile;
    if (p.count_sum) count_add(p.count_sum, idx);
  }
  __syncwarp();
#pragma unroll 1
  for (int s = lane; s < T * K; s += 32) {
    const int t = s / K, id = ids_s[s];
    p.plan.sorted_slots[offset_of[id] + __popc(tok_mask[id] & ((1u << t) - 1u))] = s;
  }
  step_timeline_phase(2);
  if (stamp) p.clocks[7] = clock64();
}

// Cluster size for E experts: the largest C <= 16 dividing E with at most max_rows experts per CTA (0: none).
int route_cluster(int E, int max_rows = 16) {
  for (int c : {16, 8, 4, 2, 1})
    if (E % c == 0 && E / c <= max_rows) return c;
  return 0;
}

// Dynamic shared memory: the CTA's router rows.
size_t route_smem(int E, int H, int max_rows = 16) {
  const int c = route_cluster(E, max_rows);
  return c ? static_cast<size_t>(E / c) * (static_cast<size_t>(H) * 2 + 16) : 0;
}
constexpr size_t kRouteMaxSmem = 160 * 1024;

constexpr int kSereThreads = 1024;
constexpr int kSereRows = 4;  // expert rows per warp whose first 128 similarities are loaded up front

// Four similarities sim[u, c..c+3] (one float4 load when vec; columns >= E read as -inf).
__device__ __forceinline__ float4 sere_load4(const float* __restrict__ sim, int u, int c, int E, bool vec) {
  const float* p = sim + static_cast<size_t>(u) * E + c;
  if (vec && c < E) return __ldg(reinterpret_cast<const float4*>(p));
  return make_float4(c < E ? __ldg(p) : -INFINITY, c + 1 < E ? __ldg(p + 1) : -INFINITY,
                     c + 2 < E ? __ldg(p + 2) : -INFINITY, c + 3 < E ? __ldg(p + 3) : -INFINITY);
}

// Folds sim[u, c..c+3] into a lane's running best over primary experts (strictly greater wins, so the
// lowest column keeps a tie). primary holds one byte per expert, zero past E.
__device__ __forceinline__ void sere_scan4(float4 s, int c, const unsigned char* primary, float& best, int& bv) {
  const uchar4 p = *reinterpret_cast<const uchar4*>(primary + c);
  if (p.x && s.x > best) best = s.x, bv = c;
  if (p.y && s.y > best) best = s.y, bv = c + 1;
  if (p.z && s.z > best) best = s.z, bv = c + 2;
  if (p.w && s.w > best) best = s.w, bv = c + 3;
}

// Finishes expert row u: scans its columns from 128 on, takes the warp argmax (ties: lowest v) and lets
// lane 0 write map[u].
__device__ __forceinline__ void sere_finish_row(float4 first, const float* __restrict__ sim, int u, int E, bool vec,
                                                float rho, const unsigned char* primary, int* map, int lane) {
  float best = -INFINITY;
  int bv = 0x7fffffff;
  sere_scan4(first, 4 * lane, primary, best, bv);
  for (int c = 128 + 4 * lane; c < E; c += 128) sere_scan4(sere_load4(sim, u, c, E, vec), c, primary, best, bv);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int ov = __shfl_xor_sync(0xffffffffu, bv, o);
    if (ob > best || (ob == best && ov < bv)) best = ob, bv = ov;
  }
  if (lane == 0) map[u] = (primary[u] || bv == 0x7fffffff || (rho > 0.f && best < rho)) ? u : bv;
}

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

// One CTA of kSereThreads. Every global load that does not depend on P is issued first (the similarity rows
// before pdl_wait: sim is a weight no kernel writes), so their latencies overlap: thread t holds token t's
// ids/weights, warp w the first 128 similarities of rows w + r * 32 (r < kSereRows). Three barriers: P cleared,
// P marked, map built. K <= kK.
template <int kK>
__global__ void __launch_bounds__(kSereThreads) sere_reroute_kernel(int32_t* __restrict__ ids,
                                                                    float* __restrict__ weights,
                                                                    const float* __restrict__ sim, int N, int E, int K,
                                                                    int S, float rho, bool vec) {
  __shared__ __align__(16) unsigned char primary[kMaxExperts];
  __shared__ int map[kMaxExperts];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int kWarps = kSereThreads / 32;
  float4 first[kSereRows];
#pragma unroll
  for (int r = 0; r < kSereRows; ++r) {
    const int u = warp + r * kWarps;
    first[r] = u < E ? sere_load4(sim, u, 4 * lane, E, vec) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  pdl_wait();
  const bool own = tid < N;
  int id[kK];
  float w[kK];
  if (own) sere_load_token(ids, weights, tid, K, id, w);
  for (int i = tid; i < kMaxExperts / 4; i += kSereThreads) reinterpret_cast<unsigned*>(primary)[i] = 0u;
  __syncthreads();
  if (own)
#pragma unroll
    for (int k = 0; k < kK; ++k)
      if (k < S && id[k] >= 0 && id[k] < E) primary[id[k]] = 1;
  for (int n = tid + kSereThreads; n < N; n += kSereThreads)
    for (int k = 0; k < S; ++k) {
      const int v = ids[static_cast<size_t>(n) * K + k];
      if (v >= 0 && v < E) primary[v] = 1;
    }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kSereRows; ++r) {
    const int u = warp + r * kWarps;
    if (u < E) sere_finish_row(first[r], sim, u, E, vec, rho, primary, map, lane);
  }
  for (int u = warp + kSereRows * kWarps; u < E; u += kWarps)
    sere_finish_row(sere_load4(sim, u, 4 * lane, E, vec), sim, u, E, vec, rho, primary, map, lane);
  __syncthreads();
  if (own) {
    sere_fold(id, w, K, S, E, map);
    sere_store_token(ids, weights, tid, K, id, w);
  }
  for (int n = tid + kSereThreads; n < N; n += kSereThreads) {
    sere_load_token(ids, weights, n, K, id, w);
    sere_fold(id, w, K, S, E, map);
    sere_store_token(ids, weights, n, K, id, w);
  }
}

// Per-CTA map kernel for E <= 128 (above, sere_reroute_kernel: one CTA for any E): 256 threads; thread t owns half
// (t & 1) of expert row u = t >> 1 of the similarity matrix, 64 floats held in registers, loaded before pdl_wait (sim
// is a weight). After the wait each thread loads its own token (16-byte loads when K % 4 == 0); with one CTA
// (N <= 256) the primary set P comes from those registers, else each CTA also reads all tokens' primaries; P is a
// 128-bit mask OR-reduced per warp (__reduce_or_sync) and over the warps (one barrier); every CTA builds the whole
// map (one more barrier) and folds its 256 tokens. (Every warp reading all 512 primaries itself, without the first
// barrier, measured 7.9 us at N = 256 against 5.6.)
constexpr int kSereFastThreads = 256;
constexpr int kSereFastMaxE = 128;

template <int kK>
__global__ void __launch_bounds__(kSereFastThreads) sere_reroute_fast_kernel(int32_t* __restrict__ ids,
                                                                             float* __restrict__ weights,
                                                                             const float* __restrict__ sim, int N,
                                                                             int E, int K, int S, float rho, bool vec,
                                                                             bool vec_tok) {
  __shared__ int map[kSereFastMaxE];
  __shared__ unsigned warp_mask[kSereFastThreads / 32][kSereFastMaxE / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int u = tid >> 1, half = tid & 1;
  // Columns 4 * (2 i + half) .. + 3 of row u, i < 16 (pairs of threads read adjacent 16-byte pieces).
  float4 row[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int c = 4 * (2 * i + half);
    row[i] = u < E ? sere_load4(sim, u, c, E, vec) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
  }
  pdl_wait();
  const int n_own = blockIdx.x * kSereFastThreads + tid;
  const bool own = n_own < N;
  int id[kK];
  float w[kK];
  if (own) {
    if (vec_tok) {  // K % 4 == 0, rows 16-byte aligned
#pragma unroll
      for (int k = 0; k < kK; k += 4)
        if (k < K) {
          const int4 iv = __ldg(reinterpret_cast<const int4*>(ids + static_cast<size_t>(n_own) * K + k));
          const float4 wv = __ldg(reinterpret_cast<const float4*>(weights + static_cast<size_t>(n_own) * K + k));
          id[k] = iv.x, id[k + 1] = iv.y, id[k + 2] = iv.z, id[k + 3] = iv.w;
          w[k] = wv.x, w[k + 1] = wv.y, w[k + 2] = wv.z, w[k + 3] = wv.w;
        }
    } else {
      sere_load_token(ids, weights, n_own, K, id, w);
    }
  }
  // P: a 128-bit mask, built per thread without branches, OR-reduced per warp, then over the warps (one barrier).
  unsigned m0 = 0, m1 = 0, m2 = 0, m3 = 0;
  auto mark = [&](int v) {
    const unsigned bit = v >= 0 && v < E ? 1u << (v & 31) : 0u;
    const int word = v >> 5;
    m0 |= word == 0 ? bit : 0u;
    m1 |= word == 1 ? bit : 0u;
    m2 |= word == 2 ? bit : 0u;
    m3 |= word == 3 ? bit : 0u;
  };
  if (gridDim.x == 1) {  // every token is one thread's own: its primaries are already in registers
    if (own)
#pragma unroll
      for (int k = 0; k < kK; ++k)
        if (k < S) mark(id[k]);
  } else {
    for (int n = tid; n < N; n += kSereFastThreads)
      for (int k = 0; k < S; ++k) mark(__ldg(ids + static_cast<size_t>(n) * K + k));
  }
  m0 = __reduce_or_sync(0xffffffffu, m0);
  m1 = __reduce_or_sync(0xffffffffu, m1);
  m2 = __reduce_or_sync(0xffffffffu, m2);
  m3 = __reduce_or_sync(0xffffffffu, m3);
  if (lane == 0) {
    warp_mask[warp][0] = m0;
    warp_mask[warp][1] = m1;
    warp_mask[warp][2] = m2;
    warp_mask[warp][3] = m3;
  }
  __syncthreads();
  unsigned P[4] = {0u, 0u, 0u, 0u};  // indexed by constants only (stays in registers)
#pragma unroll
  for (int wi = 0; wi < kSereFastThreads / 32; ++wi)
#pragma unroll
    for (int q = 0; q < 4; ++q) P[q] |= warp_mask[wi][q];
  auto p_word = [&](int word) { return word == 0 ? P[0] : word == 1 ? P[1] : word == 2 ? P[2] : P[3]; };
  // Masked argmax over this thread's 64 columns in ascending order (strictly greater wins: lowest column on ties).
  float best = -INFINITY;
  int bv = 0x7fffffff;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int c = 4 * (2 * i + half);  // c >> 5 == i >> 2 for both halves
    const unsigned bits = (P[i >> 2] >> (c & 31)) & 0xfu;
    if ((bits & 1u) && row[i].x > best) best = row[i].x, bv = c;
    if ((bits & 2u) && row[i].y > best) best = row[i].y, bv = c + 1;
    if ((bits & 4u) && row[i].z > best) best = row[i].z, bv = c + 2;
    if ((bits & 8u) && row[i].w > best) best = row[i].w, bv = c + 3;
  }
  {  // the other half of the row (ties: lowest column)
    const float ob = __shfl_xor_sync(0xffffffffu, best, 1);
    const int ov = __shfl_xor_sync(0xffffffffu, bv, 1);
    if (ob > best || (ob == best && ov < bv)) best = ob, bv = ov;
  }
  if (half == 0 && u < E) {
    const bool primary = (p_word(u >> 5) >> (u & 31)) & 1u;
    map[u] = (primary || bv == 0x7fffffff || (rho > 0.f && best < rho)) ? u : bv;
  }
  __syncthreads();
  if (own) {
    sere_fold(id, w, K, S, E, map);
    if (vec_tok) {
#pragma unroll
      for (int k = 0; k < kK; k += 4)
        if (k < K) {
          *reinterpret_cast<int4*>(ids + static_cast<size_t>(n_own) * K + k) =
              make_int4(id[k], id[k + 1], id[k + 2], id[k + 3]);
          *reinterpret_cast<float4*>(weights + static_cast<size_t>(n_own) * K + k) =
              make_float4(w[k], w[k + 1], w[k + 2], w[k + 3]);
        }
    } else {
      sere_store_token(ids, weights, n_own, K, id, w);
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

bool moe_route_ok(int T, int H, int E, int K) {
  if (T < 1 || T > kRouteMaxT || E < 1 || E > kRouteMaxE || K < 1 || K > kMaxTopK || K > E || H < 32 || H % 32 != 0 ||
      route_cluster(E) == 0 || route_smem(E, H) > kRouteMaxSmem)
    return false;
  // whether a cluster of the largest size can be scheduled at all (checked once per GPU)
  return once_per_device<bool>([] {
    bool usable = false;
    const void* fn = reinterpret_cast<const void*>(moe_route_kernel);
    if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kRouteMaxSmem)) ==
            cudaSuccess &&
        cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess &&
        max_active_clusters(moe_route_kernel, 16, 16, dim3(kRouteThreads), kRouteMaxSmem) > 0)
      usable = true;
    cudaGetLastError();
    return usable;
  });
}

namespace {

// moe_route_compact_kernel in clusters of at most 16 CTAs (at most 32 experts per CTA; measured faster than the
// cluster kernel, and than clusters of at most 8 or 4 CTAs); a size whose rows do not fit takes clusters of at most 16
// rows per CTA. A single-CTA split (odd E <= 16) takes moe_route_kernel: st.async into shared::cluster needs a cluster
// of at least two CTAs (the same results).
Status launch_route(RouteParams p, cudaStream_t stream) {
  int max_rows = kRoute2MaxRows;
  if (route_cluster(p.E, max_rows) == 0 || route_smem(p.E, p.H, max_rows) > kRouteMaxSmem) max_rows = 16;
  int C = route_cluster(p.E, max_rows);
  bool compact = true;
  if (C < 2) {
    compact = false;
    max_rows = 16;
    C = route_cluster(p.E, max_rows);
  }
  void (*kernel)(RouteParams) = moe_route_kernel;
  if (compact) {
    const int mt2 = p.E / C > 16 ? 1 : 0, ep8 = p.E > 128 ? 1 : 0;
    kernel = mt2 ? (ep8 ? moe_route_compact_kernel<2, 8> : moe_route_compact_kernel<2, 4>)
                 : (ep8 ? moe_route_compact_kernel<1, 8> : moe_route_compact_kernel<1, 4>);
    // the four forms' attributes, once per GPU
    const cudaError_t set = once_per_device<cudaError_t>([] {
      for (auto k : {moe_route_compact_kernel<1, 4>, moe_route_compact_kernel<1, 8>, moe_route_compact_kernel<2, 4>,
                     moe_route_compact_kernel<2, 8>}) {
        const void* fn = reinterpret_cast<const void*>(k);
        cudaError_t e = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(kRouteMaxSmem));
        if (e == cudaSuccess) e = cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
        if (e != cudaSuccess) return e;
      }
      return cudaSuccess;
    });
    ZEST_RETURN_IF_ERROR(cuda_status(set, "moe_route"));
  }
  return launch_cluster("moe_route", kernel, dim3(C), dim3(kRouteThreads), route_smem(p.E, p.H, max_rows), stream, C,
                        p);
}

Status route_params(RouteParams& p, const bf16* router_w, const float* bias, int32_t* ids, float* weights,
                    bf16* logits, MoePlan* plan, int64_t* active_count_sum, int T, int H, int E, int K) {
  if (!moe_route_ok(T, H, E, K))
    return invalid_argument("moe_route: need 1 <= T <= 16, E <= 256 split into at most 16 rows per CTA, K <= min(16, E), "
                            "H a multiple of 32 and a schedulable 16-CTA cluster (T=" + std::to_string(T) + " H=" +
                            std::to_string(H) + " E=" + std::to_string(E) + " K=" + std::to_string(K) + ")");
  if (plan && (T > plan->max_tokens || K != plan->top_k || E != plan->experts))
    return invalid_argument("moe_route: the plan was bound for other sizes");
  if (!router_w || !ids || !weights) return invalid_argument("moe_route: null pointer");
  p.w = router_w;
  p.bias = bias;
  p.ids = ids;
  p.weights = weights;
  p.logits = logits;
  if (plan) p.plan = *plan;
  p.make_plan = plan ? 1 : 0;
  p.count_sum = active_count_sum;
  p.T = T;
  p.H = H;
  p.E = E;
  p.K = K;
  return Status::ok();
}

}  // namespace

Status moe_route(const bf16* xn, const bf16* router_w, const float* bias, int32_t* ids, float* weights, bf16* logits,
                 MoePlan* plan, int64_t* active_count_sum, int T, int H, int E, int K, cudaStream_t stream) {
  RouteParams p{};
  ZEST_RETURN_IF_ERROR(route_params(p, router_w, bias, ids, weights, logits, plan, active_count_sum, T, H, E, K));
  if (!xn) return invalid_argument("moe_route: null pointer");
  p.xn = xn;
  return launch_route(p, stream);
}

// moe_route with the compact kernel's phase clocks (clocks: 8 values on the device; moe_route_kernel, for a single-CTA
// split, records none): for tests that print where one launch's time goes. Not declared in kernels.h.
Status moe_route_phase_clocks(const bf16* xn, const bf16* router_w, const float* bias, int32_t* ids, float* weights,
                              bf16* logits, MoePlan* plan, int64_t* active_count_sum, int T, int H, int E, int K,
                              long long* clocks, cudaStream_t stream) {
  if (!clocks) return invalid_argument("moe_route_phase_clocks: clocks is null");
  RouteParams p{};
  ZEST_RETURN_IF_ERROR(route_params(p, router_w, bias, ids, weights, logits, plan, active_count_sum, T, H, E, K));
  if (!xn) return invalid_argument("moe_route: null pointer");
  p.xn = xn;
  p.clocks = clocks;
  return launch_route(p, stream);
}

Status sere_reroute(int32_t* ids, float* weights, const float* sim, int N, int E, int K, int S, float rho,
                    cudaStream_t stream) {
  if (S <= 0 || S >= K) return Status::ok();
  if (N <= 0 || E <= 0 || E > kMaxExperts || K > kMaxTopK)
    return invalid_argument("sere_reroute: need N > 0, 0 < E <= 1024 and K <= 16 (N=" + std::to_string(N) +
                            " E=" + std::to_string(E) + " K=" + std::to_string(K) + ")");
  if (!sim) return invalid_argument("sere_reroute: the similarity matrix is null");
  const bool vec = E % 4 == 0 && reinterpret_cast<uintptr_t>(sim) % 16 == 0;
  if (E <= kSereFastMaxE) {
    const bool vec_tok =
        K % 4 == 0 && (reinterpret_cast<uintptr_t>(ids) | reinterpret_cast<uintptr_t>(weights)) % 16 == 0;
    const dim3 grid((N + kSereFastThreads - 1) / kSereFastThreads);
    if (K <= 8)
      return launch("sere_reroute", sere_reroute_fast_kernel<8>, grid, dim3(kSereFastThreads), 0, stream, ids, weights,
                    sim, N, E, K, S, rho, vec, vec_tok);
    return launch("sere_reroute", sere_reroute_fast_kernel<kMaxTopK>, grid, dim3(kSereFastThreads), 0, stream, ids,
                  weights, sim, N, E, K, S, rho, vec, vec_tok);
  }
  if (K <= 8)
    return launch("sere_reroute", sere_reroute_kernel<8>, dim3(1), dim3(kSereThreads), 0, stream, ids, weights, sim, N,
                  E, K, S, rho, vec);
  return launch("sere_reroute", sere_reroute_kernel<kMaxTopK>, dim3(1), dim3(kSereThreads), 0, stream, ids, weights,
                sim, N, E, K, S, rho, vec);
}

}  // namespace zest::cuda
