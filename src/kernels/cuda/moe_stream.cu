// Decode experts as one persistent weight-streaming kernel (see moe_stream.h).
//
// Work items, in this order: gate/up items (active expert j, 8 MT intermediate rows), expert-major, then down items
// (active expert j, 16 MT output rows). A stage of the ring holds MT m16 tiles of weight rows x KC columns (gate/up:
// each tile 8 gate rows then the 8 matching up rows, so a thread holds the gate and up values of the same intermediate
// index) and up to TG (8 or 16) token rows x KC (x rows for gate/up, h rows by sorted position for down), each row one
// bulk copy; an expert with more tokens takes several passes. The producer warps (after the consumers; each copies
// every P-th row of a stage: the copies of one warp are issued one after another, so several producers multiply the
// copy rate) and the consumer warps walk the same (item, token pass, k chunk) sequence. Consumer warp w takes the
// 32-wide k steps w, w + 4, ... of every chunk (the same split for every KC, so the variants agree bit for bit) and
// the four partial sums are reduced in fixed order through shared memory (double-buffered: one named barrier per
// pass); warp 0 writes the outputs, or (EPI variants) a dedicated epilogue warp after the producers does, so that the
// consumer warps go on to the next pass at once (they wait only when both partial-sum buffers are still unread).
//
// Items are handed out dynamically in strict order: lane 0 of the first producer warp claims the next item number
// from the plan's item counter (one atomic add, one item ahead of the one it copies; AHEAD variants two ahead, with
// the item's expert and token range loaded early and posted along) and passes it to the other warps of its CTA through
// a small ring of item words guarded by mbarriers. Down items of expert j need all of j's h rows: after a gate/up
// item's last pass, the warp that wrote them publishes its h stores and adds 1 to ready[j] (release); the producer
// issues a down stage's weight copies, then waits (acquire) until ready[j] counts all of j's gate/up items before it
// copies h rows. Because items are claimed in order, every gate/up item has been claimed by a running CTA before any
// down item is claimed, and a running CTA finishes its gate/up items without waiting on anything: no wait depends on
// a CTA that is not resident, so the kernel completes however few of its CTAs fit on the GPU (another kernel on
// another stream may hold the rest). The counters are the plan's (MoePlan::ready: per-expert counts, then the item
// counter; zeroed by every plan build), so launches on different plans may overlap in time. A launch leaves them
// spent: a plan is launched on again only after it is built again or moe_plan_reset_counters has run.
#include <cuda.h>

#include <cstring>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/moe_stream.h"

namespace zest::cuda {

namespace {

constexpr int kConsumers = 4;                     // consumer warps 0-3; warps 4 .. 3 + P are the producers
// Then, with EPI, one epilogue warp (4 + P).
constexpr int threads(int P, bool EPI) { return (kConsumers + P + (EPI ? 1 : 0)) * 32; }
// Named barriers of the EPI variants: partial sums of buffer b written (kFullBar + b), read (kFreeBar + b).
constexpr int kFullBar = 2, kFreeBar = 4;
constexpr int kTileRows = 16;                     // weight rows of one mma m16 tile
constexpr int kMaxTokG = 16;                      // tokens per pass: at most two n8 tiles
constexpr int kPadBytes = 64;                     // after each shared row: rows g and g+1 fall in different banks
constexpr int kWidthStep = 64;                    // H and I multiples of this: chunks are whole 32-wide k steps
constexpr int kBarBytes = 1024;                   // mbarriers (full, empty [NS], item_full, item_empty [R]), item words
constexpr int kItemRing = 8;                      // R: items claimed and not yet taken by every warp of the CTA
constexpr int kItemWords = 768;                   // byte offset of the item words int4 [R] inside the barrier block
// Shared memory before the ring: mbarriers, then partial sums (two buffers of [warp][MT * 8 values][lane]).
constexpr int head_bytes(int MT) { return kBarBytes + 2 * kConsumers * MT * 8 * 32 * 4; }
constexpr int kMaxExperts = 1024;
constexpr int kFp8Width = 256;                    // FP8: H and I multiples of this (whole 256-column stages)

// A ring stage: RA = 16 MT weight rows, then TG token rows, each KC columns. A gate/up item covers GU = 8 MT
// intermediate rows: stage rows [0, GU) are its gate rows, [GU, 2 GU) the matching up rows, and m16 tile m takes gate
// rows 8m .. 8m+7 (tile rows 0-7) and the matching up rows (tile rows 8-15). A down item's rows are in order. BOX:
// the weight rows come as 2-D tensor boxes (dense rows, KC <= 256); else each row is one 1-D copy (rows padded so
// that rows g and g+1 fall in different banks). F8 (block-wise FP8 weights, BOX only): weight rows of KC bytes, then
// the token rows, then the stage's weight scales (f32 per 16 rows x 64 columns, Fp8Weight's layout): [RA / 16 row
// groups][KC / 64 chunks], a gate/up stage's gate groups at kScaleOff and its up groups 128 bytes on.
template <int KC, int TG, int MT, bool BOX, bool F8 = false>
struct Ring {
  static_assert(TG == 8 || TG == kMaxTokG, "one or two n8 tiles");
  static_assert(MT == 1 || MT == 2 || MT == 4, "one, two or four m16 tiles");
  static_assert(!BOX || KC <= 256, "a tensor box has at most 256 columns");
  static_assert(!F8 || (BOX && MT >= 2 && KC % 256 == 0), "FP8: tensor boxes of whole 16-row scale groups");
  static constexpr int RA = kTileRows * MT;
  static constexpr int GU = 8 * MT;
  static constexpr int kRowBytes = KC * 2 + (BOX ? 0 : kPadBytes);  // token rows (and bf16 weight rows)
  static constexpr int kWRowBytes = F8 ? KC : kRowBytes;            // weight rows
  static constexpr int kTokOff = RA * kWRowBytes;                   // the token rows' offset in a stage
  static constexpr int kScaleOff = kTokOff + TG * kRowBytes;        // F8: the scales' offset (128-byte aligned)
  static constexpr int kScaleBytes = F8 ? 256 : 0;
  static constexpr int kSlotBytes = kScaleOff + kScaleBytes;
  static constexpr int kHead = head_bytes(MT);
};

struct StreamArgs {
  const bf16* x;
  const bf16* gate_up;
  const bf16* down;
  bf16* h;
  float* slot_out;
  const float* route_w;
  MoePlan plan;
  int K, H, I, NK;
};

// mbar_wait that traps after kWatchdogNs (a lost arrival ends the kernel with an error instead of a hang).
__device__ __forceinline__ void mbar_wait_or_trap(uint32_t bar, uint32_t parity) {
  if (mbar_try_wait(bar, parity)) return;
  const uint64_t t0 = global_ns();
  while (!mbar_try_wait(bar, parity))
    if (global_ns() - t0 > kWatchdogNs) __trap();
}

__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

__device__ __forceinline__ void consumer_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumers * 32) : "memory");
}

