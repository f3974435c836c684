// Decode experts at one token (up to 8): gate/up then down, as rows_mma computes them (bf16 mma.m16n8k16, fp32 sums,
// the same k split over eight warps and fixed-order sums, so the same bits), with less latency between the plan and
// the first weight loads and around the two kernels' boundary:
// - gate/up: CTAs of 8 warps on (active expert j, 16 intermediate rows) items, 3 CTAs per SM (80 registers), the
//   weights register-streamed (16-byte loads used once) with 2 32-wide k chunks in flight per warp and matrix. A CTA
//   loads its first item's expert and slot range beside the active count (one round trip before its first weight
//   loads instead of two); the 8 warps split k, their partial sums are reduced in shared memory in fixed order and
//   SiLU(gate) * up is written by 128 threads at once (one barrier).
// - down: the same structure on (active expert j, 16 output rows) items with 4 chunks in flight per warp (a warp's
//   whole k at I = 768). Before its programmatic-dependent-launch wait each CTA loads its first item's weights into
//   registers and prefetches its later items into L2, so that the down weights move while the gate/up CTAs that finish
//   last are still running.
// - the gate/up weight loads and the down-by-rows weight copies are marked evict-first in L2 (read once per step: the
//   KV rows the qkv GEMM prefetches and the activations keep their lines; measured at batch 1: TPOT -0.003 to -0.015
//   ms, never slower in 8 comparisons).
#include "kernels/cuda/moe_one.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"

namespace zest::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kRows = 16;   // weight rows per item (one m16 tile)
constexpr int kChunk = 32;  // k per chunk (two mma k16 steps)
constexpr int kMaxTok = 8;  // token rows per pass (one n8 tile)
constexpr int kPerSm = 3;   // CTAs per SM of either kernel

struct OneParams {
  const bf16* x;         // [N, H]
  const bf16* gate_up;   // [E, 2I, H]
  const bf16* down;      // [E, H, I]
  bf16* h;               // [N * K, I] by sorted position
  float* slot_out;       // [N * K, H]
  const float* route_w;  // [N * K]
  MoePlan plan;
  int K, H, I;
  uint64_t* stamps_gu;  // optional: gate/up CTA b writes [2b] after its wait and [2b + 1] at its end (globaltimer)
  uint64_t* stamps_dn;  // optional: down CTA b writes [3b] at entry, [3b + 1] after its wait, [3b + 2] at its end
  OneCombine cmb;       // cmb.x != null: the down kernel's last CTA runs the combine
  int N;
};

