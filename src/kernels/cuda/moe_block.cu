// The MoE half of a decode layer as one cooperative persistent launch (see moe_block.h). The arithmetic of every
// phase is that of the kernels it replaces (norm_kernel, moe_route_kernel, rows_mma_kernel, the combine): the same
// per-thread chunks, mma k order, warp split of k and fixed-order cross-warp sums, so the results are the chain's bits.
#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_block.h"

namespace zest::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxT = 8;
constexpr int kMaxE = 256;
constexpr int kMaxK = 16;
constexpr int kMaxP = 4;        // experts per down buffer
constexpr int kMaxH = kThreads * 8;
constexpr int kMaxI = 1024;
constexpr int kDownChunks = kMaxI / 32 / kWarps;  // down k chunks per warp at most
constexpr int kGuRound = kMaxH / 32 / kWarps;  // gate/up k chunks per warp (all of an item's)
constexpr int kRouterRows = 8;  // experts per router CTA
constexpr int kMaxStages = 4;   // gate/up ring stages at most
constexpr int kMaxKC = 1024;    // columns per gate/up stage at most
constexpr int kRows = 16;       // weight rows per gate/up item and per down group

struct BlockParams {
  bf16* x;
  const bf16* o;
  const bf16* post_norm;
  const bf16* router_w;
  const float* bias;
  const bf16* gate_up;
  const bf16* down;
  const bf16* next_norm;
  bf16* xn;
  int32_t* ids;
  float* weights;
  bf16* logits;
  int64_t* count_sum;
  unsigned long long* sync;  // [0] launch epoch, [1..3] barrier counters
  float* logit_ws;           // [T, E]
  bf16* h;                   // [T * K, I] by sorted position
  int T, H, E, K, I;
  int P;  // experts per down buffer
  int R;  // router CTAs
  int NS, KC;  // gate/up ring stages; columns of H per stage (H / KC stages per item)
  uint32_t off_w, off_red, off_sval;
  float eps;
};

// Two k16 steps over one 32-wide chunk (rows g and g + 8 of A, tokens 0-7 of B).
__device__ __forceinline__ void mma_chunk(float* c, const uint4& lo, const uint4& hi, const uint4& x) {
  mma16816(c, lo.x, hi.x, lo.y, hi.y, x.x, x.y);
  mma16816(c, lo.z, hi.z, lo.w, hi.w, x.z, x.w);
}