// The consumer warps and the epilogue warp (EPI variants) on named barrier `id`: wait, or arrive without waiting.
__device__ __forceinline__ void epi_sync(int id) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "n"((kConsumers + 1) * 32) : "memory");
}
__device__ __forceinline__ void epi_arrive(int id) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "n"((kConsumers + 1) * 32) : "memory");
}

// One 32-wide k step: thread (g, q) holds k = 8q .. 8q+7 of A rows g and g+8 and of token row g; both operands use
// the same permutation of k (mma k' 2q, 2q+1, 2q+8, 2q+9 <- k 8q .. 8q+3, then 8q+4 .. 8q+7).
__device__ __forceinline__ void mma_k32(float* c, const uint4& lo, const uint4& hi, const uint4& b) {
  mma16816(c, lo.x, hi.x, lo.y, hi.y, b.x, b.y);
  mma16816(c, lo.z, hi.z, lo.w, hi.w, b.z, b.w);
}

// The item list shared by producer and consumers.
struct Item {
  bool gu;
  int j, tile, e, beg, end;
};

__device__ __forceinline__ Item decode_item(const StreamArgs& a, int item, int n_gu, int gu_tiles, int dn_tiles) {
  Item it;
  it.gu = item < n_gu;
  const int idx = it.gu ? item : item - n_gu;
  const int tiles = it.gu ? gu_tiles : dn_tiles;
  it.j = idx / tiles;
  it.tile = idx - it.j * tiles;
  it.e = __ldg(a.plan.active_experts + it.j);
  it.beg = __ldg(a.plan.offsets + it.j);
  it.end = __ldg(a.plan.offsets + it.j + 1);
  return it;
}

// The CTA's sequence of items. Lane 0 of the claiming warp (the first producer warp) takes item numbers from the
// plan's counter, in the order of the atomic adds of every CTA, and posts each into item word n % R (after the item
// before it in that word has been taken by every other warp: item_empty, one arrival per reading thread), arriving on
// item_full; the other warps wait on item_full and read it. A number >= total ends the sequence. Without AHEAD the
// claiming warp claims one item ahead (the atomic's round trip overlaps the current item's copies) and every warp
// loads an item's expert and token range itself; with AHEAD it claims two ahead, loads the next item's expert and
// token range while the current one streams and posts them with the item, so no warp waits on a load when an item
// starts.
template <bool AHEAD>
struct ItemFeed {
  uint32_t bar;     // item_full[d] at bar + 8d, item_empty[d] at bar + 8 (R + d)
  int4* word;       // [R]: item, expert, first and end sorted position (AHEAD)
  uint32_t* counter;
  uint32_t n = 0;   // items taken so far
  // The claiming warp's lane 0: the next item to post (with AHEAD its expert and token range, loaded), the one
  // claimed after it.
  int nxt = 0, nxt_e = 0, nxt_beg = 0, nxt_end = 0, after = 0;

  __device__ __forceinline__ int claim() const { return static_cast<int>(atomicAdd(counter, 1u)); }

  __device__ __forceinline__ void load(const StreamArgs& a, int n_gu, int gu_tiles, int dn_tiles) {
    const Item it = decode_item(a, nxt, n_gu, gu_tiles, dn_tiles);
    nxt_e = it.e;
    nxt_beg = it.beg;
    nxt_end = it.end;
  }

  __device__ __forceinline__ void post(int4 w) {
    const int d = static_cast<int>(n % kItemRing);
    mbar_wait_or_trap(bar + 8 * (kItemRing + d), ((n / kItemRing) & 1u) ^ 1u);
    word[d] = w;
    mbar_arrive(bar + 8 * d);
  }

  // Claiming warp: posts the next item and claims ahead; every lane gets the item (and with AHEAD its range). The
  // kernel makes the first claims (nxt, with AHEAD also after) right after the wait on the previous kernel.
  __device__ __forceinline__ int4 next_claiming(int lane, int total, const StreamArgs& a, int n_gu, int gu_tiles,
                                                int dn_tiles) {
    int4 w = make_int4(0, 0, 0, 0);
    if (lane == 0) {
      if (AHEAD && n == 0 && nxt < total) load(a, n_gu, gu_tiles, dn_tiles);
      w = make_int4(nxt, nxt_e, nxt_beg, nxt_end);
      post(w);
      if (nxt < total) {
        if (AHEAD) {
          nxt = after;
          if (nxt < total) {
            load(a, n_gu, gu_tiles, dn_tiles);  // used at the next post
            after = claim();
          }
        } else {
          nxt = claim();
        }
      }
    }
    ++n;
    w.x = __shfl_sync(0xffffffffu, w.x, 0);
    if (AHEAD) {
      w.y = __shfl_sync(0xffffffffu, w.y, 0);
      w.z = __shfl_sync(0xffffffffu, w.z, 0);
      w.w = __shfl_sync(0xffffffffu, w.w, 0);
    }
    return w;
  }