// One gate/up item: SiLU(gate) * up of expert e's intermediate rows [r0, r0 + 16) for its sorted slots [beg, end),
// written to h. Warp w takes chunks w, w + 8, ... of k (2 in flight per matrix), as rows_mma_kernel<kGateUp> does.
// Ends with a barrier (h written by the CTA's 128 storing threads). The weight loads are marked evict-first.
__device__ __forceinline__ void gate_up_item(const OneParams& p, int e, int r0, int beg, int end,
                                             float (*red)[8][32]) {
  const uint64_t pol = evict_first_policy();
  auto ld = [&](const bf16* q) { return ld_stream_hint(q, pol); };
  constexpr int kU = 2;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int chunks = p.H / kChunk;
  const bf16* lo0 = p.gate_up + (static_cast<size_t>(e) * 2 * p.I + r0 + g) * p.H + tq * 8;
  const bf16* hi0 = lo0 + static_cast<size_t>(8) * p.H;
  const bf16* lo1 = lo0 + static_cast<size_t>(p.I) * p.H;  // up rows
  const bf16* hi1 = hi0 + static_cast<size_t>(p.I) * p.H;
  for (int c0 = beg; c0 < end; c0 += kMaxTok) {
    const int nt = min(kMaxTok, end - c0);
    const bf16* xp = g < nt ? p.x + static_cast<size_t>(p.plan.sorted_slots[c0 + g] / p.K) * p.H + tq * 8 : nullptr;
    float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    for (int cb = warp; cb < chunks; cb += kWarps * kU) {
      uint4 a[kU][4];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const size_t k = static_cast<size_t>(cb + u * kWarps) * kChunk;
        const bool ok = cb + u * kWarps < chunks;
        const uint4 z = make_uint4(0, 0, 0, 0);
        a[u][0] = ok ? ld(lo0 + k) : z;
        a[u][1] = ok ? ld(hi0 + k) : z;
        a[u][2] = ok ? ld(lo1 + k) : z;
        a[u][3] = ok ? ld(hi1 + k) : z;
      }
      // Token fragments (L1 hits after the first item) after the weight loads in program order.
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const size_t k = static_cast<size_t>(cb + u * kWarps) * kChunk;
        const uint4 xa = cb + u * kWarps < chunks && xp ? __ldg(reinterpret_cast<const uint4*>(xp + k))
                                                         : make_uint4(0, 0, 0, 0);
        mma16816(acc[0], a[u][0].x, a[u][1].x, a[u][0].y, a[u][1].y, xa.x, xa.y);
        mma16816(acc[0], a[u][0].z, a[u][1].z, a[u][0].w, a[u][1].w, xa.z, xa.w);
        mma16816(acc[1], a[u][2].x, a[u][3].x, a[u][2].y, a[u][3].y, xa.x, xa.y);
        mma16816(acc[1], a[u][2].z, a[u][3].z, a[u][2].w, a[u][3].w, xa.z, xa.w);
      }
    }
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int i = 0; i < 4; ++i) red[warp][m * 4 + i][lane] = acc[m][i];
    __syncthreads();
    if (threadIdx.x < 4 * 32) {
      const int i = threadIdx.x >> 5, l = threadIdx.x & 31;
      const int t = (l & 3) * 2 + (i & 1);
      if (t < nt) {
        float sg = 0.f, su = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          sg += red[w][i][l];
          su += red[w][4 + i][l];
        }
        const int row = r0 + (l >> 2) + (i >> 1) * 8;
        const float gt = bf16_round(sg), up = bf16_round(su);
        const float sl = bf16_round(gt / (1.f + __expf(-gt)));
        p.h[static_cast<size_t>(c0 + t) * p.I + row] = __float2bfloat16(sl * up);
      }
    }
    __syncthreads();
  }
}

constexpr int kDnU = 4;  // down: chunks in flight per warp (a warp's whole k at I = 768)

// The down weight fragments of round cb (chunks cb, cb + 8, ...) of expert e's output rows [r0, r0 + 16).
__device__ __forceinline__ void down_load(const OneParams& p, int e, int r0, int cb, uint4 (&lo)[kDnU],
                                          uint4 (&hi)[kDnU]) {
  const int lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int chunks = p.I / kChunk;
  const bf16* lo0 = p.down + (static_cast<size_t>(e) * p.H + r0 + g) * p.I + tq * 8;
  const bf16* hi0 = lo0 + static_cast<size_t>(8) * p.I;
#pragma unroll
  for (int u = 0; u < kDnU; ++u) {
    const size_t k = static_cast<size_t>(cb + u * kWarps) * kChunk;
    const bool ok = cb + u * kWarps < chunks;
    lo[u] = ok ? ld_stream(lo0 + k) : make_uint4(0, 0, 0, 0);
    hi[u] = ok ? ld_stream(hi0 + k) : make_uint4(0, 0, 0, 0);
  }
}

