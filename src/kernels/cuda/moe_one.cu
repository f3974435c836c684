// Decode experts at one token (up to 8): gate/up then down, as rows_mma computes them (bf16 mma.m16n8k16, fp32 sums,
// the same k split over eight slices and fixed-order sums, so the same bits), arranged so that the 75 MB of expert
// weights of a Qwen3-30B-A3B layer stream without a gap between the two kernels:
// - gate/up: CTAs of 8 warps on (expert, 16 intermediate rows) items, 2 (or 3) CTAs per SM with 8 KB of shared
//   memory each, the weights register-streamed (16-byte loads used once) with 4 (or 2) 32-wide k chunks in flight
//   per warp and matrix; the 8 warps split k and are reduced in shared memory in fixed order; SiLU(gate) * up.
// - down: one CTA per SM owns a contiguous range of the (active expert, 16 output rows) tiles of the step. Before
//   its programmatic-dependent-launch wait it reads the MoE plan and bulk-copies (TMA, cp.async.bulk + mbarrier)
//   its tiles' weight rows into shared memory, so the down weights move while gate/up runs beside it; after the
//   wait it stages the h rows of its experts, and each warp multiplies one tile from shared memory (partial sums
//   kept per k slice, summed in slice order: rows_mma's order) and writes slot_out.
#include "kernels/cuda/moe_one.h"

#include <algorithm>
#include <string>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"

namespace zest::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kRows = 16;    // weight rows per tile (one m16 tile)
constexpr int kChunk = 32;   // k per chunk (two mma k16 steps)
constexpr int kSlices = 8;   // k slices (chunk % 8), summed in this order: rows_mma's eight warps
constexpr int kMaxTok = 8;   // token rows per pass (one n8 tile)
constexpr int kStageExperts = 32;  // a down CTA stages the plan entries of at most this many experts
constexpr int kStageRows = 64;     // and h rows, slot ids and routing weights of at most this many sorted positions
// Shared memory of a down CTA, at most: with it, two gate/up CTAs (8 KB each) fit beside it on an SM (228 KB).
constexpr size_t kMaxDownSmem = 200 * 1024;

struct OneParams {
  const bf16* x;         // [N, H]
  const bf16* gate_up;   // [E, 2I, H]
  const bf16* down;      // [E, H, I]
  bf16* h;               // [N * K, I] by sorted position
  float* slot_out;       // [N * K, H]
  const float* route_w;  // [N * K]
  MoePlan plan;
  int K, H, I;
  int max_tiles;  // down tiles one CTA's shared memory holds
  int hs_rows;    // h rows the down CTA's shared memory holds after its tiles
  int max_active;  // active experts at most (min(E, N * K))
  uint64_t* stamps_gu;  // optional: gate/up CTA b writes [2b] after its wait, [2b + 1] at its end (globaltimer)
  uint64_t* stamps_dn;  // optional: down CTA b writes [5b ..]: entry, copies issued, after the wait, tiles landed, end
};

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ld_stream with an L2 cache policy.
__device__ __forceinline__ uint4 ld_stream_ef(const void* ptr, uint64_t pol) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(ptr), "l"(pol));
  return r;
}

__device__ __forceinline__ void prefetch_l2(const void* ptr, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(ptr), "r"(bytes) : "memory");
}

// kL2Down of one_gate_up_kernel: this CTA's share of the down tiles of the n_active experts, one tile (16 contiguous
// weight rows) per lane and prefetch, the lanes' expert ids loaded at once.
__device__ __forceinline__ void l2_down_share(const OneParams& p, int n_active, int lane) {
  const int dtiles = p.H / kRows, total = n_active * dtiles;
  const int t0 = static_cast<int>(static_cast<long long>(blockIdx.x) * total / gridDim.x);
  const int t1 = static_cast<int>(static_cast<long long>(blockIdx.x + 1) * total / gridDim.x);
  const uint32_t bytes = static_cast<uint32_t>(kRows) * p.I * 2;
  for (int tile = t0 + lane; tile < t1; tile += 32) {
    const size_t row = static_cast<size_t>(p.plan.active_experts[tile / dtiles]) * p.H + (tile % dtiles) * kRows;
    prefetch_l2(p.down + row * p.I, bytes);
  }
}