  // Every other warp: the next posted item.
  __device__ __forceinline__ int4 next_reading() {
    const int d = static_cast<int>(n % kItemRing);
    mbar_wait_or_trap(bar + 8 * d, (n / kItemRing) & 1u);
    const int4 w = word[d];
    mbar_arrive(bar + 8 * (kItemRing + d));  // each thread releases its own read of the word
    ++n;
    return w;
  }
};

// The item of a posted word: with AHEAD its expert and token range come with it, else they are loaded.
template <bool AHEAD>
__device__ __forceinline__ Item item_of(const StreamArgs& a, int4 w, int n_gu, int gu_tiles, int dn_tiles) {
  if (!AHEAD) return decode_item(a, w.x, n_gu, gu_tiles, dn_tiles);
  Item it;
  it.gu = w.x < n_gu;
  const int idx = it.gu ? w.x : w.x - n_gu;
  const int tiles = it.gu ? gu_tiles : dn_tiles;
  it.j = idx / tiles;
  it.tile = idx - it.j * tiles;
  it.e = w.y;
  it.beg = w.z;
  it.end = w.w;
  return it;
}

// A down pass's slots and routing weights for the epilogue (lane (g, q) writes tokens n * 8 + 2q + i).
struct PassOut {
  int slot[2][2];
  float w[2][2];
};

__device__ __forceinline__ PassOut load_pass_out(const StreamArgs& a, int c0, int nt, int q) {
  PassOut o = {{{0, 0}, {0, 0}}, {{0.f, 0.f}, {0.f, 0.f}}};
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int tk = n * 8 + q * 2 + i;
      if (tk < nt) {
        o.slot[n][i] = __ldg(a.plan.sorted_slots + c0 + tk);
        o.w[n][i] = __ldg(a.route_w + o.slot[n][i]);
      }
    }
  return o;
}

// One pass's outputs from the four consumer warps' partial sums rb [warp][MT * 8 values][lane], summed in fixed warp
// order: gate/up -> h rows (SiLU(gate) * up, rounded as rows_mma does), down -> slot_out rows times the routing weight.
template <int MT, int GU, int RA>
__device__ __forceinline__ void pass_epilogue(const StreamArgs& a, const Item& it, int c0, int nt, const float* rb,
                                              const PassOut& o, int lane) {
  constexpr int kV = MT * 8;
  const int g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    float sum[8];
#pragma unroll
    for (int v = 0; v < 8; ++v) {
      float x = rb[(m * 8 + v) * 32 + lane];
#pragma unroll
      for (int w = 1; w < kConsumers; ++w) x += rb[(w * kV + m * 8 + v) * 32 + lane];
      sum[v] = x;
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      if (it.gu) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int tk = n * 8 + q * 2 + i;
          if (tk >= nt) continue;
          const float gt = bf16_round(sum[n * 4 + i]), up = bf16_round(sum[n * 4 + 2 + i]);
          const float sl = bf16_round(gt / (1.f + __expf(-gt)));
          a.h[static_cast<size_t>(c0 + tk) * a.I + it.tile * GU + m * 8 + g] = __float2bfloat16(sl * up);
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int tk = n * 8 + q * 2 + (i & 1);
          if (tk >= nt) continue;
          const int row = it.tile * RA + m * kTileRows + g + (i >> 1) * 8;
          a.slot_out[static_cast<size_t>(o.slot[n][i & 1]) * a.H + row] =
              bf16_round(bf16_round(sum[n * 4 + i]) * o.w[n][i & 1]);
        }
      }
    }
  }
}

// After a gate/up item's last pass (one warp): publish its h rows to the copy engine of any CTA, then count the item.
__device__ __forceinline__ void publish_item(const StreamArgs& a, int j, int lane) {
  __threadfence();
  fence_proxy_async_global();
  __syncwarp();
  if (lane == 0) red_release_add(a.plan.ready + j, 1u);
}

// Tensor maps of the BOX variants (unused otherwise): gate_up [E 2I, H] in boxes of KC x GU, down [E H, I] in boxes of
// KC x RA, h [N K, I] in boxes of KC x TG; F8: the weights' bytes as above and their scales, gate_up [E 2I / 16, H /
// 64] in boxes of KC / 64 x GU / 16, down [E H / 16, I / 64] in boxes of KC / 64 x RA / 16.
struct StreamMaps {
  CUtensorMap gu, dn, h, gus, dns;
};

template <int KC, int NS, int TG, int MT, int P, int kMinBlocks, bool BOX, bool EVICT_FIRST, bool AHEAD, bool EPI,
          bool F8>