__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long ld_relaxed(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void st_relaxed(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ void red_release_add(unsigned long long* p, unsigned long long v) {
  asm volatile("red.release.gpu.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Grid barrier on a counter that only grows: each generation adds exactly 2^32 (the leader adds 2^32 - (A - 1), the
// other A - 1 arriving CTAs 1 each), so generation `epoch` is complete when the counter reaches (epoch + 1) << 32.
// CTAs that do not arrive may wait; CTAs that do not wait only arrive. A wait that never ends traps (a bug).
__device__ __forceinline__ void grid_barrier(unsigned long long* ctr, unsigned long long epoch, bool arrive,
                                             bool leader, int A, bool wait) {
  __syncthreads();
  if (threadIdx.x == 0) {
    if (arrive) {
      __threadfence();
      red_release_add(ctr, leader ? (1ull << 32) - static_cast<unsigned long long>(A - 1) : 1ull);
    }
    if (wait) {
      const unsigned long long target = (epoch + 1) << 32;
      if (ld_acquire(ctr) < target) {
        const uint64_t t0 = global_ns();
        while (ld_acquire(ctr) < target)
          if (global_ns() - t0 > kWatchdogNs) __trap();
      }
      __threadfence();
    }
  }
  __syncthreads();
}

// Sum over the CTA of one value per thread, in norm_kernel's block_sum order (every warp gets the total).
__device__ __forceinline__ float cta_sum(float v, float* red8) {
  v = warp_sum(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red8[warp] = v;
  __syncthreads();
  float t = lane < kWarps ? red8[lane] : 0.f;
  t = warp_sum(t);
  __syncthreads();
  return t;
}

// Order-preserving map of floats to unsigned keys and back.
__device__ __forceinline__ unsigned float_key(float f) {
  const unsigned u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_float(unsigned k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// One token's router by one warp from fp32 logits (8 per lane in registers): the arithmetic of warp_router_topk
// (softmax in the same per-lane order, K rounds of warp argmax with ties to the lowest index, weights renormalised
// and rounded to bf16). Lane 0 writes ids / weights.
__device__ __forceinline__ void warp_topk(const float* logit, const float* bias, int E, int K, int* ids, float* wts,
                                          int lane) {
  float p[kMaxE / 32];
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kMaxE / 32; ++i) {
    const int e = lane + 32 * i;
    if (e < E) {
      p[i] = __ldcg(logit + e) + (bias ? bias[e] : 0.f);
      mx = fmaxf(mx, p[i]);
    }
  }
  // The warp maximum through redux on order-preserving keys (the same value as the butterfly of fmaxf).
  mx = key_float(__reduce_max_sync(0xffffffffu, float_key(mx)));
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < kMaxE / 32; ++i) {
    const int e = lane + 32 * i;
    if (e < E) {
      p[i] = expf(p[i] - mx);
      sum += p[i];
    }
  }
  sum = warp_sum(sum);
  const float inv = 1.f / sum;
  // Probabilities as keys: bits + 1 (order-preserving for p >= 0), 0 for taken or missing experts.
  unsigned key[kMaxE / 32];
#pragma unroll
  for (int i = 0; i < kMaxE / 32; ++i) {
    const int e = lane + 32 * i;
    key[i] = e < E ? __float_as_uint(p[i] * inv) + 1u : 0u;
  }
  float sel_v[kMaxK];
  int sel_i[kMaxK];
  float total = 0.f;
  // K rounds: the largest probability, ties to the lowest expert (a lane's own entries ascending, then the lowest
  // lane index among the lanes holding the warp maximum): warp_router_topk's choice.
#pragma unroll
  for (int k = 0; k < kMaxK; ++k) {
    if (k >= K) break;
    unsigned bk = 0u;
    int bi = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < kMaxE / 32; ++i)
      if (key[i] > bk) {
        bk = key[i];
        bi = lane + 32 * i;
      }
    const unsigned wk = __reduce_max_sync(0xffffffffu, bk);
    const int wi = __reduce_min_sync(0xffffffffu, bk == wk ? bi : 0x7fffffff);
    const float best = __uint_as_float(wk - 1u);
    sel_v[k] = best;
    sel_i[k] = wi;
    total += best;
#pragma unroll
    for (int i = 0; i < kMaxE / 32; ++i)
      if (lane + 32 * i == wi) key[i] = 0u;
  }
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < kMaxK; ++k) {
      if (k >= K) break;
      ids[k] = sel_i[k];
      wts[k] = bf16_round(sel_v[k] / total);
    }
  }
}

// kMode 0: gate/up weights through register loads; 1: through the bulk-copy ring.
// The h rows of one gate/up item from the warps' partial sums rr [warp][8 values][lane] (values 0-3 gate, 4-7 up):
// thread tid < 128 sums value v = tid / 32 of lane l = tid % 32 over the warps in fixed order and stores
// bf16(SiLU(gate) * up) of token beg + t (t = 2 (l % 4) + v % 2 < nt), row r0 + l / 4 + 8 (v / 2), into h [tokens][I].
__device__ __forceinline__ void store_gate_up_h(const float* rr, int tid, int r0, int nt, int beg, int I, bf16* h) {
  const int v = tid >> 5, l = tid & 31;
  const int t = (l & 3) * 2 + (v & 1), row = r0 + (l >> 2) + (v >> 1) * 8;
  if (t < nt) {
    float sg = 0.f, su = 0.f;
#pragma unroll
    for (int ww = 0; ww < kWarps; ++ww) {
      sg += rr[(ww * 8 + v) * 32 + l];
      su += rr[(ww * 8 + 4 + v) * 32 + l];
    }
    const float gt = bf16_round(sg), up = bf16_round(su);
    const float sl = bf16_round(gt / (1.f + __expf(-gt)));
    h[static_cast<size_t>(beg + t) * I + row] = __float2bfloat16(sl * up);
  }
}

template <int kMode>
__global__ void __launch_bounds__(kThreads, 1) moe_block_kernel(BlockParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t rbar, dbar[2], full[kMaxStages];
  __shared__ float red8[kMaxT][kWarps];
  __shared__ int ids_s[kMaxT * kMaxK];
  __shared__ float w_s[kMaxT * kMaxK];
  __shared__ int sorted_s[kMaxT * kMaxK];
  __shared__ int counts_s[kMaxE], offset_of[kMaxE], act_s[kMaxE], off_s[kMaxE + 1];
  __shared__ int na_s;
  __shared__ unsigned long long epoch_s;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int T = p.T, H = p.H, E = p.E, K = p.K, I = p.I;
  const int G = gridDim.x, b = blockIdx.x;
  bf16* xn_s = reinterpret_cast<bf16*>(smem);  // [T][H]
  unsigned char* wreg = smem + p.off_w;         // router rows, then the down buffers
  float* red = reinterpret_cast<float*>(smem + p.off_red);
  float* sval = reinterpret_cast<float*>(smem + p.off_sval);  // [T * K][16] scaled down outputs of this group
  const bool router = b < p.R;
  const int e0 = b * kRouterRows;
  const int rrows = router ? min(kRouterRows, E - e0) : 0;
  const uint32_t hrow = static_cast<uint32_t>(H) * 2, hstride = hrow + 16;
  const uint32_t irow = static_cast<uint32_t>(I) * 2, istride = irow + 16;
  const uint32_t tile = kRows * istride;

  // ---- before the wait: router rows (weights, never written by the previous kernel) and the norm weights ----
  if (tid == 0) {
    mbar_init(&rbar);
    mbar_init(&dbar[0]);
    mbar_init(&dbar[1]);
    for (int i = 0; i < kMaxStages; ++i) mbar_init(&full[i]);
    if (router) {
      mbar_arrive_expect_tx(&rbar, rrows * hrow);
      for (int r = 0; r < rrows; ++r)
        bulk_load(wreg + r * hstride, p.router_w + static_cast<size_t>(e0 + r) * H, hrow, &rbar);
    }
  }
  const int c8 = tid * 8;
  const bool own = c8 < H;
  const uint4 zero4 = make_uint4(0, 0, 0, 0);
  const uint4 wpost = own ? __ldg(reinterpret_cast<const uint4*>(p.post_norm + c8)) : zero4;
  const uint4 wnext = own && p.next_norm ? __ldg(reinterpret_cast<const uint4*>(p.next_norm + c8)) : zero4;
  for (int e = tid; e < E; e += kThreads) counts_s[e] = 0;
  __syncthreads();
  pdl_wait_only();
  if (tid == 0) epoch_s = ld_relaxed(p.sync);
  // CTA 0 stamps its phase boundaries (globaltimer) into the workspace: sync[8 + k], for tests to print.
  auto stamp = [&](int k) {
    if (b == 0 && tid == 0) p.sync[8 + k] = global_ns();
  };
  stamp(0);

  // ---- A: x1 = bf16(x + o) and xn' = rmsnorm(x1) of every row, in every CTA (norm_kernel's arithmetic) ----
  {
    uint4 xv[kMaxT], ov[kMaxT];
#pragma unroll
    for (int n = 0; n < kMaxT; ++n) {
      xv[n] = own && n < T ? *reinterpret_cast<const uint4*>(p.x + static_cast<size_t>(n) * H + c8) : zero4;
      ov[n] = own && n < T ? *reinterpret_cast<const uint4*>(p.o + static_cast<size_t>(n) * H + c8) : zero4;
    }
    float v[kMaxT][8];
#pragma unroll
    for (int n = 0; n < kMaxT; ++n) {
      if (n >= T) break;
      float a[8], r[8];
      unpack8(xv[n], a);
      unpack8(ov[n], r);
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        v[n][i] = own ? bf16_round(a[i] + r[i]) : 0.f;
        ss += v[n][i] * v[n][i];
      }
      ss = warp_sum(ss);
      if (lane == 0) red8[n][warp] = ss;
    }
    __syncthreads();
#pragma unroll
    for (int n = 0; n < kMaxT; ++n) {
      if (n >= T) break;
      const float tot = warp_sum(lane < kWarps ? red8[n][lane] : 0.f);
      const float inv = rsqrtf(tot / H + p.eps);
      if (own) *reinterpret_cast<uint4*>(xn_s + static_cast<size_t>(n) * H + c8) = rms_scale8(v[n], inv, wpost);
    }
    __syncthreads();
  }

  // ---- A: router logits of experts [e0, e0 + 8) (moe_route_kernel's arithmetic) ----
  if (router) {
    mbar_wait(&rbar, 0);
    const int chunks = H / 32;
    const unsigned char* a_lo = g < rrows ? wreg + g * hstride + tq * 16 : nullptr;
    const bf16* xb = g < T ? xn_s + static_cast<size_t>(g) * H + tq * 8 : nullptr;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int c = warp; c < chunks; c += kWarps) {
      const uint4 lo = a_lo ? *reinterpret_cast<const uint4*>(a_lo + c * 64) : zero4;
      const uint4 xa = xb ? *reinterpret_cast<const uint4*>(xb + c * 32) : zero4;
      mma_chunk(acc, lo, zero4, xa);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) red[(warp * 4 + i) * 32 + lane] = acc[i];
    __syncthreads();
    if (tid < 128) {
      const int v = tid >> 5, l = tid & 31;
      const int t = (l & 3) * 2 + (v & 1), r = (l >> 2) + (v >> 1) * 8;
      if (t < T && r < rrows) {
        float s = 0.f;
#pragma unroll
        for (int ww = 0; ww < kWarps; ++ww) s += red[(ww * 4 + v) * 32 + l];
        const float lg = bf16_round(s);
        p.logit_ws[static_cast<size_t>(t) * E + e0 + r] = lg;
        if (p.logits) p.logits[static_cast<size_t>(t) * E + e0 + r] = __float2bfloat16(lg);
      }
    }
    // The router rows' shared memory is rewritten by bulk copies (async proxy) after the barrier.
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  const unsigned long long epoch = epoch_s;
  grid_barrier(p.sync + 1, epoch, router, b == 0, p.R, true);
  stamp(1);

  // ---- B: top-k (every CTA, warp t for token t) and the expert list ----
  if (warp < T)
    warp_topk(p.logit_ws + static_cast<size_t>(warp) * E, p.bias, E, K, ids_s + warp * K, w_s + warp * K, lane);
  __syncthreads();
  const int NK = T * K;
  if (tid < NK) {
    atomicAdd(&counts_s[ids_s[tid]], 1);
    if (b == 0) {
      p.ids[tid] = ids_s[tid];
      p.weights[tid] = w_s[tid];
    }
  }
  __syncthreads();
  if (warp == 0) {  // active experts ascending, their first sorted positions (lane: experts [8 lane, 8 lane + 8))
    int c[kMaxE / 32];
    int tot = 0, act = 0;
#pragma unroll
    for (int i = 0; i < kMaxE / 32; ++i) {
      const int e = lane * (kMaxE / 32) + i;
      c[i] = e < E ? counts_s[e] : 0;
      tot += c[i];
      act += c[i] > 0 ? 1 : 0;
    }
    int ts = tot, as = act;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int a = __shfl_up_sync(0xffffffffu, ts, o), bb = __shfl_up_sync(0xffffffffu, as, o);
      if (lane >= o) {
        ts += a;
        as += bb;
      }
    }
    int off = ts - tot, ai = as - act;
#pragma unroll
    for (int i = 0; i < kMaxE / 32; ++i) {
      const int e = lane * (kMaxE / 32) + i;
      if (e < E) {
        offset_of[e] = off;
        if (c[i] > 0) {
          act_s[ai] = e;
          off_s[ai] = off;
          ++ai;
        }
      }
      off += c[i];
    }
    if (lane == 31) {
      na_s = as;
      off_s[as] = ts;
    }
  }
  __syncthreads();
  if (tid < NK) {  // slots sorted by expert, then slot index
    const int id = ids_s[tid];
    int rank = 0;
    for (int s = 0; s < tid; ++s) rank += ids_s[s] == id ? 1 : 0;
    sorted_s[offset_of[id] + rank] = tid;
  }
  __syncthreads();
  const int na = na_s;
  stamp(2);

  // Down tiles: load i of this CTA is (group b + G * (i / rounds), experts of round i % rounds), into buffer i & 1.
  const int P = p.P;
  const int rounds = (na + P - 1) / P;
  const int groups = H / kRows;
  const int my_groups = b < groups ? (groups - b + G - 1) / G : 0;
  const int loads = my_groups * rounds;
  auto issue = [&](int i) {  // warp 0
    const int gi = b + (i / rounds) * G, r = i % rounds;
    const int qn = min(P, na - r * P);
    const int buf = i & 1;
    unsigned char* dst = wreg + static_cast<size_t>(buf) * P * tile;
    if (lane == 0) mbar_arrive_expect_tx(&dbar[buf], static_cast<uint32_t>(qn) * kRows * irow);
    __syncwarp();
    for (int k = lane; k < qn * kRows; k += 32) {
      const int q = k / kRows, row = k % kRows;
      const int e = act_s[r * P + q];
      bulk_load(dst + q * tile + row * istride, p.down + (static_cast<size_t>(e) * H + gi * kRows + row) * I, irow,
                &dbar[buf]);
    }
  };

  // ---- B: gate/up items (active expert, 16 intermediate rows) (rows_mma_kernel's arithmetic, gate/up mode). H <= 2048:
  // a warp's k chunks of an item are one round of loads. The next item's loads are issued before the cross-warp
  // reduction of the current one (double-buffered partial sums, one CTA barrier per item). ----
  const int gu_tiles = I / kRows, items = na * gu_tiles;
  if constexpr (kMode == 0) {
    const int chunks = H / 32;
    uint4 lo[kGuRound][2], hi[kGuRound][2];
    auto load_item = [&](int item) {
      const int j = item / gu_tiles, r0 = (item % gu_tiles) * kRows;
      const bf16* w0 = p.gate_up + (static_cast<size_t>(act_s[j]) * 2 * I + r0) * H;
      const bf16* a_lo0 = w0 + static_cast<size_t>(g) * H + tq * 8;
      const bf16* a_hi0 = a_lo0 + static_cast<size_t>(8) * H;
      const bf16* a_lo1 = a_lo0 + static_cast<size_t>(I) * H;
      const bf16* a_hi1 = a_lo1 + static_cast<size_t>(8) * H;
#pragma unroll
      for (int u = 0; u < kGuRound; ++u) {
        const int c = warp + u * kWarps;
        const size_t k = static_cast<size_t>(c) * 32;
        const bool ok = c < chunks;
        lo[u][0] = ok ? ld_stream(a_lo0 + k) : zero4;
        hi[u][0] = ok ? ld_stream(a_hi0 + k) : zero4;
        lo[u][1] = ok ? ld_stream(a_lo1 + k) : zero4;
        hi[u][1] = ok ? ld_stream(a_hi1 + k) : zero4;
      }
    };
    if (b < items) load_item(b);
    if (warp == 0) {  // the first two down loads, behind the first gate/up item's
      if (loads > 0) issue(0);
      if (loads > 1) issue(1);
    }
    int rb = 0;
    for (int item = b; item < items; item += G, rb ^= 1) {
      const int j = item / gu_tiles, r0 = (item % gu_tiles) * kRows;
      const int beg = off_s[j], nt = off_s[j + 1] - beg;
      const bf16* xb = g < nt ? xn_s + static_cast<size_t>(sorted_s[beg + g] / K) * H + tq * 8 : nullptr;
      float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int u = 0; u < kGuRound; ++u) {
        const int c = warp + u * kWarps;
        const uint4 xa = c < chunks && xb ? *reinterpret_cast<const uint4*>(xb + c * 32) : zero4;
        mma_chunk(acc[0], lo[u][0], hi[u][0], xa);
        mma_chunk(acc[1], lo[u][1], hi[u][1], xa);
      }
      float* rr = red + rb * (kWarps * 8 * 32);
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int i = 0; i < 4; ++i) rr[(warp * 8 + m * 4 + i) * 32 + lane] = acc[m][i];
      if (item + G < items) load_item(item + G);
      __syncthreads();
      if (tid < 128) store_gate_up_h(rr, tid, r0, nt, beg, I, p.h);
    }
  }
  // The same items with the weights bulk-copied (TMA) into a ring of NS stages: stage i of this CTA holds the 16 gate
  // and 16 up rows of its item i / parts, columns [KC (i % parts), + KC) (rows padded by 16 bytes). Every warp computes
  // its chunks (c = warp mod 8, ascending: rows_mma's order) of every stage; after a CTA barrier the stage is refilled
  // with stage i + NS. The down tiles are copied once the ring is drained.
  if constexpr (kMode != 0) {
    const int KC = p.KC, NS = p.NS, parts = H / KC, cpp = KC / 32;
    const uint32_t krow = static_cast<uint32_t>(KC) * 2, kstride = krow + 16, stage_bytes = 2 * kRows * kstride;
    const int my_items = b < items ? (items - b + G - 1) / G : 0;
    const int nst = my_items * parts;
    auto issue_stage = [&](int i) {  // warp 0: one row per lane
      const int item = b + (i / parts) * G, part = i % parts;
      const int j = item / gu_tiles, r0 = (item % gu_tiles) * kRows;
      const int slot = i % NS;
      if (lane == 0) mbar_arrive_expect_tx(&full[slot], 2 * kRows * krow);
      __syncwarp();
      const int row = lane < kRows ? r0 + lane : I + r0 + lane - kRows;
      bulk_load(wreg + slot * stage_bytes + lane * kstride,
                p.gate_up + (static_cast<size_t>(act_s[j]) * 2 * I + row) * H + static_cast<size_t>(part) * KC, krow,
                &full[slot]);
    };
    if (warp == 0)
      for (int i = 0; i < NS && i < nst; ++i) issue_stage(i);
    int rb = 0;
    float acc[2][4];
    for (int i = 0; i < nst; ++i) {
      const int item = b + (i / parts) * G, part = i % parts;
      const int j = item / gu_tiles, r0 = (item % gu_tiles) * kRows;
      const int beg = off_s[j], nt = off_s[j + 1] - beg;
      if (part == 0)
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int v = 0; v < 4; ++v) acc[m][v] = 0.f;
      const bf16* xb = g < nt ? xn_s + static_cast<size_t>(sorted_s[beg + g] / K) * H + tq * 8 : nullptr;
      const unsigned char* st = wreg + (i % NS) * stage_bytes + g * kstride + tq * 16;
      mbar_wait(&full[i % NS], (i / NS) & 1);
      const int c0 = part * cpp;
      for (int c = c0 + ((warp - c0) % kWarps + kWarps) % kWarps; c < c0 + cpp; c += kWarps) {
        const unsigned char* a = st + (c - c0) * 64;
        const uint4 xa = xb ? *reinterpret_cast<const uint4*>(xb + c * 32) : zero4;
        mma_chunk(acc[0], *reinterpret_cast<const uint4*>(a), *reinterpret_cast<const uint4*>(a + 8 * kstride), xa);
        mma_chunk(acc[1], *reinterpret_cast<const uint4*>(a + kRows * kstride),
                  *reinterpret_cast<const uint4*>(a + (kRows + 8) * kstride), xa);
      }
      const bool last = part == parts - 1;
      float* rr = red + rb * (kWarps * 8 * 32);
      if (last)
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int v = 0; v < 4; ++v) rr[(warp * 8 + m * 4 + v) * 32 + lane] = acc[m][v];
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      __syncthreads();
      if (warp == 0 && i + NS < nst) issue_stage(i + NS);
      if (last) {
        if (tid < 128) store_gate_up_h(rr, tid, r0, nt, beg, I, p.h);
        rb ^= 1;
      }
    }
    if (warp == 0) {  // the ring is drained (every stage consumed before the last CTA barrier)
      if (loads > 0) issue(0);
      if (loads > 1) issue(1);
    }
  }
  stamp(3);
  grid_barrier(p.sync + 2, epoch, true, b == 0, G, true);
  stamp(4);
  if (b == 0 && tid == 0) st_relaxed(p.sync, epoch + 1);  // every CTA read the epoch before this barrier
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");

  // ---- C: down rows [16 gi, 16 gi + 16) of every active expert (rows_mma_kernel's arithmetic, down mode), then the
  // combine with the residual for those columns ----
  {
    const int dchunks = I / 32;
    int i = 0;
    for (int gi = b; gi < groups; gi += G) {
      const int r0 = gi * kRows;
      for (int r = 0; r < rounds; ++r, ++i) {
        const int buf = i & 1;
        const int qn = min(P, na - r * P);
        const unsigned char* src = wreg + static_cast<size_t>(buf) * P * tile;
        uint4 xa[kMaxP][kDownChunks];
#pragma unroll
        for (int q = 0; q < kMaxP; ++q) {
          const int j = r * P + q;
          const int beg = q < qn ? off_s[j] : 0, nt = q < qn ? off_s[j + 1] - beg : 0;
          const bf16* hb = g < nt ? p.h + static_cast<size_t>(beg + g) * I + tq * 8 : nullptr;
#pragma unroll
          for (int u = 0; u < kDownChunks; ++u) {
            const int c = warp + u * kWarps;
            xa[q][u] = hb && c < dchunks ? __ldcg(reinterpret_cast<const uint4*>(hb + c * 32)) : zero4;
          }
        }
        mbar_wait(&dbar[buf], (i >> 1) & 1);
        float acc[kMaxP][4];
#pragma unroll
        for (int q = 0; q < kMaxP; ++q) {
#pragma unroll
          for (int v = 0; v < 4; ++v) acc[q][v] = 0.f;
          if (q < qn) {
            const unsigned char* a_lo = src + q * tile + g * istride + tq * 16;
            const unsigned char* a_hi = a_lo + 8 * istride;
#pragma unroll
            for (int u = 0; u < kDownChunks; ++u) {
              const int c = warp + u * kWarps;
              if (c < dchunks)
                mma_chunk(acc[q], *reinterpret_cast<const uint4*>(a_lo + c * 64),
                          *reinterpret_cast<const uint4*>(a_hi + c * 64), xa[q][u]);
            }
#pragma unroll
            for (int v = 0; v < 4; ++v) red[((warp * kMaxP + q) * 4 + v) * 32 + lane] = acc[q][v];
          }
        }
        __syncthreads();
        for (int idx = tid; idx < qn * 128; idx += kThreads) {
          const int q = idx >> 7, v = (idx >> 5) & 3, l = idx & 31;
          const int j = r * P + q;
          const int beg = off_s[j], nt = off_s[j + 1] - beg;
          const int t = (l & 3) * 2 + (v & 1), row = (l >> 2) + (v >> 1) * 8;
          if (t < nt) {
            float s = 0.f;
#pragma unroll
            for (int ww = 0; ww < kWarps; ++ww) s += red[((ww * kMaxP + q) * 4 + v) * 32 + l];
            const int slot = sorted_s[beg + t];
            sval[slot * kRows + row] = bf16_round(bf16_round(s) * w_s[slot]);
          }
        }
        // Buffer `buf` is free: its next load (two ahead) starts while the other buffer is computed.
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        __syncthreads();
        if (warp == 0 && i + 2 < loads) issue(i + 2);
      }
      if (tid < T * kRows) {
        const int n = tid / kRows, rr = tid % kRows;
        const size_t at = static_cast<size_t>(n) * H + r0 + rr;
        float acc = 0.f;
        for (int k = 0; k < K; ++k) acc += sval[(n * K + k) * kRows + rr];
        const float x1 = bf16_round(__bfloat162float(p.x[at]) + __bfloat162float(p.o[at]));
        p.x[at] = __float2bfloat16(x1 + bf16_round(acc));
      }
    }
  }
  stamp(5);
  grid_barrier(p.sync + 3, epoch, true, b == 0, G, b < T);
  stamp(6);

  // ---- D: xn = rmsnorm(x) of row b (norm_kernel's arithmetic) ----
  if (b < T && p.next_norm) {
    float v[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
    if (own) unpack8(__ldcg(reinterpret_cast<const uint4*>(p.x + static_cast<size_t>(b) * H + c8)), v);
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
    const float tot = cta_sum(ss, red8[0]);
    const float inv = rsqrtf(tot / H + p.eps);
    if (own) *reinterpret_cast<uint4*>(p.xn + static_cast<size_t>(b) * H + c8) = rms_scale8(v, inv, wnext);
  }
  if (b == 0 && tid == 0 && p.count_sum) count_add(p.count_sum, na);  // statistics, off the critical path
  stamp(7);
}