// One down item: expert e's output rows [r0, r0 + 16) for its sorted slots [beg, end), scaled by the routing weights
// into slot_out; warp w takes chunks w, w + 8, ... of k (4 in flight), the partial sums reduced in fixed order, as
// rows_mma_kernel<kDown> does. `loaded`: lo / hi already hold the first round of the first pass. Ends with a barrier.
__device__ __forceinline__ void down_item(const OneParams& p, int e, int r0, int beg, int end, bool loaded,
                                          uint4 (&lo)[kDnU], uint4 (&hi)[kDnU], float (*red)[4][32]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int chunks = p.I / kChunk;
  for (int c0 = beg; c0 < end; c0 += kMaxTok) {
    const int nt = min(kMaxTok, end - c0);
    const bf16* xp = g < nt ? p.h + static_cast<size_t>(c0 + g) * p.I + tq * 8 : nullptr;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int cb = warp; cb < chunks; cb += kWarps * kDnU) {
      if (!(loaded && c0 == beg && cb == warp)) down_load(p, e, r0, cb, lo, hi);
      uint4 xa[kDnU];
#pragma unroll
      for (int u = 0; u < kDnU; ++u) {
        const size_t k = static_cast<size_t>(cb + u * kWarps) * kChunk;
        const bool ok = cb + u * kWarps < chunks && xp;
        xa[u] = ok ? __ldg(reinterpret_cast<const uint4*>(xp + k)) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kDnU; ++u) {
        mma16816(acc, lo[u].x, hi[u].x, lo[u].y, hi[u].y, xa[u].x, xa[u].y);
        mma16816(acc, lo[u].z, hi[u].z, lo[u].w, hi[u].w, xa[u].z, xa[u].w);
      }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][i][lane] = acc[i];
    __syncthreads();
    if (threadIdx.x < 4 * 32) {
      const int i = threadIdx.x >> 5, l = threadIdx.x & 31;
      const int t = (l & 3) * 2 + (i & 1);
      if (t < nt) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) v += red[w][i][l];
        const int row = r0 + (l >> 2) + (i >> 1) * 8;
        const int slot = p.plan.sorted_slots[c0 + t];
        p.slot_out[static_cast<size_t>(slot) * p.H + row] = bf16_round(bf16_round(v) * p.route_w[slot]);
      }
    }
    __syncthreads();
  }
}

// The folded combine (p.cmb.x != null) by the CTA that finds itself last on `exit_count` (each CTA's slot rows are
// ordered before its count: barrier, then a fence by the counting thread; the last one's fence after the count
// orders its loads after all of them); `exit_count` is cleared at the end. Returns false in every CTA but the last.
__device__ __forceinline__ bool finish_last(const OneParams& p, unsigned* exit_count, float* scratch) {
  __shared__ unsigned last;
  const int c = threadIdx.x * 8;  // this thread's norm weights, loaded while the CTA counts itself
  const uint4 wv = p.cmb.x && p.cmb.w && c < p.H ? __ldg(reinterpret_cast<const uint4*>(p.cmb.w + c))
                                                  : make_uint4(0, 0, 0, 0);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(exit_count, 1u) == gridDim.x - 1 ? 1u : 0u;
    if (last) __threadfence();
  }
  __syncthreads();
  if (!last) return false;
  step_timeline_phase(4);  // the last CTA knows it is last
  if (p.cmb.x)
    for (int t = 0; t < p.N; ++t)
      combine_norm_row(p.cmb.x + static_cast<size_t>(t) * p.H, p.slot_out + static_cast<size_t>(t) * p.K * p.H,
                       p.cmb.ids + t * p.K, p.K, wv, p.cmb.w ? p.cmb.y + static_cast<size_t>(t) * p.H : nullptr, p.H,
                       p.cmb.eps, scratch);
  if (threadIdx.x == 0) *exit_count = 0u;  // every CTA has counted: ready for the next launch
  return true;
}