// gate/up: item = (active expert j, 16 intermediate rows); warp w takes chunks w, w + 8, ... of k (kU of them in
// flight per matrix), as rows_mma_kernel<kGateUp> does. CTA b takes items b, b + G, b + 2G, ... (G = grid), or with
// kClaim item b, then items from G on in claim order from the plan's item counter (MoePlan::ready[E + 1], zeroed by
// the plan build; the last CTA to finish zeroes it and the finished-CTA count ready[E] again), each claim issued when
// the item before it starts. kPrefetch (static order; cp.async.bulk.prefetch.L2 by warp 0 once its first loads of
// an item are issued, one weight row per lane): 1 = the CTA's next item (its 32 weight rows); 2 = also the current
// item's k beyond its first round of loads, so that the later rounds read L2. kL2Down: this CTA's equal share of the step's down weights is
// prefetched into L2 (l2_down_share) so that HBM streams them while gate/up runs and the down kernel reads L2: 1 = by
// a ninth warp right after the wait (the eight mma warps then synchronise on named barrier 1); 2 = by warp 0 once its
// first round of loads is issued. kEvictFirst: the weight loads carry an L2 evict-first policy (so they do not push
// the prefetched down weights out of L2). kRegs: the register cap.
template <int kU, int kMinBlocks, bool kClaim, int kPrefetch, int kL2Down = 0, bool kEvictFirst = false,
          int kRegs = kMinBlocks == 2 ? 96 : 64>