struct Layout {
  uint32_t off_w = 0, off_red = 0, off_sval = 0, bytes = 0;
  int P = 0, NS = 0, KC = 0;
};

uint32_t align128(size_t v) { return static_cast<uint32_t>((v + 127) / 128 * 128); }

// Columns of H per gate/up ring stage: the largest divisor of H that is a multiple of 32 and at most max_kc.
int stage_cols(int H, int max_kc) {
  for (int parts = 1; parts <= H / 32; ++parts)
    if (H % parts == 0 && (H / parts) % 32 == 0 && H / parts <= max_kc) return H / parts;
  return 0;
}

// Dynamic shared memory for (T, H, K, I) within max_dyn bytes: xn rows; one region for the router rows, then the
// gate/up ring (NS stages of 32 rows x KC columns), then the two down buffers (P experts' 16-row tiles each); the
// cross-warp reduction; the scaled down outputs of a group. NS = 0 / P = 0: does not fit.
Layout pick_layout(int T, int H, int K, int I, int max_dyn, int max_kc) {
  Layout L;
  L.KC = stage_cols(H, max_kc);
  const size_t tile = static_cast<size_t>(kRows) * (static_cast<size_t>(I) * 2 + 16);
  const size_t stage = static_cast<size_t>(2 * kRows) * (static_cast<size_t>(L.KC) * 2 + 16);
  const size_t router = static_cast<size_t>(kRouterRows) * (static_cast<size_t>(H) * 2 + 16);
  const size_t red = static_cast<size_t>(kWarps) * std::max(2 * 8, 4 * kMaxP) * 32 * 4;  // gate/up: two buffers
  const size_t fixed = align128(static_cast<size_t>(T) * H * 2) + align128(red) +
                       align128(static_cast<size_t>(T) * K * kRows * 4) + 128;
  if (static_cast<size_t>(max_dyn) <= fixed) return L;
  const size_t region = static_cast<size_t>(max_dyn) - fixed;
  if (region < router) return L;
  L.NS = static_cast<int>(std::min<size_t>(kMaxStages, region / stage));
  L.P = static_cast<int>(std::min<size_t>(kMaxP, region / (2 * tile)));
  if (L.NS < 2) L.NS = 0;
  if (L.P < 1) return L;
  const size_t wbytes = std::max({router, 2 * static_cast<size_t>(L.P) * tile, static_cast<size_t>(L.NS) * stage});
  L.off_w = align128(static_cast<size_t>(T) * H * 2);
  L.off_red = align128(L.off_w + wbytes);
  L.off_sval = align128(L.off_red + red);
  L.bytes = align128(L.off_sval + static_cast<size_t>(T) * K * kRows * 4);
  return L;
}