__global__ void __launch_bounds__(threads(P, EPI), kMinBlocks)
    moe_stream_kernel(StreamArgs a, const __grid_constant__ StreamMaps maps) {
  using R = Ring<KC, TG, MT, BOX, F8>;
  constexpr int RA = R::RA, GU = R::GU;
  static_assert(BOX || 32 * P >= RA, "the producer lanes cover every weight row of a stage");
  extern __shared__ __align__(128) unsigned char smem[];
  float* red = reinterpret_cast<float*>(smem + kBarBytes);
  unsigned char* slots = smem + R::kHead;
  const uint32_t bar0 = smem_addr(smem);  // full[s] at bar0 + 8s, empty[s] at bar0 + 8(NS + s)
  const uint32_t slot0 = smem_addr(slots);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int E = a.plan.experts;
  // Item feed: the first producer warp claims; the other P - 1 producer warps, the consumers and the epilogue warp
  // read.
  ItemFeed<AHEAD> feed;
  feed.bar = bar0 + 8 * 2 * NS;
  feed.word = reinterpret_cast<int4*>(smem + kItemWords);
  feed.counter = a.plan.ready + E;
  const bool claiming = warp == kConsumers;
  const bool producer = warp >= kConsumers && warp < kConsumers + P;
  step_timeline_phase(0);  // the CTA is resident (timeline build only)
  if (threadIdx.x == 0) {
    for (int s = 0; s < NS; ++s) {
      mbar_init_count(bar0 + 8 * s, P);
      mbar_init_count(bar0 + 8 * (NS + s), kConsumers * 32);  // one arrival per consumer thread
    }
    for (int d = 0; d < kItemRing; ++d) {
      mbar_init_count(feed.bar + 8 * d, 1);
      mbar_init_count(feed.bar + 8 * (kItemRing + d), (P - 1 + kConsumers + (EPI ? 1 : 0)) * 32);  // per reading thread
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  pdl_wait();
  if (claiming && lane == 0) {  // the first claims, in flight with the loads below
    feed.nxt = feed.claim();
    if (AHEAD) feed.after = feed.claim();
  }
  const int na = __ldg(a.plan.num_active);
  const int gu_tiles = a.I / GU, dn_tiles = a.H / RA;
  const int n_gu = na * gu_tiles, total = n_gu + na * dn_tiles;
  uint32_t stage = 0;  // stages walked so far (the same count in every role)

  if (BOX && producer) {
    // ---- producer warps, BOX: lane 0 of producer warp 0 copies the weight boxes (and a down pass's h box, after the
    // ready wait); gate/up token rows t = p + P l go by 1-D copies from every producer warp ----
    const uint64_t policy = EVICT_FIRST ? evict_first_policy() : evict_normal_policy();
    const int pw = warp - kConsumers;
    const int tb = pw + P * lane;
    for (;;) {
      const int4 w = claiming ? feed.next_claiming(lane, total, a, n_gu, gu_tiles, dn_tiles) : feed.next_reading();
      if (w.x >= total) break;
      const Item it = item_of<AHEAD>(a, w, n_gu, gu_tiles, dn_tiles);
      const int width = it.gu ? a.H : a.I;
      bool h_ready = it.gu;
      for (int c0 = it.beg; c0 < it.end; c0 += TG) {
        const int nt = min(TG, it.end - c0);
        const bool has_b = it.gu && tb < nt;
        const uint32_t b_rows = __popc(__ballot_sync(0xffffffffu, has_b));
        const bf16* brow = nullptr;
        for (int k0 = 0; k0 < width; k0 += KC, ++stage) {
          const int s = stage % NS;
          const uint32_t par = (stage / NS) & 1u;
          const uint32_t bytes = static_cast<uint32_t>(min(KC, width - k0)) * 2u;
          const uint32_t full = bar0 + 8 * s, empty = bar0 + 8 * (NS + s);
          const uint32_t boxes =
              pw == 0 ? static_cast<uint32_t>(RA * R::kWRowBytes + (it.gu ? 0 : TG * KC * 2) +
                                              (F8 ? RA / 16 * (KC / 64) * 4 : 0))
                      : 0u;
          if (lane == 0) {
            mbar_wait_or_trap(empty, par ^ 1u);
            mbar_arrive_expect_tx(full, boxes + bytes * b_rows);
          }
          __syncwarp();
          const uint32_t slot = slot0 + s * R::kSlotBytes;
          if (pw == 0 && lane == 0) {
            if (it.gu) {
              const int r0 = it.e * 2 * a.I + it.tile * GU;
              tensor_load_2d_hint(slot, &maps.gu, k0, r0, full, policy);
              tensor_load_2d_hint(slot + GU * R::kWRowBytes, &maps.gu, k0, r0 + a.I, full, policy);
              if constexpr (F8) {
                tensor_load_2d(slot + R::kScaleOff, &maps.gus, k0 / 64, r0 / 16, full);
                tensor_load_2d(slot + R::kScaleOff + 128, &maps.gus, k0 / 64, (r0 + a.I) / 16, full);
              }
            } else {
              const int r0 = it.e * a.H + it.tile * RA;
              tensor_load_2d_hint(slot, &maps.dn, k0, r0, full, policy);
              if constexpr (F8) tensor_load_2d(slot + R::kScaleOff, &maps.dns, k0 / 64, r0 / 16, full);
              if (!h_ready) {
                const uint64_t t0 = global_ns();
                while (ld_acquire(a.plan.ready + it.j) < static_cast<uint32_t>(gu_tiles)) {
                  __nanosleep(128);
                  if (global_ns() - t0 > kWatchdogNs) __trap();
                }
                fence_proxy_async_global();
                h_ready = true;
              }
              tensor_load_2d(slot + R::kTokOff, &maps.h, k0, c0, full);
            }
          }
          if (has_b) {
            if (!brow) brow = a.x + static_cast<size_t>(__ldg(a.plan.sorted_slots + c0 + tb) / a.K) * a.H;
            bulk_load(slot + R::kTokOff + tb * R::kRowBytes, brow + k0, bytes, full);
          }
        }
      }
    }
  } else if (!BOX && producer) {
    // ---- producer warps: warp p copies the stage rows p + P i (weight rows below RA, then token rows); lane l takes
    // row ri = p + P l when it is a weight row, and token row t = ri - RA (or ri + 32 P - RA) when t < TG. Each warp
    // arrives on the full barrier once per stage with its own byte count. ----
    const uint64_t policy = EVICT_FIRST ? evict_first_policy() : evict_normal_policy();
    const int ri = (warp - kConsumers) + P * lane;
    const bool has_a = ri < RA;
    const int t = ri >= RA ? ri - RA : ri + 32 * P - RA;
    const uint32_t b_row = static_cast<uint32_t>(RA + t);
    const uint32_t a_rows = __popc(__ballot_sync(0xffffffffu, has_a));
    for (;;) {
      const int4 w = claiming ? feed.next_claiming(lane, total, a, n_gu, gu_tiles, dn_tiles) : feed.next_reading();
      if (w.x >= total) break;
      const Item it = item_of<AHEAD>(a, w, n_gu, gu_tiles, dn_tiles);
      const int width = it.gu ? a.H : a.I;
      const bf16* wrow = nullptr;
      if (has_a) {
        const size_t row = it.gu ? static_cast<size_t>(it.e) * 2 * a.I + (ri < GU ? ri : a.I + ri - GU) + it.tile * GU
                                 : static_cast<size_t>(it.e) * a.H + it.tile * RA + ri;
        wrow = (it.gu ? a.gate_up : a.down) + row * width;
      }
      bool h_ready = it.gu;
      for (int c0 = it.beg; c0 < it.end; c0 += TG) {
        const int nt = min(TG, it.end - c0);
        const bool has_row = t < nt;
        const uint32_t rows = a_rows + __popc(__ballot_sync(0xffffffffu, has_row));
        const bf16* brow = nullptr;  // set after the first chunk's weight copies are under way
        for (int k0 = 0; k0 < width; k0 += KC, ++stage) {
          const int s = stage % NS;
          const uint32_t par = (stage / NS) & 1u;
          const uint32_t bytes = static_cast<uint32_t>(min(KC, width - k0)) * 2u;
          const uint32_t full = bar0 + 8 * s, empty = bar0 + 8 * (NS + s);
          if (lane == 0) {
            mbar_wait_or_trap(empty, par ^ 1u);
            mbar_arrive_expect_tx(full, bytes * rows);
          }
          __syncwarp();
          const uint32_t slot = slot0 + s * R::kSlotBytes;
          if (wrow) bulk_load_hint(slot + ri * R::kRowBytes, wrow + k0, bytes, full, policy);
          if (!h_ready) {
            if (lane == 0) {
              const uint32_t target = static_cast<uint32_t>(gu_tiles);
              const uint64_t t0 = global_ns();
              while (ld_acquire(a.plan.ready + it.j) < target) {
                __nanosleep(128);
                if (global_ns() - t0 > kWatchdogNs) __trap();
              }
            }
            __syncwarp();
            fence_proxy_async_global();
            h_ready = true;
          }
          if (has_row && !brow)
            brow = it.gu ? a.x + static_cast<size_t>(__ldg(a.plan.sorted_slots + c0 + t) / a.K) * a.H
                         : a.h + static_cast<size_t>(c0 + t) * a.I;
          if (has_row) bulk_load(slot + b_row * R::kRowBytes, brow + k0, bytes, full);
        }
      }
    }
  } else if (EPI && warp == kConsumers + P) {
    // ---- epilogue warp: reduces each pass's partial sums and writes its outputs while the consumers go on ----
    const int q = lane & 3;
    constexpr int kV = MT * 8;
    uint32_t pass = 0;
    for (;;) {
      const int4 w = feed.next_reading();
      if (w.x >= total) break;
      const Item it = item_of<AHEAD>(a, w, n_gu, gu_tiles, dn_tiles);
      for (int c0 = it.beg; c0 < it.end; c0 += TG, ++pass) {
        const int nt = min(TG, it.end - c0);
        const PassOut o = it.gu ? PassOut{} : load_pass_out(a, c0, nt, q);
        const int buf = static_cast<int>(pass & 1u);
        epi_sync(kFullBar + buf);
        pass_epilogue<MT, GU, RA>(a, it, c0, nt, red + buf * (kConsumers * kV * 32), o, lane);
        epi_arrive(kFreeBar + buf);
      }
      if (it.gu) publish_item(a, it.j, lane);
    }
  } else if (warp < kConsumers) {
    // ---- consumer warps ----
    const int g = lane >> 2, q = lane & 3;
    constexpr int kV = MT * 8;  // partial sums per lane and pass
    uint32_t pass = 0;
    for (;;) {
      const int4 w = feed.next_reading();
      if (w.x >= total) break;
      const Item it = item_of<AHEAD>(a, w, n_gu, gu_tiles, dn_tiles);
      const int width = it.gu ? a.H : a.I;
      for (int c0 = it.beg; c0 < it.end; c0 += TG, ++pass) {
        const int nt = min(TG, it.end - c0);
        const bool two = TG > 8 && nt > 8;
        // Without EPI, a down pass's slots and routing weights for warp 0's epilogue, loaded now so that their
        // latency overlaps the pass instead of following it.
        const PassOut o = !EPI && !it.gu && warp == 0 ? load_pass_out(a, c0, nt, q) : PassOut{};
        float acc[MT][2][4];
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.f;
        for (int k0 = 0; k0 < width; k0 += KC, ++stage) {
          const int s = stage % NS;
          const uint32_t par = (stage / NS) & 1u;
          mbar_wait_or_trap(bar0 + 8 * s, par);
          if (stage == 0) step_timeline_phase(1);  // the CTA's first stage has landed (timeline build only)
          if constexpr (F8) {
            // 64-wide k steps (one scale chunk each): warp w takes steps w, w + 4, ...; lane (g, q) holds weight
            // columns 16q .. 16q + 15 of the step (16 bytes) and the same token columns (32 bytes), fp8_frag_a's
            // permutation. Each step's products are scaled by their rows' scales into the f32 sums.
            const unsigned char* sb = slots + s * R::kSlotBytes;
            const unsigned char* a_lo = sb + g * R::kWRowBytes + q * 16;
            const unsigned char* a_hi = a_lo + (it.gu ? GU : 8) * R::kWRowBytes;
            const int m_step = (it.gu ? 8 : kTileRows) * R::kWRowBytes;
            const unsigned char* b_0 = sb + R::kTokOff + g * R::kRowBytes + q * 32;
            const unsigned char* b_1 = b_0 + 8 * R::kRowBytes;
            const float* sc = reinterpret_cast<const float*>(sb + R::kScaleOff);
            constexpr int kChunks = KC / 64;
            for (int ks = warp; ks < KC / 64; ks += kConsumers) {
              uint32_t x0[8], x1[8];
              const uint4 x0a = *reinterpret_cast<const uint4*>(b_0 + ks * 128);
              const uint4 x0b = *reinterpret_cast<const uint4*>(b_0 + ks * 128 + 16);
              const uint4 x1a = two ? *reinterpret_cast<const uint4*>(b_1 + ks * 128) : x0a;
              const uint4 x1b = two ? *reinterpret_cast<const uint4*>(b_1 + ks * 128 + 16) : x0b;
              x0[0] = x0a.x, x0[1] = x0a.y, x0[2] = x0a.z, x0[3] = x0a.w;
              x0[4] = x0b.x, x0[5] = x0b.y, x0[6] = x0b.z, x0[7] = x0b.w;
              x1[0] = x1a.x, x1[1] = x1a.y, x1[2] = x1a.z, x1[3] = x1a.w;
              x1[4] = x1b.x, x1[5] = x1b.y, x1[6] = x1b.z, x1[7] = x1b.w;
#pragma unroll
              for (int m = 0; m < MT; ++m) {
                const int mo = m * m_step + ks * 64;
                const uint4 lo = *reinterpret_cast<const uint4*>(a_lo + mo);
                const uint4 hi = *reinterpret_cast<const uint4*>(a_hi + mo);
                // rows of the lane: gate/up tile m = gate rows 8m + g and up rows 8m + g (group m / 2 of each
                // part); down tile m = rows 16m + g and 16m + 8 + g (group m)
                const float s_lo = it.gu ? sc[(m / 2) * kChunks + ks] : sc[m * kChunks + ks];
                const float s_hi = it.gu ? sc[32 + (m / 2) * kChunks + ks] : s_lo;
                float p0[4] = {0.f, 0.f, 0.f, 0.f}, p1[4] = {0.f, 0.f, 0.f, 0.f};
                const Fp8FragA fa = fp8_frag_a(lo, hi);  // once for both token tiles
                mma_frag_k64(p0, fa, x0);
                if (two) mma_frag_k64(p1, fa, x1);
                acc[m][0][0] = fmaf(s_lo, p0[0], acc[m][0][0]);
                acc[m][0][1] = fmaf(s_lo, p0[1], acc[m][0][1]);
                acc[m][0][2] = fmaf(s_hi, p0[2], acc[m][0][2]);
                acc[m][0][3] = fmaf(s_hi, p0[3], acc[m][0][3]);
                if (two) {
                  acc[m][1][0] = fmaf(s_lo, p1[0], acc[m][1][0]);
                  acc[m][1][1] = fmaf(s_lo, p1[1], acc[m][1][1]);
                  acc[m][1][2] = fmaf(s_hi, p1[2], acc[m][1][2]);
                  acc[m][1][3] = fmaf(s_hi, p1[3], acc[m][1][3]);
                }
              }
            }
          } else {
          const int steps = min(KC, width - k0) / 32;
          const unsigned char* sb = slots + s * R::kSlotBytes + q * 16;
          const unsigned char* a_lo = sb + g * R::kRowBytes;
          const unsigned char* a_hi = a_lo + (it.gu ? GU : 8) * R::kRowBytes;
          const int m_step = (it.gu ? 8 : kTileRows) * R::kRowBytes;
          const unsigned char* b_0 = sb + (RA + g) * R::kRowBytes;
          const unsigned char* b_1 = b_0 + 8 * R::kRowBytes;
          for (int ks = warp; ks < steps; ks += kConsumers) {
            const int off = ks * 64;
            const uint4 x0 = *reinterpret_cast<const uint4*>(b_0 + off);
            const uint4 x1 = two ? *reinterpret_cast<const uint4*>(b_1 + off) : x0;
#pragma unroll
            for (int m = 0; m < MT; ++m) {
              const int mo = m * m_step + off;
              const uint4 lo = *reinterpret_cast<const uint4*>(a_lo + mo);
              const uint4 hi = *reinterpret_cast<const uint4*>(a_hi + mo);
              mma_k32(acc[m][0], lo, hi, x0);
              if (two) mma_k32(acc[m][1], lo, hi, x1);
            }
          }
          }
          mbar_arrive(bar0 + 8 * (NS + s));  // each thread releases its own reads of the stage
        }
        // Partial sums of the four warps (double-buffered), reduced in fixed order by warp 0 or the epilogue warp.
        const int buf = static_cast<int>(pass & 1u);
        float* rb = red + buf * (kConsumers * kV * 32);
        if (EPI && pass >= 2) epi_sync(kFreeBar + buf);  // the epilogue warp has read this buffer two passes ago
#pragma unroll
        for (int v = 0; v < kV; ++v) rb[(warp * kV + v) * 32 + lane] = acc[v >> 3][(v >> 2) & 1][v & 3];
        if (EPI) {
          epi_arrive(kFullBar + buf);
        } else {
          consumer_sync();
          if (warp == 0) pass_epilogue<MT, GU, RA>(a, it, c0, nt, rb, o, lane);
        }
      }
      if (!EPI && it.gu && warp == 0) publish_item(a, it.j, lane);
    }
    // EPI: match the epilogue warp's last two releases of the buffers.
    if (EPI)
      for (uint32_t p = pass >= 2 ? pass - 2 : 0; p < pass; ++p) epi_sync(kFreeBar + static_cast<int>(p & 1u));
  }

  // The counters are left as they are: the next plan build (or moe_plan_reset_counters) clears them, so the CTAs end
  // without a finish count (a fence and an atomic round trip of every CTA, and the last CTA's clearing, used to delay
  // the kernel's end and so the next kernel's release).
#ifdef ZEST_STEP_TIMELINE
  __syncthreads();
  step_timeline_phase(2);  // every role of the CTA is done (timeline build only)
#endif
}

// Tensor map over a row-major matrix [rows, cols] of bf16 (or `type`, elements of `elem_bytes`) in dense boxes of
// box_cols x box_rows (no swizzle); reads past the last row or column give zeros (and still count as box bytes on the
// barrier).
Status make_map(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols, uint32_t box_cols, uint32_t box_rows,
                CUtensorMapDataType type = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, uint64_t elem_bytes = sizeof(bf16)) {
  const EncodeTiledFn fn = encode_tiled_fn();
  if (fn == nullptr) return unsupported("moe_experts_stream: cuTensorMapEncodeTiled is not available");
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * elem_bytes};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = fn(map, type, 2, const_cast<void*>(base), dims, strides, box, elem,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return internal_error("moe_experts_stream: cuTensorMapEncodeTiled failed (" + std::to_string(r) + ")");
  return Status::ok();
}

// F8: the weights are block-wise FP8 (gate_up8 / down8; args.gate_up and args.down unused).
template <int KC, int NS, int TG, int MT, int P, int kMinBlocks, bool BOX = false, bool EVICT_FIRST = true,
          bool AHEAD = false, bool EPI = false, bool F8 = false>
Status launch_stream(const StreamArgs& args, int max_active, cudaStream_t stream, Fp8Weight gate_up8 = {},
                     Fp8Weight down8 = {}) {
  using R = Ring<KC, TG, MT, BOX, F8>;
  constexpr size_t smem = R::kHead + static_cast<size_t>(NS) * R::kSlotBytes;
  static_assert(8 * (2 * NS + 2 * kItemRing) <= kItemWords && kItemWords + 16 * kItemRing <= kBarBytes,
                "mbarriers and item words do not fit");
  static_assert(smem <= 227 * 1024, "shared memory of one CTA");
  const auto kernel = moe_stream_kernel<KC, NS, TG, MT, P, kMinBlocks, BOX, EVICT_FIRST, AHEAD, EPI, F8>;
  const void* fn = reinterpret_cast<const void*>(kernel);
  const cudaError_t configured = once_per_device<cudaError_t>([&] {  // function attributes are per GPU
    return cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  });
  ZEST_RETURN_IF_ERROR(cuda_status(configured, "moe_experts_stream: cudaFuncSetAttribute"));
  int per_sm = 0;
  ZEST_RETURN_IF_ERROR(
      cuda_status(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads(P, EPI), smem), "occupancy"));
  if (per_sm < 1) return unsupported("moe_experts_stream: the kernel does not fit on a multiprocessor");
  // As many CTAs as fit at once (items are claimed in order, so fewer resident CTAs only take longer).
  const int max_items = max_active * (args.I / R::GU + args.H / R::RA);
  const int grid = std::max(1, std::min(max_items, per_sm * sm_count()));
  StreamMaps maps;
  std::memset(&maps, 0, sizeof(maps));
  if constexpr (F8) {
    const uint64_t E = static_cast<uint64_t>(args.plan.experts);
    constexpr auto u8 = CU_TENSOR_MAP_DATA_TYPE_UINT8;
    constexpr auto f32 = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    ZEST_RETURN_IF_ERROR(make_map(&maps.gu, gate_up8.q, E * 2 * args.I, args.H, KC, R::GU, u8, 1));
    ZEST_RETURN_IF_ERROR(make_map(&maps.dn, down8.q, E * args.H, args.I, KC, R::RA, u8, 1));
    ZEST_RETURN_IF_ERROR(make_map(&maps.gus, gate_up8.scales, E * 2 * args.I / 16, args.H / 64, KC / 64, R::GU / 16,
                                  f32, 4));
    ZEST_RETURN_IF_ERROR(
        make_map(&maps.dns, down8.scales, E * args.H / 16, args.I / 64, KC / 64, R::RA / 16, f32, 4));
    ZEST_RETURN_IF_ERROR(make_map(&maps.h, args.h, static_cast<uint64_t>(args.NK), args.I, KC, TG));
  } else if constexpr (BOX) {
    const int E = args.plan.experts;
    ZEST_RETURN_IF_ERROR(make_map(&maps.gu, args.gate_up, static_cast<uint64_t>(E) * 2 * args.I, args.H, KC, R::GU));
    ZEST_RETURN_IF_ERROR(make_map(&maps.dn, args.down, static_cast<uint64_t>(E) * args.H, args.I, KC, R::RA));
    ZEST_RETURN_IF_ERROR(make_map(&maps.h, args.h, static_cast<uint64_t>(args.NK), args.I, KC, TG));
  }
  return launch("moe_experts_stream", kernel, dim3(grid), dim3(threads(P, EPI)), smem, stream, args, maps);
}

__global__ void hold_kernel(int* started, const int* release) {
  if (threadIdx.x != 0) return;
  *reinterpret_cast<volatile int*>(started + blockIdx.x) = 1;
  __threadfence_system();
  const uint64_t t0 = global_ns();
  while (*reinterpret_cast<const volatile int*>(release) == 0 && global_ns() - t0 < 30'000'000'000ull)
    __nanosleep(1000);
}

}  // namespace

Status hold_multiprocessors(int ctas, int* started, const int* release, cudaStream_t stream) {
  if (ctas <= 0 || started == nullptr || release == nullptr)
    return invalid_argument("hold_multiprocessors: need ctas > 0 and both flags");
  int dev = 0, smem = 0;
  ZEST_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&dev), "hold_multiprocessors: cudaGetDevice"));
  ZEST_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
                                   "hold_multiprocessors: shared memory per block"));
  ZEST_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(reinterpret_cast<const void*>(hold_kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                           smem),
      "hold_multiprocessors: cudaFuncSetAttribute"));
  hold_kernel<<<ctas, 32, static_cast<size_t>(smem), stream>>>(started, release);
  return cuda_status(cudaGetLastError(), "hold_multiprocessors");
}