// gate/up: item = (active expert j, 16 intermediate rows); CTA b takes items b, b + G, ... (G = grid).
__global__ void __launch_bounds__(kWarps * 32, kPerSm) one_gate_up_kernel(OneParams p) {
  // Every CTA waits first, before any exit: the down kernel starts only once each CTA of this grid has passed this
  // wait (pdl_wait triggers the dependents after it), i.e. after the kernel that built the plan has completed; the
  // down kernel reads the plan before its own wait on that basis.
  step_timeline_phase(0);
  pdl_wait();
  if (p.stamps_gu && threadIdx.x == 0) p.stamps_gu[2 * blockIdx.x] = global_ns();
  __shared__ float red[kWarps][8][32];
  const int tiles = p.I / kRows;
  // The first item's expert and slot range are loaded beside the active count (one round trip instead of two), from
  // an index clamped into the plan's arrays in case the item does not exist.
  const int jf = min(static_cast<int>(blockIdx.x) / tiles, p.plan.experts - 1);
  const int ef = p.plan.active_experts[jf], begf = p.plan.offsets[jf], endf = p.plan.offsets[jf + 1];
  const int items = *p.plan.num_active * tiles;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const bool first = item == static_cast<int>(blockIdx.x);
    const int j = item / tiles, r0 = (item % tiles) * kRows;
    const int e = first ? ef : p.plan.active_experts[j];
    const int beg = first ? begf : p.plan.offsets[j], end = first ? endf : p.plan.offsets[j + 1];
    gate_up_item(p, e, r0, beg, end, red);
  }
  step_timeline_phase(2);
  if (p.stamps_gu && threadIdx.x == 0) p.stamps_gu[2 * blockIdx.x + 1] = global_ns();
}

// down: item = (active expert j, 16 output rows); CTA b takes items b, b + G, ... Before its wait the CTA loads its
// first item's first round of weights into registers and prefetches its next three items into L2. The plan is
// read there at L2 (ld.global.cg): this grid starts only after every CTA of the gate/up grid has passed its own wait,
// so the kernel that built the plan (the one gate/up waits on, or an earlier one) has completed and its writes are
// visible; the items' experts are loaded beside the active count. The down weights are never written by a kernel; h
// is read only after the wait.
__global__ void __launch_bounds__(kWarps * 32, kPerSm) one_down_kernel(OneParams p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int tiles = p.H / kRows;
  step_timeline_phase(0);
  if (p.stamps_dn && threadIdx.x == 0) p.stamps_dn[3 * blockIdx.x] = global_ns();
  uint4 lo[kDnU], hi[kDnU];  // a round of weight fragments (the first item's first round, loaded before the wait)
  bool pre = false;
  {
    const int jf = min(static_cast<int>(blockIdx.x) / tiles, p.plan.experts - 1);
    const int nx = blockIdx.x + (lane + 1) * gridDim.x;  // warp 0, lanes 0-2: the next items
    const int jx = min(nx / tiles, p.plan.experts - 1);
    const int ef = __ldcg(p.plan.active_experts + jf);
    const int ex = warp == 0 && lane < 3 ? __ldcg(p.plan.active_experts + jx) : 0;
    const int nitems = __ldcg(p.plan.num_active) * tiles;
    pre = static_cast<int>(blockIdx.x) < nitems;
    if (pre) down_load(p, ef, (blockIdx.x % tiles) * kRows, warp, lo, hi);
    if (warp == 0 && lane < 3 && nx < nitems)
      bulk_prefetch_l2(p.down + (static_cast<size_t>(ex) * p.H + (nx % tiles) * kRows) * p.I,
                       static_cast<uint32_t>(kRows) * p.I * 2);
  }
  pdl_wait();
  if (p.stamps_dn && threadIdx.x == 0) p.stamps_dn[3 * blockIdx.x + 1] = global_ns();
  __shared__ float red[kWarps][4][32];
  const int items = *p.plan.num_active * tiles;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int j = item / tiles, r0 = (item % tiles) * kRows;
    down_item(p, p.plan.active_experts[j], r0, p.plan.offsets[j], p.plan.offsets[j + 1],
                     pre && item == static_cast<int>(blockIdx.x), lo, hi, red);
  }
  step_timeline_phase(2);
  if (p.stamps_dn && threadIdx.x == 0) p.stamps_dn[3 * blockIdx.x + 2] = global_ns();
  if (p.cmb.x && finish_last(p, p.cmb.done, &red[0][0][0])) step_timeline_phase(3);
}