__global__ void __launch_bounds__((kWarps + (kL2Down == 1)) * 32, kMinBlocks) __maxnreg__(kRegs)
    one_gate_up_kernel(OneParams p) {
  // Every CTA waits first, before any exit: the down kernel starts only once each CTA of this grid has passed this
  // wait (pdl_wait triggers the dependents after it), i.e. after the kernel that built the plan has completed; the
  // down kernel reads the plan before its own wait on that basis.
  pdl_wait();
  if (p.stamps_gu && threadIdx.x == 0) p.stamps_gu[2 * blockIdx.x] = global_ns();
  __shared__ float red[kWarps][8][32];
  __shared__ int next_item;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int tiles = p.I / kRows;
  // The first item's expert and slot range are loaded beside the active count (one round trip instead of two), from
  // an index clamped into the plan's arrays in case the item does not exist.
  const int jf = min(static_cast<int>(blockIdx.x) / tiles, p.plan.experts - 1);
  const int ef = p.plan.active_experts[jf], begf = p.plan.offsets[jf], endf = p.plan.offsets[jf + 1];
  const int items = *p.plan.num_active * tiles;
  const int chunks = p.H / kChunk;
  if (kL2Down == 1 && warp == kWarps) {
    l2_down_share(p, items / tiles, lane);
    return;
  }
  // The mma warps' barrier: all threads, or the eight mma warps beside the prefetch warp.
  auto sync = [] {
    if constexpr (kL2Down == 1) {
      asm volatile("bar.sync 1, %0;" ::"n"(kWarps * 32) : "memory");
    } else {
      __syncthreads();
    }
  };
  uint64_t pol = 0;
  if constexpr (kEvictFirst) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  uint32_t* const counter = p.plan.ready + p.plan.experts + 1;
  uint32_t* const finished = p.plan.ready + p.plan.experts;
  for (int item = blockIdx.x; item < items;) {
    const bool first = item == static_cast<int>(blockIdx.x);
    int claim = items;
    if (kClaim && threadIdx.x == 0) claim = static_cast<int>(atomicAdd(counter, 1u)) + gridDim.x;
    const int j = item / tiles, r0 = (item % tiles) * kRows;
    const int e = first ? ef : p.plan.active_experts[j];
    const int beg = first ? begf : p.plan.offsets[j], end = first ? endf : p.plan.offsets[j + 1];
    const bf16* lo0 = p.gate_up + (static_cast<size_t>(e) * 2 * p.I + r0 + g) * p.H + tq * 8;
    const bf16* hi0 = lo0 + static_cast<size_t>(8) * p.H;
    const bf16* lo1 = lo0 + static_cast<size_t>(p.I) * p.H;  // up rows
    const bf16* hi1 = hi0 + static_cast<size_t>(p.I) * p.H;
    for (int c0 = beg; c0 < end; c0 += kMaxTok) {
      const int nt = min(kMaxTok, end - c0);
      const bf16* xp =
          g < nt ? p.x + static_cast<size_t>(p.plan.sorted_slots[c0 + g] / p.K) * p.H + tq * 8 : nullptr;
      float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
      for (int cb = warp; cb < chunks; cb += kWarps * kU) {
        uint4 a[kU][4];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const size_t k = static_cast<size_t>(cb + u * kWarps) * kChunk;
          const bool ok = cb + u * kWarps < chunks;
          const uint4 z = make_uint4(0, 0, 0, 0);
          if constexpr (kEvictFirst) {
            a[u][0] = ok ? ld_stream_ef(lo0 + k, pol) : z;
            a[u][1] = ok ? ld_stream_ef(hi0 + k, pol) : z;
            a[u][2] = ok ? ld_stream_ef(lo1 + k, pol) : z;
            a[u][3] = ok ? ld_stream_ef(hi1 + k, pol) : z;
          } else {
            a[u][0] = ok ? ld_stream(lo0 + k) : z;
            a[u][1] = ok ? ld_stream(hi0 + k) : z;
            a[u][2] = ok ? ld_stream(lo1 + k) : z;
            a[u][3] = ok ? ld_stream(hi1 + k) : z;
          }
        }
        if (kPrefetch > 0 && !kClaim && warp == 0 && cb == 0 && c0 == beg) {
          // Lane l: row l % 16 of the gate (l < 16) or up (l >= 16) block.
          const size_t lane_row = (lane & 15) + (lane >> 4) * static_cast<size_t>(p.I);
          constexpr int kFirst = kWarps * kU * kChunk;  // k of the first round of loads
          if (kPrefetch == 2 && p.H > kFirst) {
            const size_t row = static_cast<size_t>(e) * 2 * p.I + r0 + lane_row;
            prefetch_l2(p.gate_up + row * p.H + kFirst, static_cast<uint32_t>(p.H - kFirst) * 2);
          }
          const int nx = item + gridDim.x;
          if (nx < items) {
            const size_t row = static_cast<size_t>(p.plan.active_experts[nx / tiles]) * 2 * p.I +
                               (nx % tiles) * kRows + lane_row;
            prefetch_l2(p.gate_up + row * p.H, static_cast<uint32_t>(p.H) * 2);
          }
        }
        if (kL2Down == 2 && warp == 0 && first && cb == 0 && c0 == beg) l2_down_share(p, items / tiles, lane);
        // Token fragments (L1 hits after the first item) after the weight loads, so they do not hold registers
        // while the weights are in flight.
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
      sync();
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
      sync();
    }
    if constexpr (kClaim) {
      if (threadIdx.x == 0) next_item = claim;
      sync();
      item = next_item;
      sync();
    } else {
      item += gridDim.x;
    }
  }
  if (p.stamps_gu && threadIdx.x == 0) p.stamps_gu[2 * blockIdx.x + 1] = global_ns();
  if constexpr (kClaim) {
    if (threadIdx.x == 0) {
      __threadfence();
      if (atomicAdd(finished, 1u) == gridDim.x - 1) {
        *counter = 0u;
        *finished = 0u;
      }
    }
  }
}