struct DeviceInfo {
  bool ok = false;
  int max_dyn = 0;  // dynamic shared memory a CTA may use
  int sms = 0;
};

using BlockKernel = void (*)(BlockParams);
BlockKernel kernel_of(int mode) { return mode == 0 ? moe_block_kernel<0> : moe_block_kernel<1>; }

const DeviceInfo& device_info() {
  static const DeviceInfo info = [] {
    DeviceInfo d;
    int dev = 0, coop = 0, optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
      cudaGetLastError();
      return d;
    }
    size_t stat = 0;
    for (int m = 0; m < 2; ++m) {
      cudaFuncAttributes attr{};
      if (cudaFuncGetAttributes(&attr, kernel_of(m)) != cudaSuccess) {
        cudaGetLastError();
        return d;
      }
      stat = std::max(stat, attr.sharedSizeBytes);
    }
    d.max_dyn = optin - static_cast<int>(stat);
    d.sms = sm_count();
    d.ok = coop != 0 && d.max_dyn > 0;
    for (int m = 0; m < 2 && d.ok; ++m)
      d.ok = cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel_of(m)),
                                  cudaFuncAttributeMaxDynamicSharedMemorySize, d.max_dyn) == cudaSuccess;
    cudaGetLastError();
    return d;
  }();
  return info;
}