namespace {

// The kernel arguments both weight formats share (the bf16 weight pointers are set by their caller).
StreamArgs stream_args(const bf16* x, const MoePlan& plan, const float* weights, bf16* h, float* slot_out, int N,
                       int K, int H, int I) {
  StreamArgs a{};
  a.x = x;
  a.h = h;
  a.slot_out = slot_out;
  a.route_w = weights;
  a.plan = plan;
  a.K = K;
  a.H = H;
  a.I = I;
  a.NK = N * K;
  return a;
}

}  // namespace

bool moe_stream_ok(int H, int I) { return H > 0 && I > 0 && H % kWidthStep == 0 && I % kWidthStep == 0; }

bool moe_stream_fp8_ok(int H, int I) { return H > 0 && I > 0 && H % kFp8Width == 0 && I % kFp8Width == 0; }

Status moe_experts_stream(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up,
                          const bf16* down, bf16* h, float* slot_out, int N, int K, int E, int H, int I, int variant,
                          cudaStream_t stream) {
  if (N <= 0 || K <= 0 || E <= 0 || K > E || E > kMaxExperts || !moe_stream_ok(H, I))
    return unsupported("moe_experts_stream: need N, K > 0, K <= E <= 1024 and H, I positive multiples of 64 (N=" +
                       std::to_string(N) + " K=" + std::to_string(K) + " E=" + std::to_string(E) +
                       " H=" + std::to_string(H) + " I=" + std::to_string(I) + ")");
  if (N > plan.max_tokens || K != plan.top_k || E != plan.experts)
    return invalid_argument("moe_experts_stream: the plan was bound for other sizes (max_tokens " +
                            std::to_string(plan.max_tokens) + ", top_k " + std::to_string(plan.top_k) + ", experts " +
                            std::to_string(plan.experts) + ")");
  if (variant < 0 || variant >= kStreamVariants)
    return invalid_argument("moe_experts_stream: variant " + std::to_string(variant) + " (want 0 to " +
                            std::to_string(kStreamVariants - 1) + ")");
  StreamArgs args = stream_args(x, plan, weights, h, slot_out, N, K, H, I);
  args.gate_up = gate_up;
  args.down = down;
  const int max_active = std::min(E, N * K);
  if (variant == 0) return launch_stream<256, 3, 16, 2, 1, 2, true, true, true, true>(args, max_active, stream);
  return launch_stream<256, 2, 16, 4, 1, 2, true, true, true, true>(args, max_active, stream);
}