// down without shared-memory tiles: item = (active expert j, 16 output rows); warp w takes chunks w, w + 8, ... of k
// (kU in flight), the warps' partial sums reduced in shared memory in fixed order, as rows_mma_kernel<kDown> does;
// 3 CTAs per SM. kPre: before its wait the CTA loads the weights of its first item's first round into registers and
// prefetches its later items' weights into L2 (the plan is read before the wait as one_down_kernel explains; its
// first item's expert and the later items' experts are loaded beside the active count), so that the down weights
// stream while the gate/up CTAs that finish last are still running.
template <int kU, bool kPre = false>
__global__ void __launch_bounds__(kWarps * 32, 3) one_down_reg_kernel(OneParams p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int tiles = p.H / kRows;
  const int chunks = p.I / kChunk;
  uint4 lo[kU], hi[kU];  // a round of weight fragments (the first item's first round loaded before the wait: kPre)
  bool pre = false;
  if constexpr (kPre) {
    const int jf = min(static_cast<int>(blockIdx.x) / tiles, p.plan.experts - 1);
    const int nx = blockIdx.x + (lane + 1) * gridDim.x;  // warp 0, lanes 0-3: the later items
    const int jx = min(nx / tiles, p.plan.experts - 1);
    const int ef = __ldcg(p.plan.active_experts + jf);
    const int ex = warp == 0 && lane < 4 ? __ldcg(p.plan.active_experts + jx) : 0;
    const int nitems = __ldcg(p.plan.num_active) * tiles;
    pre = static_cast<int>(blockIdx.x) < nitems;
    if (pre) {
      const bf16* lo0 = p.down + (static_cast<size_t>(ef) * p.H + (blockIdx.x % tiles) * kRows + g) * p.I + tq * 8;
      const bf16* hi0 = lo0 + static_cast<size_t>(8) * p.I;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const size_t k = static_cast<size_t>(warp + u * kWarps) * kChunk;
        const bool ok = warp + u * kWarps < chunks;
        lo[u] = ok ? ld_stream(lo0 + k) : make_uint4(0, 0, 0, 0);
        hi[u] = ok ? ld_stream(hi0 + k) : make_uint4(0, 0, 0, 0);
      }
    }
    if (warp == 0 && lane < 4 && nx < nitems)
      prefetch_l2(p.down + (static_cast<size_t>(ex) * p.H + (nx % tiles) * kRows) * p.I,
                  static_cast<uint32_t>(kRows) * p.I * 2);
  }
  pdl_wait();
  __shared__ float red[kWarps][4][32];
  const int items = *p.plan.num_active * tiles;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int j = item / tiles, r0 = (item % tiles) * kRows;
    const int e = p.plan.active_experts[j];
    const int beg = p.plan.offsets[j], end = p.plan.offsets[j + 1];
    const bf16* lo0 = p.down + (static_cast<size_t>(e) * p.H + r0 + g) * p.I + tq * 8;
    const bf16* hi0 = lo0 + static_cast<size_t>(8) * p.I;
    for (int c0 = beg; c0 < end; c0 += kMaxTok) {
      const int nt = min(kMaxTok, end - c0);
      const bf16* xp = g < nt ? p.h + static_cast<size_t>(c0 + g) * p.I + tq * 8 : nullptr;
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      for (int cb = warp; cb < chunks; cb += kWarps * kU) {
        uint4 xa[kU];
        const bool use_pre = kPre && pre && item == static_cast<int>(blockIdx.x) && c0 == beg && cb == warp;
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const size_t k = static_cast<size_t>(cb + u * kWarps) * kChunk;
          const bool ok = cb + u * kWarps < chunks;
          const uint4 z = make_uint4(0, 0, 0, 0);
          if (!use_pre) {
            lo[u] = ok ? ld_stream(lo0 + k) : z;
            hi[u] = ok ? ld_stream(hi0 + k) : z;
          }
          xa[u] = ok && xp ? __ldg(reinterpret_cast<const uint4*>(xp + k)) : z;
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
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
}

// Rotation (bytes) of local weight row r inside its own rb bytes in the down CTA's shared memory: odd rows start 64
// bytes into a 128-byte bank window, even rows at 0, so the two rows a quarter-warp reads (g, g + 1) hit distinct banks.
__device__ __forceinline__ uint32_t row_rot(int r, uint32_t rb) {
  const uint32_t want = (r & 1) * 64u, have = (static_cast<uint32_t>(r) * rb) & 127u;
  return (want - have) & 127u;
}

// 16 bytes at byte b of local weight row r (rotated).
__device__ __forceinline__ uint4 ld_row(const unsigned char* base, int r, uint32_t rb, uint32_t rot, uint32_t b) {
  uint32_t o = b + rot;
  if (o >= rb) o -= rb;
  return *reinterpret_cast<const uint4*>(base + static_cast<size_t>(r) * rb + o);
}

// down: CTA b owns tiles [b * T / G, (b + 1) * T / G) of the T = num_active * H / 16 (active expert, 16 output rows)
// tiles; warp w multiplies local tiles w, w + kDnWarps, ... kEarly: the weight copies are issued before the PDL wait.
template <bool kEarly, int kDnWarps = kWarps>
__global__ void __maxnreg__(64) one_down_kernel(OneParams p) {
  extern __shared__ __align__(128) unsigned char sm[];
  __shared__ __align__(8) uint64_t bar;
  __shared__ int s_off[kStageExperts + 1];  // offsets of the CTA's experts jlo .. jhi + 1
  __shared__ int s_slot[kStageRows];        // sorted_slots and routing weights of positions pos_lo .. pos_hi - 1
  __shared__ float s_w[kStageRows];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int tiles = p.H / kRows;
  const uint32_t rb = static_cast<uint32_t>(p.I) * 2;
  uint64_t* const stamp = p.stamps_dn && threadIdx.x == 0 ? p.stamps_dn + 5 * blockIdx.x : nullptr;
  if (stamp) stamp[0] = global_ns();
  if (!kEarly) pdl_wait();
  // Before the wait (kEarly) the plan is read at L2 (ld.global.cg): this grid starts only after every CTA of the
  // gate/up grid has passed its own wait, so the kernel that built the plan (the one gate/up waits on, or an earlier
  // one) has completed and its writes are visible. The down weights are never written by a kernel.
  // The experts of this CTA's tiles are loaded beside the active count, for the tile range the CTA has when every
  // expert the launch allows is active (always so at one token without folded slots): one round trip instead of two
  // before the copies go out, which matters because these loads queue behind gate/up's weight stream.
  const int max_total = p.max_active * tiles;
  const int sj = static_cast<int>(static_cast<long long>(blockIdx.x) * max_total / gridDim.x) / tiles;
  int ex = sj + lane < p.plan.experts ? __ldcg(p.plan.active_experts + sj + lane) : 0;
  const int total = __ldcg(p.plan.num_active) * tiles;
  const int t0 = static_cast<int>(static_cast<long long>(blockIdx.x) * total / gridDim.x);
  const int t1 = static_cast<int>(static_cast<long long>(blockIdx.x + 1) * total / gridDim.x);
  const int nt = min(t1 - t0, p.max_tiles);  // t1 - t0 <= max_tiles by the host's sizing
  if (warp == 0) {
    int jb = sj;
    if (total != max_total) {  // fewer experts: the range's own experts, one round trip more
      jb = t0 / tiles;
      ex = jb + lane < p.plan.experts ? __ldcg(p.plan.active_experts + jb + lane) : 0;
    }
    if (lane == 0) {
      mbar_init(&bar);
      mbar_arrive_expect_tx(&bar, static_cast<uint32_t>(nt) * kRows * rb);
    }
    __syncwarp();
    for (int base = 0; base < nt * kRows; base += 32) {
      const int r = base + lane;
      const int tile = t0 + min(r, nt * kRows - 1) / kRows;
      const int j = tile / tiles;
      const int from = __shfl_sync(0xffffffffu, ex, (j - jb) & 31);
      if (r >= nt * kRows) continue;
      const int e = j - jb < 32 ? from : __ldcg(p.plan.active_experts + j);
      const int row = (tile % tiles) * kRows + r % kRows;
      const unsigned char* src =
          reinterpret_cast<const unsigned char*>(p.down + (static_cast<size_t>(e) * p.H + row) * p.I);
      unsigned char* dst = sm + static_cast<size_t>(r) * rb;
      const uint32_t rot = row_rot(r, rb);
      if (rot == 0) {
        bulk_load(dst, src, rb, &bar);
      } else {
        bulk_load(dst + rot, src, rb - rot, &bar);
        bulk_load(dst, src + (rb - rot), rot, &bar);
      }
    }
  }
  // The experts of this CTA's tiles, their slot ranges, slot ids and routing weights (all written before this launch
  // began, like the plan) are staged in shared memory when they fit, so that after the wait only h is read.
  const int jlo = t0 / tiles, jhi = nt > 0 ? (t0 + nt - 1) / tiles : jlo - 1;
  int pos_lo = 0, pos_hi = 0;
  if (nt > 0) {
    pos_lo = __ldcg(p.plan.offsets + jlo);
    pos_hi = __ldcg(p.plan.offsets + jhi + 1);
  }
  const bool staged = nt > 0 && pos_hi - pos_lo <= p.hs_rows && jhi - jlo < kStageExperts;
  if (staged) {
    for (int i = threadIdx.x; i <= jhi - jlo + 1; i += blockDim.x) s_off[i] = __ldcg(p.plan.offsets + jlo + i);
    for (int i = threadIdx.x; i < pos_hi - pos_lo; i += blockDim.x) {
      const int slot = __ldcg(p.plan.sorted_slots + pos_lo + i);
      s_slot[i] = slot;
      s_w[i] = __ldcg(p.route_w + slot);
    }
  }
  __syncthreads();
  if (stamp) stamp[1] = global_ns();
  if (kEarly) pdl_wait();
  if (stamp) {
    stamp[2] = global_ns();
    mbar_wait(&bar, 0);
    stamp[3] = global_ns();
  }
  if (nt <= 0) {
    if (stamp) stamp[4] = global_ns();
    return;
  }
  // h rows (by sorted position) of the experts of this CTA's tiles, staged once for all warps when they fit.
  unsigned char* hs = sm + static_cast<size_t>(p.max_tiles) * kRows * rb;
  if (staged) {
    const uint4* src = reinterpret_cast<const uint4*>(p.h + static_cast<size_t>(pos_lo) * p.I);
    const int n16 = (pos_hi - pos_lo) * static_cast<int>(rb / 16);
    for (int v = threadIdx.x; v < n16; v += blockDim.x) reinterpret_cast<uint4*>(hs)[v] = __ldg(src + v);
  }
  __syncthreads();
  mbar_wait(&bar, 0);
  const int chunks = p.I / kChunk;
  for (int ti = warp; ti < nt; ti += kDnWarps) {
    const int tile = t0 + ti, j = tile / tiles, r0 = (tile % tiles) * kRows;
    const int beg = staged ? s_off[j - jlo] : p.plan.offsets[j];
    const int end = staged ? s_off[j - jlo + 1] : p.plan.offsets[j + 1];
    const int rlo = ti * kRows + g, rhi = rlo + 8;
    const uint32_t rot_lo = row_rot(rlo, rb), rot_hi = row_rot(rhi, rb);
    for (int c0 = beg; c0 < end; c0 += kMaxTok) {
      const int ntok = min(kMaxTok, end - c0);
      const unsigned char* xrow = nullptr;
      if (g < ntok)
        xrow = staged ? hs + static_cast<size_t>(c0 + g - pos_lo) * rb
                      : reinterpret_cast<const unsigned char*>(p.h + static_cast<size_t>(c0 + g) * p.I);
      // Slice s = chunks s, s + 8, ... in ascending order (one rows_mma warp's partial sum), added to the total in
      // slice order, as rows_mma's fixed-order reduction over its eight warps does.
      // Four slices at a time (independent mma chains).
      float tot[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int s0 = 0; s0 < kSlices; s0 += 4) {
        float acc[4][4];
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[q][i] = 0.f;
        for (int c = s0; c < chunks; c += kSlices) {
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            if (c + q >= chunks) break;
            const uint32_t b = static_cast<uint32_t>(c + q) * kChunk * 2 + tq * 16;
            const uint4 lo = ld_row(sm, rlo, rb, rot_lo, b), hi = ld_row(sm, rhi, rb, rot_hi, b);
            uint4 xb = make_uint4(0, 0, 0, 0);
            if (xrow)
              xb = staged ? *reinterpret_cast<const uint4*>(xrow + b)
                          : __ldg(reinterpret_cast<const uint4*>(xrow + b));
            mma16816(acc[q], lo.x, hi.x, lo.y, hi.y, xb.x, xb.y);
            mma16816(acc[q], lo.z, hi.z, lo.w, hi.w, xb.z, xb.w);
          }
        }
#pragma unroll
        for (int q = 0; q < 4; ++q)
#pragma unroll
          for (int i = 0; i < 4; ++i) tot[i] += acc[q][i];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int t = tq * 2 + (i & 1);
        if (t >= ntok) continue;
        const float v = tot[i];
        const int row = r0 + g + (i >> 1) * 8;
        const int slot = staged ? s_slot[c0 + t - pos_lo] : p.plan.sorted_slots[c0 + t];
        const float rw = staged ? s_w[c0 + t - pos_lo] : p.route_w[slot];
        p.slot_out[static_cast<size_t>(slot) * p.H + row] = bf16_round(bf16_round(v) * rw);
      }
    }
  }
  if (p.stamps_dn) {
    __syncthreads();
    if (stamp) stamp[4] = global_ns();
  }
}