// The layout: stages of up to kMaxKC columns, all the shared memory a CTA may have.
Layout pick_layout(int T, int H, int K, int I) { return pick_layout(T, H, K, I, device_info().max_dyn, kMaxKC); }

// CTAs of the cooperative grid of `mode` for `smem` bytes (0: cannot launch).
int grid_for(int mode, size_t smem) {
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel_of(mode), kThreads, smem) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return per_sm * device_info().sms;
}

// Whether a cooperative launch also takes the programmatic-serialisation attribute (learnt at the first launch).
int pdl_state = -1;  // -1 unknown, 0 no, 1 yes

size_t align256(size_t v) { return (v + 255) / 256 * 256; }

// Workspaces that moe_block_decode keeps itself for callers that pass none: one per stream (launches on one stream run
// in order), allocated and zeroed outside stream capture at the first launch that needs it (then kept for the
// process; a graph captured later reuses it).
Status stream_workspace(cudaStream_t stream, size_t bytes, void** out) {
  static std::mutex mu;
  static std::map<cudaStream_t, std::pair<void*, size_t>> spaces;
  std::lock_guard<std::mutex> lock(mu);
  auto& e = spaces[stream];
  if (e.second >= bytes) {
    *out = e.first;
    return Status::ok();
  }
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  ZEST_RETURN_IF_ERROR(cuda_status(cudaStreamIsCapturing(stream, &cap), "moe_block_decode"));
  if (cap != cudaStreamCaptureStatusNone)
    return unsupported("moe_block_decode: no workspace for this stream yet (first launch inside a capture)");
  if (e.first) {
    ZEST_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "moe_block_decode"));
    cudaFree(e.first);
    e = {nullptr, 0};
  }
  const size_t sized = std::max<size_t>(bytes, moe_block_workspace_bytes(kMaxT, kMaxE, kMaxK, kMaxI));
  void* p = nullptr;
  ZEST_RETURN_IF_ERROR(cuda_status(cudaMalloc(&p, sized), "moe_block_decode workspace"));
  const cudaError_t z = cudaMemsetAsync(p, 0, sized, stream);
  if (z != cudaSuccess) {
    cudaFree(p);
    return cuda_status(z, "moe_block_decode workspace");
  }
  e = {p, sized};
  *out = p;
  return Status::ok();
}

}  // namespace