Status moe_experts_stream_fp8(const bf16* x, const MoePlan& plan, const float* weights, Fp8Weight gate_up,
                              Fp8Weight down, bf16* h, float* slot_out, int N, int K, int E, int H, int I,
                              cudaStream_t stream) {
  if (N <= 0 || K <= 0 || E <= 0 || K > E || E > kMaxExperts || !moe_stream_fp8_ok(H, I))
    return unsupported("moe_experts_stream_fp8: need N, K > 0, K <= E <= 1024 and H, I positive multiples of 256 (N=" +
                       std::to_string(N) + " K=" + std::to_string(K) + " E=" + std::to_string(E) +
                       " H=" + std::to_string(H) + " I=" + std::to_string(I) + ")");
  if (N > plan.max_tokens || K != plan.top_k || E != plan.experts)
    return invalid_argument("moe_experts_stream_fp8: the plan was bound for other sizes");
  const auto misaligned = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) != 0; };
  if (misaligned(gate_up.q) || misaligned(down.q) || misaligned(gate_up.scales) || misaligned(down.scales) ||
      misaligned(h) || misaligned(x))
    return invalid_argument("moe_experts_stream_fp8: x, h, the weights and their scales must be 16-byte aligned");
  const StreamArgs args = stream_args(x, plan, weights, h, slot_out, N, K, H, I);
  // 256 FP8 columns a stage (one tensor box), 3 stages, 16 tokens a pass, four m16 tiles (64 weight rows: 16 KB a
  // stage, as many bytes in flight a multiprocessor as variant 1 of the bf16 kernel).
  return launch_stream<256, 3, 16, 4, 1, 2, true, true, true, true, true>(args, std::min(E, N * K), stream, gate_up,
                                                                            down);
}

}  // namespace zest::cuda