// Down by output rows at one token with the combine where computed (OneCombine::rows): a cluster of two CTAs owns
// output rows [16 b, 16 b + 16); rank r computes them for the active experts of sorted positions r, r + 2, r + 4,
// r + 6 (so two active experts, as with SERE S=2, give each rank one). Before its wait each CTA bulk-copies those
// experts' 16 weight rows into shared memory (rows padded by 16 bytes: the A-fragment reads are free of bank
// conflicts); it reads the plan at L2 there (the down kernel starts after every gate/up CTA passed its wait: see
// one_down_kernel). After the wait: token 0's h as B fragments, warp w takes chunks w, w + 8, w + 16 of each expert and
// the eight warps' sums are added in fixed order, as one_down_kernel does (the same slot values); rank 1 stores its
// slot values into rank 0's shared memory (distributed shared memory), and after one cluster barrier rank 0 adds the
// slots in slot order (empty slots skipped) to x, the combine's arithmetic: x gets the bits of the chain. No counter,
// no last CTA; the next RMSNorm is left to the next kernel (x only).
constexpr int kRowsMaxK = 8;                    // slots (= active experts at one token)
constexpr int kPairExperts = kRowsMaxK / 2;     // per rank
constexpr int kPairMaxC = 3;                    // chunks per warp and expert: I <= 32 * 8 * 3
constexpr int kPairThreads = kWarps * 32;

// The weight rows of a rank's experts, at least the partial sums that reuse them.
size_t pair_smem(int I) {
  return std::max(static_cast<size_t>(kPairExperts) * kRows * (static_cast<size_t>(I) * 2 + 16),
                  static_cast<size_t>(kWarps) * kPairExperts * 2 * 32 * sizeof(float));
}

// Each CTA arrives on the cluster barrier at its start and waits on it before its store into rank 0's shared memory,
// so that rank 0 is known to run (without it compute-sanitizer racecheck reported the stores as into "a block that
// might not have entered yet"; measured at batch 1 within the noise of the run: docs/perf-history.md).
template <int kC>
__global__ void __launch_bounds__(kPairThreads, 2) one_down_pair_kernel(OneParams p) {
  extern __shared__ __align__(128) unsigned char wsm[];
  __shared__ __align__(8) uint64_t bar;
  __shared__ float vals[kRowsMaxK][kRows];  // rank 0: every slot's values of the cluster's rows
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int rank = static_cast<int>(cluster_rank());
  const int r0 = blockIdx.y * kRows;
  const int chunks = p.I / kChunk;
  const uint32_t row_bytes = static_cast<uint32_t>(p.I) * 2, stride = row_bytes + 16;
  cluster_arrive_relaxed();
  step_timeline_phase(0);
  const int na = __ldcg(p.plan.num_active);
  int e[kPairExperts];
#pragma unroll
  for (int x = 0; x < kPairExperts; ++x) e[x] = __ldcg(p.plan.active_experts + min(rank + 2 * x, p.K - 1));
  int nx = 0;  // this rank's experts
#pragma unroll
  for (int x = 0; x < kPairExperts; ++x) nx += rank + 2 * x < na ? 1 : 0;
  if (warp == 0 && nx > 0) {
    if (lane == 0) {
      mbar_init(&bar);
      mbar_arrive_expect_tx(&bar, static_cast<uint32_t>(nx) * kRows * row_bytes);
    }
    __syncwarp();
    for (int c = lane; c < nx * kRows; c += 32) {
      const int x = c / kRows, r = c % kRows;
      int ex = e[0];
#pragma unroll
      for (int y = 1; y < kPairExperts; ++y) ex = x == y ? e[y] : ex;
      const bf16* src = p.down + (static_cast<size_t>(ex) * p.H + r0 + r) * p.I;
      bulk_load_hint(wsm + static_cast<size_t>(c) * stride, src, row_bytes, &bar, evict_first_policy());
    }
  }
  __syncthreads();  // the mbarrier is initialised before any warp waits on it
  // Thread (x, q): the slot and routing weight of this rank's expert x, for row q.
  const int xq = threadIdx.x / kRows, q = threadIdx.x % kRows;
  const int jq = rank + 2 * min(xq, kPairExperts - 1);
  const int slot_q = threadIdx.x < kPairExperts * kRows && jq < na ? __ldcg(p.plan.sorted_slots + jq) : 0;
  const float w_q = threadIdx.x < kPairExperts * kRows && jq < na ? __ldcg(p.route_w + slot_q) : 0.f;
  pdl_wait();
  uint4 hb[kPairExperts][kC];  // token 0's h (lanes g == 0; zeros elsewhere, as for absent tokens)
#pragma unroll
  for (int x = 0; x < kPairExperts; ++x) {
    const int j = rank + 2 * x;
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      const int c = warp + kWarps * i;
      hb[x][i] = g == 0 && j < na && c < chunks
                     ? __ldcg(reinterpret_cast<const uint4*>(p.h + static_cast<size_t>(j) * p.I + c * kChunk + tq * 8))
                     : make_uint4(0, 0, 0, 0);
    }
  }
  float acc[kPairExperts][4];