// Launch geometry for (N, K, E, H, I).
struct OneShape {
  int max_active = 0;  // active experts at most
  int gu_items = 0;    // gate/up items at most
  int dn_grid = 0;     // down CTAs
  int max_tiles = 0;   // down tiles per CTA at most
  int hs_rows = 0;     // h rows staged per down CTA
  size_t dn_smem = 0;  // dynamic shared memory of a down CTA
};

OneShape one_shape(int N, int K, int E, int H, int I) {
  OneShape s;
  s.max_active = std::min(E, N * K);
  s.gu_items = s.max_active * (I / kRows);
  const int tiles = H / kRows, total = s.max_active * tiles;
  s.dn_grid = std::max(1, std::min(sm_count(), total));
  s.max_tiles = (total + s.dn_grid - 1) / s.dn_grid;
  // A range of max_tiles consecutive tiles touches at most this many experts; each has at most N slots when the
  // ids of a token are distinct (else the down CTA reads h from global memory instead).
  const int experts = std::min(s.max_active, (s.max_tiles + tiles - 1) / tiles + 1);
  s.hs_rows = std::min({N * K, experts * N, kStageRows});
  s.dn_smem = (static_cast<size_t>(s.max_tiles) * kRows + s.hs_rows) * static_cast<size_t>(I) * 2;
  return s;
}