bool moe_block_ok(int T, int H, int E, int K, int I) {
  if (T < 1 || T > kMaxT || E < 1 || E > kMaxE || K < 1 || K > kMaxK || K > E || H < 32 || H % 32 != 0 ||
      H > kMaxH || I < 32 || I % 32 != 0 || I > kMaxI)
    return false;
  if (!device_info().ok) return false;
  const Layout L = pick_layout(T, H, K, I);
  if (L.P == 0) return false;
  const int G = grid_for(L.NS >= 2 ? 1 : 0, L.bytes);
  return G >= (E + kRouterRows - 1) / kRouterRows && G >= T;
}

size_t moe_block_workspace_bytes(int max_tokens, int E, int K, int I) {
  return 256 + align256(static_cast<size_t>(max_tokens) * E * 4) + static_cast<size_t>(max_tokens) * K * I * 2;
}

Status moe_block_decode(bf16* x, const bf16* o, const bf16* post_norm, const bf16* router_w, const float* router_bias,
                        const bf16* gate_up, const bf16* down, const bf16* next_norm, bf16* xn, int32_t* ids,
                        float* weights, bf16* logits, int64_t* active_count_sum, void* workspace,
                        size_t workspace_bytes, int T, int H, int E, int K, int I, float eps, cudaStream_t stream) {
  if (!moe_block_ok(T, H, E, K, I))
    return invalid_argument("moe_block_decode: need 1 <= T <= 8, 1 <= K <= min(16, E), E <= 256, H a multiple of 32 up "
                            "to 2048, I a multiple of 32 up to 1024 and a device with cooperative launches (T=" +
                            std::to_string(T) + " H=" + std::to_string(H) + " E=" + std::to_string(E) + " K=" +
                            std::to_string(K) + " I=" + std::to_string(I) + ")");
  if (!x || !o || !post_norm || !router_w || !gate_up || !down || !xn || !ids || !weights)
    return invalid_argument("moe_block_decode: null pointer");
  if (!workspace) {
    workspace_bytes = moe_block_workspace_bytes(T, E, K, I);
    ZEST_RETURN_IF_ERROR(stream_workspace(stream, workspace_bytes, &workspace));
  }
  if (workspace_bytes < moe_block_workspace_bytes(T, E, K, I))
    return invalid_argument("moe_block_decode: workspace too small");
  // DecodeOption::kMoeBlock 3: gate/up weights through register loads; otherwise the bulk-copy ring (register loads
  // when fewer than two stages fit).
  const int option = decode_option(DecodeOption::kMoeBlock);
  const int R = (E + kRouterRows - 1) / kRouterRows;
  const Layout L = pick_layout(T, H, K, I);
  const int mode = option == 3 || L.NS < 2 ? 0 : 1;
  const int G = grid_for(mode, L.bytes);
  BlockParams p{};
  p.x = x;
  p.o = o;
  p.post_norm = post_norm;
  p.router_w = router_w;
  p.bias = router_bias;
  p.gate_up = gate_up;
  p.down = down;
  p.next_norm = next_norm;
  p.xn = xn;
  p.ids = ids;
  p.weights = weights;
  p.logits = logits;
  p.count_sum = active_count_sum;
  unsigned char* ws = static_cast<unsigned char*>(workspace);
  p.sync = reinterpret_cast<unsigned long long*>(ws);
  p.logit_ws = reinterpret_cast<float*>(ws + 256);
  p.h = reinterpret_cast<bf16*>(ws + 256 + align256(static_cast<size_t>(T) * E * 4));
  p.T = T;
  p.H = H;
  p.E = E;
  p.K = K;
  p.I = I;
  p.P = L.P;
  p.R = R;
  p.NS = L.NS;
  p.KC = L.KC;
  p.off_w = L.off_w;
  p.off_red = L.off_red;
  p.off_sval = L.off_sval;
  p.eps = eps;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(G);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = L.bytes;
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  // DecodeOption::kMoeBlock 2: never with programmatic serialisation.
  const bool want_pdl = programmatic_launch() && pdl_state != 0 && option != 2;
  cfg.numAttrs = want_pdl ? 2 : 1;
  const BlockKernel kernel = kernel_of(mode);
  note_launch("moe_block_decode");
  cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, p);
  if (err != cudaSuccess && want_pdl && pdl_state < 0) {
    cudaGetLastError();
    pdl_state = 0;
    cfg.numAttrs = 1;
    err = cudaLaunchKernelEx(&cfg, kernel, p);
  } else if (err == cudaSuccess && want_pdl) {
    pdl_state = 1;
  }
  return cuda_status(err, "moe_block_decode");
}

}  // namespace zest::cuda