#pragma unroll
  for (int x = 0; x < kPairExperts; ++x)
#pragma unroll
    for (int v = 0; v < 4; ++v) acc[x][v] = 0.f;
  if (nx > 0) mbar_wait(&bar, 0);
#pragma unroll
  for (int x = 0; x < kPairExperts; ++x) {
    if (x >= nx) break;
    const unsigned char* lo_row = wsm + static_cast<size_t>(x * kRows + g) * stride + tq * 16;
    const unsigned char* hi_row = lo_row + 8 * stride;
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      const int c = warp + kWarps * i;
      if (c >= chunks) break;
      const uint4 lo = *reinterpret_cast<const uint4*>(lo_row + c * kChunk * 2);
      const uint4 hi = *reinterpret_cast<const uint4*>(hi_row + c * kChunk * 2);
      mma16816(acc[x], lo.x, hi.x, lo.y, hi.y, hb[x][i].x, hb[x][i].y);
      mma16816(acc[x], lo.z, hi.z, lo.w, hi.w, hb[x][i].z, hb[x][i].w);
    }
  }
  __syncthreads();  // every warp is done with the weight rows: their bytes take the partial sums
  float(*red)[kPairExperts][2][32] = reinterpret_cast<float(*)[kPairExperts][2][32]>(wsm);
#pragma unroll
  for (int x = 0; x < kPairExperts; ++x) {
    red[warp][x][0][lane] = acc[x][0];  // token 0, row g
    red[warp][x][1][lane] = acc[x][2];  // token 0, row g + 8
  }
  __syncthreads();
  cluster_wait();  // both CTAs have started
  if (threadIdx.x < kPairExperts * kRows && jq < na) {  // expert x's row r0 + q: its slot value into rank 0
    const int h8 = q >> 3, l = (q & 7) * 4;               // lane (g = q & 7, tq = 0), rows g or g + 8
    float v = 0.f;
#pragma unroll
    for (int ww = 0; ww < kWarps; ++ww) v += red[ww][xq][h8][l];
    st_cluster_f32(cluster_map(&vals[slot_q][q], 0), bf16_round(bf16_round(v) * w_q));
  }
  cluster_arrive();
  cluster_wait();
  if (rank == 0 && threadIdx.x < kRows) {  // x = bf16(x + bf16(sum of the slots in slot order)), empty slots skipped
    float a = 0.f;
    for (int k = 0; k < p.K; ++k)
      if (__ldcg(p.cmb.ids + k) >= 0) a += vals[k][threadIdx.x];
    bf16* xr = p.cmb.x + r0 + threadIdx.x;
    *xr = __float2bfloat16(bf16_round(__bfloat162float(*xr) + bf16_round(a)));
  }
  step_timeline_phase(2);
}

}  // namespace

bool moe_one_rows_ok(int N, int K, int E, int H, int I) {
  return N == 1 && K >= 1 && K <= kRowsMaxK && K <= E && H % kRows == 0 && H >= kChunk && H % kChunk == 0 &&
         I % kChunk == 0 && I >= kChunk && I <= kChunk * kWarps * kPairMaxC;
}

bool moe_one_combine_ok(int H) { return H > 0 && H % 8 == 0 && H <= 8 * kWarps * 32; }

bool moe_one_ok(int N, int K, int E, int H, int I) {
  return N >= 1 && N <= kMaxTok && K >= 1 && E >= 1 && K <= E && H >= kChunk && I >= kChunk && H % kChunk == 0 &&
         I % kChunk == 0;
}