// Dynamic shared memory limit of a kernel, and (max_shared) the preference for the largest shared-memory carveout,
// which kernels that must fit beside a down CTA holding its tiles ask for.
template <typename Kernel>
Status configure(Kernel kernel, size_t smem, bool max_shared) {
  const void* f = reinterpret_cast<const void*>(kernel);
  ZEST_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)), "moe_one smem"));
  if (!max_shared) return Status::ok();
  return cuda_status(
      cudaFuncSetAttribute(f, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared),
      "moe_one carveout");
}

using OneKernel = void (*)(OneParams);

// The kernels of a variant: gate/up with its CTAs per SM, down with its warps per CTA.
struct OneVariant {
  OneKernel gate_up;
  int per_sm;  // gate/up CTAs per SM
  int gate_up_warps;
  OneKernel down;
  int down_warps;
  bool down_reg = false;  // one_down_reg_kernel: 3 CTAs per SM on the down items, no dynamic shared memory
};

OneVariant variant_kernels(int variant) {
  switch (variant) {
    case 1: return {one_gate_up_kernel<4, 2, false, 0>, 2, kWarps, one_down_kernel<false>, kWarps};
    case 2: return {one_gate_up_kernel<2, 3, false, 0>, 3, kWarps, one_down_kernel<true>, kWarps};
    case 3: return {one_gate_up_kernel<4, 2, true, 0>, 2, kWarps, one_down_kernel<true>, kWarps};
    case 4: return {one_gate_up_kernel<4, 2, false, 1>, 2, kWarps, one_down_kernel<true>, kWarps};
    case 5: return {one_gate_up_kernel<4, 2, false, 2>, 2, kWarps, one_down_kernel<true>, kWarps};
    case 6: return {one_gate_up_kernel<4, 2, false, 0>, 2, kWarps, one_down_kernel<true, 4>, 4};
    case 7: return {one_gate_up_kernel<4, 2, false, 0, 1>, 2, kWarps + 1, one_down_kernel<false>, kWarps};
    case 8: return {one_gate_up_kernel<4, 2, false, 0, 1>, 2, kWarps + 1, one_down_kernel<true, 4>, 4};
    case 9: return {one_gate_up_kernel<2, 3, false, 0, 2, true, 80>, 3, kWarps, one_down_kernel<false>, kWarps};
    case 10: return {one_gate_up_kernel<2, 3, false, 0, 2, false, 80>, 3, kWarps, one_down_kernel<false>, kWarps};
    case 11: return {one_gate_up_kernel<2, 3, false, 0, 0, false, 80>, 3, kWarps, one_down_kernel<false>, kWarps};
    case 12: return {one_gate_up_kernel<2, 3, false, 2, 2, true, 80>, 3, kWarps, one_down_kernel<false>, kWarps};
    case 13: return {one_gate_up_kernel<2, 3, false, 2, 0, true, 80>, 3, kWarps, one_down_kernel<false>, kWarps};
    case 14: return {one_gate_up_kernel<2, 3, false, 0, 2, true, 80>, 3, kWarps, one_down_reg_kernel<4>, kWarps, true};
    case 15: return {one_gate_up_kernel<2, 3, false, 2, 2, true, 80>, 3, kWarps, one_down_reg_kernel<4>, kWarps, true};
    case 16: return {one_gate_up_kernel<2, 3, false, 0, 0, false, 80>, 3, kWarps, one_down_reg_kernel<4>, kWarps, true};
    case 17:
      return {one_gate_up_kernel<2, 3, false, 0, 0, false, 80>, 3, kWarps, one_down_reg_kernel<4, true>, kWarps, true};
    default: return {one_gate_up_kernel<4, 2, false, 0>, 2, kWarps, one_down_kernel<true>, kWarps};
  }
}