void moe_one_grids(int N, int K, int E, int H, int I, int* gate_up_grid, int* down_grid) {
  const int max_active = std::min(E, N * K);
  *gate_up_grid = std::max(1, std::min(kPerSm * sm_count(), max_active * (I / kRows)));
  *down_grid = std::max(1, std::min(kPerSm * sm_count(), max_active * (H / kRows)));
}

Status moe_experts_one(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up, const bf16* down,
                       bf16* h, float* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream,
                       uint64_t* stamps, const OneCombine* combine) {
  if (!moe_one_ok(N, K, E, H, I))
    return invalid_argument("moe_experts_one: unsupported sizes (need 1 <= N <= 8, 1 <= K <= E, H and I positive "
                            "multiples of 32; N=" + std::to_string(N) + " K=" + std::to_string(K) + " E=" +
                            std::to_string(E) + " H=" + std::to_string(H) + " I=" + std::to_string(I) + ")");
  if (combine && (!combine->x || !combine->ids || (!combine->done && !combine->rows) || (combine->w && !combine->y) ||
                  !moe_one_combine_ok(H)))
    return invalid_argument("moe_experts_one: the folded combine needs x, ids, done (y with w) and H <= 2048, H % 8 == 0");
  int gu_grid = 0, dn_grid = 0;
  moe_one_grids(N, K, E, H, I, &gu_grid, &dn_grid);
  OneParams p{};
  p.x = x;
  p.gate_up = gate_up;
  p.down = down;
  p.h = h;
  p.slot_out = slot_out;
  p.route_w = weights;
  p.plan = plan;
  p.K = K;
  p.H = H;
  p.I = I;
  p.stamps_gu = stamps;
  p.stamps_dn = stamps ? stamps + 2 * static_cast<size_t>(gu_grid) : nullptr;
  if (combine) p.cmb = *combine;
  p.N = N;
  const dim3 block(kWarps * 32);
  // Both kernels prefer the smallest shared-memory carveout that holds their 3 CTAs per SM, the rest of the SM staying
  // L1 (set once; measured faster than the driver's default). A gate/up carveout that also leaves room for a down pair
  // CTA measured equal or slower (registers keep it out: 3 x 256 x 80 of the gate/up CTAs leave 4 K;
  // docs/perf-history.md).
  const cudaError_t carved = once_per_device<cudaError_t>([] {  // function attributes are per GPU
    for (const void* fn :
         {reinterpret_cast<const void*>(one_gate_up_kernel), reinterpret_cast<const void*>(one_down_kernel)})
      if (!set_min_carveout(fn, kPerSm, 0).is_ok()) return cudaErrorInvalidValue;
    return cudaSuccess;
  });
  ZEST_RETURN_IF_ERROR(cuda_status(carved, "moe_experts_one: carveout"));
  ZEST_RETURN_IF_ERROR(launch("moe_one_gate_up", one_gate_up_kernel, dim3(gu_grid), block, 0, stream, p));
  if (combine && combine->rows) {
    if (!moe_one_rows_ok(N, K, E, H, I) || combine->w || combine->y)
      return invalid_argument("moe_experts_one: the down kernel by output rows needs one token, K <= 8, I <= 768 "
                              "and no norm (x only)");
    const auto kernel = I <= kChunk * kWarps       ? one_down_pair_kernel<1>
                        : I <= kChunk * kWarps * 2 ? one_down_pair_kernel<2>
                                                   : one_down_pair_kernel<3>;
    const size_t smem = pair_smem(I);
    ZEST_RETURN_IF_ERROR(cuda_status(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),
                                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                          static_cast<int>(smem)),
                                     "moe_experts_one: down kernel by rows"));
    return launch_cluster("moe_one_down_pair", kernel, dim3(2, H / kRows), dim3(kPairThreads), smem, stream, 2, p);
  }
  return launch("moe_one_down", one_down_kernel, dim3(dn_grid), block, 0, stream, p);
}

}  // namespace zest::cuda