Status configure_all() {
  static const Status st = []() -> Status {
    for (int v = 0; v < kOneVariants; ++v) {
      const OneVariant k = variant_kernels(v);
      const bool beside = v <= 8;  // variants 0-8: down CTAs copy their tiles while gate/up runs beside them
      ZEST_RETURN_IF_ERROR(configure(k.gate_up, 0, beside));
      ZEST_RETURN_IF_ERROR(configure(k.down, k.down_reg ? 0 : kMaxDownSmem, beside));
    }
    return Status::ok();
  }();
  return st;
}

}  // namespace

bool moe_one_ok(int N, int K, int E, int H, int I) {
  if (N < 1 || N > kMaxTok || K < 1 || E < 1 || K > E || H < kRows || I < 64) return false;
  if (H % kChunk != 0 || I % kChunk != 0) return false;
  return one_shape(N, K, E, H, I).dn_smem <= kMaxDownSmem;
}

void moe_one_grids(int N, int K, int E, int H, int I, int variant, int* gate_up_grid, int* down_grid) {
  const OneShape s = one_shape(N, K, E, H, I);
  *gate_up_grid = std::min(variant_kernels(variant).per_sm * sm_count(), s.gu_items);
  const OneVariant k = variant_kernels(variant);
  *down_grid = k.down_reg ? std::min(3 * sm_count(), s.max_active * (H / kRows)) : s.dn_grid;
}

Status moe_experts_one(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up, const bf16* down,
                       bf16* h, float* slot_out, int N, int K, int E, int H, int I, int variant, cudaStream_t stream,
                       uint64_t* stamps) {
  if (!moe_one_ok(N, K, E, H, I))
    return invalid_argument("moe_experts_one: unsupported sizes (need 1 <= N <= 8, K <= E, H and I multiples of 32, "
                            "I >= 64 and a down share within shared memory; N=" + std::to_string(N) +
                            " K=" + std::to_string(K) + " E=" + std::to_string(E) + " H=" + std::to_string(H) +
                            " I=" + std::to_string(I) + ")");
  if (variant < 0 || variant >= kOneVariants)
    return invalid_argument("moe_experts_one: variant " + std::to_string(variant) + " out of range");
  ZEST_RETURN_IF_ERROR(configure_all());
  const OneShape s = one_shape(N, K, E, H, I);
  int gu_grid = 0, dn_grid = 0;
  moe_one_grids(N, K, E, H, I, variant, &gu_grid, &dn_grid);
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
  p.max_tiles = s.max_tiles;
  p.max_active = s.max_active;
  p.hs_rows = s.hs_rows;
  p.stamps_gu = stamps;
  p.stamps_dn = stamps ? stamps + 2 * static_cast<size_t>(gu_grid) : nullptr;
  const OneVariant k = variant_kernels(variant);
  ZEST_RETURN_IF_ERROR(launch("moe_one_gate_up", k.gate_up, dim3(gu_grid), dim3(k.gate_up_warps * 32), 0, stream, p));
  return launch("moe_one_down", k.down, dim3(dn_grid), dim3(k.down_warps * 32), k.down_reg ? 0 : s.dn_smem, stream, p);
}

}  // namespace zest::cuda
