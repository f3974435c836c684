// Block-wise FP8 weights (float8_e4m3fn with f32 scales, the format of the official -FP8 checkpoints) read as they
// are: the small-M products of decode (dense projections and the MoE experts) read the FP8 bytes once and multiply on
// tensor cores; the dequantizer turns a weight into bf16 for the grouped GEMMs of prefill.
//
// The products share one kernel, fp8_tile_kernel. A CTA of KW warps owns one item: 16 weight rows of a dense
// projection, the matching 16 gate and 16 up rows of an active expert, or 32 down rows of one (64 at up to 8 tokens;
// "m-tiles" of 16 rows).
// It copies the item's tile and scales into shared memory with bulk copies issued at once (a dense weight's and the
// down experts' before the PDL wait: weights are not written by the previous kernel), while its warps load their
// token chunks, and splits the reduction over K between its warps in chunks of 64 columns (warp w takes chunks w, w +
// KW, ...). A tile too wide for shared memory goes through in segments of whole rounds of chunks, one after another
// (the same chunks per warp, in the same order). In a chunk, lane (g, t) (g = lane / 4, t = lane % 4) reads the 16
// bytes at columns 16t .. 16t + 15 of rows g and g + 8 of each m-tile and the same 16 columns of its token g; its
// four mma.m16n8k16 k-steps j take columns 16t + 4j .. 16t + 4j + 3 as the fragment's k pairs (2t, 2t + 1) and
// (2t + 8, 2t + 9). Every lane uses one permutation of k for the weight and for the token, so the products are the
// plain dot products. An e4m3 byte becomes bf16 exactly (bit moves, then a multiplication by 2^120: e4m3 values,
// subnormals included, are bf16 values); the chunk's products (one 16 x 64 block of one scale) are summed on the
// tensor cores and added to the f32 accumulators times the scale; the warps' sums are added in fixed order.
// Measured against the register-streaming form this replaced (two chunks a warp in flight; gemm_fp8 at one token took
// 11 us for 8-10 MB): batch 1 / 32 / 64 TPOT 2.96 / 12.95 / 19.12 -> 2.88 / 12.33 / 17.92 ms (one H100, one call).
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8.cuh"
#include "kernels/cuda/kv_prefetch.cuh"

namespace zest::cuda {

namespace {

constexpr int kTokGroups = 4;  // 8-token groups per pass (32 tokens); more tokens take more passes

// A 16-byte load that gives zeros when p is null.
__device__ __forceinline__ uint4 ld16_or_zero(const void* p) {
  return p ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0);
}

enum TileMode { kTileDense = 0, kTileGateUp = 1, kTileDown = 2 };
constexpr int kTilePad = 64;  // row stride + 64 bytes: rows g and g + 1 start 64 bytes apart mod 128 (conflict-free)
constexpr size_t kTileMaxSmem = 220 * 1024;

struct TileArgs {
  const bf16* in;        // dense: x [M, K]; gate/up: x [tokens, H]; down: h by sorted position [N * K, I]
  Fp8Weight w;           // dense: [N, K]; gate/up: [E, 2I, H]; down: [E, H, I]
  bf16* out;             // dense: y [M, N]; gate/up: h
  float* slot_out;       // down: [N * K, H]
  const float* weights;  // down: the slots' routing weights
  MoePlan plan;
  int M, N, K, I;        // M: dense token rows; N: dense rows, or H for the experts; K: the reduction width
  int seg;               // chunks of 64 columns a segment of the tile holds (all of them: one segment)
  int red_apart;         // 1: the warps' sums get their own shared memory (one segment, several passes)
  Fp8AddNorm fold;       // dense, down: fold.done != null: the last CTA adds the rows to fold.x and normalises
                         // (one token; KW * 256 >= the row's width)
  KvPrefetch kv;         // dense: kv.batch > 0: the CTAs prefetch these KV rows into L2 before their wait
};

// m-tiles of an item: dense 1; gate/up 2 (gate and up); down 4 at one 8-token group (64 rows: 256 items at one
// token, one wave of 8-warp CTAs), else 2.
template <int kMode, int NG>
constexpr int tile_mtiles() { return kMode == kTileDense ? 1 : kMode == kTileDown && NG == 1 ? 4 : 2; }

// Bytes of a segment's row in shared memory: the whole row, or seg chunks of 64 columns.
__host__ __device__ inline int tile_seg_bytes(int K, int seg) { return seg * 64 >= K ? K : seg * 64; }

// Shared memory of a tile kernel: the segment's rows, the scales of all chunks, the warps' sums ([KW][MT][NG][4][32]
// floats; over the tile unless red_apart).
struct TileSmem {
  size_t tile, scales, red, total;
};
__host__ __device__ inline TileSmem tile_smem(int KW, int MT, int NG, int K, int seg, bool red_apart) {
  TileSmem m;
  m.tile = static_cast<size_t>(MT) * 16 * (tile_seg_bytes(K, seg) + kTilePad);
  m.scales = (static_cast<size_t>(MT) * ((K + 63) / 64) * 4 + 15) / 16 * 16;
  m.red = static_cast<size_t>(KW) * MT * NG * 4 * 32 * 4;
  m.total = red_apart ? m.tile + m.scales + m.red : (m.tile > m.red ? m.tile : m.red) + m.scales;
  return m;
}

// At one 8-token group 8-warp CTAs fit three an SM (at most 85 registers; down's 64-row items two), so that one
// token's items go in one wave: 8 experts x 48 gate/up items, 8 x 32 down items (two waves each before, at 96 and 114
// registers; one wave measured batch-1 TPOT -6% on one H100).
template <int KW, int NG, int kMode>
__global__ void __launch_bounds__(KW * 32, KW == 8 && NG == 1 ? (kMode == kTileDown ? 2 : 3) : 1)
    fp8_tile_kernel(TileArgs a) {
  constexpr int MT = tile_mtiles<kMode, NG>();
  constexpr int U = NG >= 4 ? 1 : 4 / NG;  // chunks a warp loads tokens for at once
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t bar;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int K = a.K, chunks = (K + 63) / 64, seg = a.seg;
  const int nseg = (chunks + seg - 1) / seg;
  const uint32_t row_bytes = static_cast<uint32_t>(tile_seg_bytes(K, seg));
  // Up to 8 tokens with the tile held whole (one segment): each m-tile's 16 rows are one contiguous run of 16 K bytes
  // in the weight, copied by one bulk copy into unpadded rows (their 16-byte reads then meet bank conflicts, a few
  // cycles a chunk). Measured on one H200 (3 rounds): batch 1 TPOT 2.57-2.59 -> 2.52-2.54 ms, batch 8 unchanged; at
  // 17-64 tokens the same copies made batch 64 0.8% slower, so more token groups and segments keep 16 padded rows.
  const bool whole = NG == 1 && nseg == 1;
  const uint32_t stride = row_bytes + (whole ? 0 : kTilePad);
  const TileSmem lay = tile_smem(KW, MT, NG, K, seg, a.red_apart != 0);
  const size_t scale_off = a.red_apart ? lay.tile : (lay.tile > lay.red ? lay.tile : lay.red);
  float* s_sm = reinterpret_cast<float*>(smem + scale_off);
  float* red = reinterpret_cast<float*>(a.red_apart ? smem + scale_off + lay.scales : smem);

  int rows[MT];  // first weight row of each m-tile (-1: absent)
  const uint8_t* wq = a.w.q;
  const float* ws = a.w.scales;
  int tokens = a.M, p0 = 0;
  if constexpr (kMode == kTileDense) {
    rows[0] = blockIdx.x * 16;
  } else {
    // gate/up: the plan is the previous kernel's. Down follows gate/up, each of whose CTAs passes its wait (which lets
    // this grid launch) before it can leave: the plan was complete before this grid started, so down reads it and
    // moves its weights before its own wait, while the last gate/up CTAs still run (moe_one's down kernel does the same).
    if constexpr (kMode == kTileGateUp) pdl_wait();
    const int j = blockIdx.y;
    // (read through L2, as moe_one's down kernel reads it before its wait)
    if (j >= __ldcg(a.plan.num_active)) {
      if constexpr (kMode == kTileGateUp) return;
      // down: no expert here, but every CTA passes its wait before it leaves (see above), and counts itself for
      // the folded combine: it goes through with no rows and no tokens
      tokens = 0;
#pragma unroll
      for (int i = 0; i < MT; ++i) rows[i] = -1;
    } else {
      const int e = __ldcg(a.plan.active_experts + j);
      p0 = __ldcg(a.plan.offsets + j);
      tokens = __ldcg(a.plan.offsets + j + 1) - p0;
      const int er = kMode == kTileGateUp ? 2 * a.I : a.N;  // an expert's rows
      wq += static_cast<size_t>(e) * er * K;
      ws += static_cast<size_t>(e) * (er / 16) * chunks;
      if constexpr (kMode == kTileGateUp) {
        rows[0] = blockIdx.x * 16;
        rows[1] = a.I + blockIdx.x * 16;
      } else {
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          const int r0 = (static_cast<int>(blockIdx.x) * MT + i) * 16;
          rows[i] = r0 < a.N ? r0 : -1;
        }
      }
    }
  }
  // Thread 0 copies segment sg of every m-tile's rows into shared memory, completing on bar (one phase a segment).
  auto load_segment = [&](int sg) {
    if (threadIdx.x != 0) return;
    const int k0 = sg * seg * 64;
    const uint32_t bytes = static_cast<uint32_t>(min(static_cast<int>(row_bytes), K - k0));
    int present = 0;
#pragma unroll
    for (int i = 0; i < MT; ++i) present += rows[i] >= 0;
    mbar_arrive_expect_tx(&bar, static_cast<uint32_t>(present) * 16 * bytes);
    const uint64_t pol = evict_first_policy();
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if (rows[i] < 0) continue;
      if (whole) {
        bulk_load_hint(smem + static_cast<size_t>(i * 16) * stride, wq + static_cast<size_t>(rows[i]) * K, 16 * bytes,
                       &bar, pol);
        continue;
      }
      for (int r = 0; r < 16; ++r)
        bulk_load_hint(smem + static_cast<size_t>(i * 16 + r) * stride, wq + static_cast<size_t>(rows[i] + r) * K + k0,
                       bytes, &bar, pol);
    }
  };
  if (threadIdx.x == 0) mbar_init(&bar);
  load_segment(0);
  for (int idx = threadIdx.x; idx < MT * chunks; idx += KW * 32) {
    const int i = idx / chunks, c = idx - i * chunks;
    s_sm[idx] = rows[i] >= 0 ? ws[static_cast<size_t>(rows[i] / 16) * chunks + c] : 0.f;
  }
  if constexpr (kMode == kTileDense) {
    if (a.kv.batch > 0) prefetch_kv_l2(a.kv);  // block tables and context lengths are step inputs
  }
  __syncthreads();  // the barrier's initialisation and the scales
  if constexpr (kMode != kTileGateUp) pdl_wait();  // the tokens (x, or gate/up's h) are the previous kernel's

  int held = 0;           // the segment in shared memory (or on its way)
  uint32_t phase = 0;     // bar's phase of that segment
  bool landed = false;    // this thread has seen it land
  bool overlaid = false;  // the warps' sums were written over it (red over the tile): load it again
  for (int base = 0; base < tokens; base += 8 * NG) {
    const int groups = min(NG, (tokens - base + 7) / 8);
    const bf16* x_row[NG];
#pragma unroll
    for (int q = 0; q < NG; ++q) {
      const int i = base + 8 * q + g;
      if (i >= tokens) {
        x_row[q] = nullptr;
      } else if constexpr (kMode == kTileDense) {
        x_row[q] = a.in + static_cast<size_t>(i) * K;
      } else if constexpr (kMode == kTileGateUp) {  // the token of sorted position p0 + i
        x_row[q] = a.in + static_cast<size_t>(a.plan.sorted_slots[p0 + i] / a.plan.top_k) * K;
      } else {  // h rows are indexed by sorted position
        x_row[q] = a.in + static_cast<size_t>(p0 + i) * K;
      }
    }
    float acc[MT][NG][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
      for (int q = 0; q < NG; ++q)
#pragma unroll
        for (int v = 0; v < 4; ++v) acc[i][q][v] = 0.f;
    for (int sg = 0; sg < nseg; ++sg) {
      if (sg != held || overlaid) {  // every warp is done with the tile (and saw it land) before it is replaced
        __syncthreads();
        overlaid = false;
        ++phase;
        held = sg;
        landed = false;
        load_segment(sg);
      }
      const int c_begin = sg * seg, c_end = min(chunks, c_begin + seg);
      for (int cb = c_begin + warp; cb < c_end; cb += KW * U) {
        uint4 xa[U][NG], xb[U][NG];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int c = cb + u * KW, k0 = c * 64 + 16 * t;
#pragma unroll
          for (int q = 0; q < NG; ++q) {
            const bool use = q < groups && c < c_end && k0 < K && x_row[q];
            xa[u][q] = ld16_or_zero(use ? x_row[q] + k0 : nullptr);
            xb[u][q] = ld16_or_zero(use ? x_row[q] + k0 + 8 : nullptr);
          }
        }
        if (!landed) {
          mbar_wait(&bar, phase & 1);
          landed = true;
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int c = cb + u * KW;
          if (c >= c_end) break;
          const int k0 = c * 64 + 16 * t;
          const bool in = k0 < K;
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            if (rows[i] < 0) continue;
            const unsigned char* lo = smem + static_cast<size_t>(i * 16 + g) * stride + (k0 - c_begin * 64);
            const uint4 wa = in ? *reinterpret_cast<const uint4*>(lo) : make_uint4(0, 0, 0, 0);
            const uint4 wb = in ? *reinterpret_cast<const uint4*>(lo + 8 * stride) : make_uint4(0, 0, 0, 0);
            const Fp8FragA fa = fp8_frag_a(wa, wb);  // once for all token groups
            const float sc = s_sm[i * chunks + c];
            float part[NG][4];
#pragma unroll
            for (int q = 0; q < NG; ++q)
#pragma unroll
              for (int v = 0; v < 4; ++v) part[q][v] = 0.f;
#pragma unroll
            for (int q = 0; q < NG; ++q) {
              if (q >= groups) continue;
              const uint32_t xw[8] = {xa[u][q].x, xa[u][q].y, xa[u][q].z, xa[u][q].w,
                                      xb[u][q].x, xb[u][q].y, xb[u][q].z, xb[u][q].w};
              mma_frag_k64(part[q], fa, xw);
            }
#pragma unroll
            for (int q = 0; q < NG; ++q)
#pragma unroll
              for (int v = 0; v < 4; ++v) acc[i][q][v] = fmaf(sc, part[q][v], acc[i][q][v]);
          }
        }
      }
      if (!landed) {  // a warp without chunks here still sees the segment land before the tile is reused
        mbar_wait(&bar, phase & 1);
        landed = true;
      }
    }
    // The warps' sums in fixed order (warp 0, then 1, 2, ...).
    if (!a.red_apart) __syncthreads();  // every warp is done reading the tile that red overlays
    constexpr int per = MT * NG * 4;
    if (warp > 0) {
#pragma unroll
      for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int q = 0; q < NG; ++q) {
          if (q >= groups) continue;
#pragma unroll
          for (int v = 0; v < 4; ++v) red[((warp * per) + (i * NG + q) * 4 + v) * 32 + lane] = acc[i][q][v];
        }
    }
    __syncthreads();
    if (warp == 0) {
      for (int w = 1; w < KW; ++w)
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
          for (int q = 0; q < NG; ++q) {
            if (q >= groups) continue;
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[i][q][v] += red[((w * per) + (i * NG + q) * 4 + v) * 32 + lane];
          }
#pragma unroll
      for (int q = 0; q < NG; ++q) {
        if (q >= groups) continue;
#pragma unroll
        for (int v = 0; v < 4; ++v) {
          const int i = base + 8 * q + 2 * t + (v & 1);
          if (i >= tokens) continue;
          const int r = g + (v >= 2 ? 8 : 0);
          if constexpr (kMode == kTileDense) {
            a.out[static_cast<size_t>(i) * a.N + rows[0] + r] = __float2bfloat16(acc[0][q][v]);
          } else if constexpr (kMode == kTileGateUp) {
            const float gv = acc[0][q][v], uv = acc[MT - 1][q][v];
            a.out[static_cast<size_t>(p0 + i) * a.I + rows[0] + r] = __float2bfloat16(gv / (1.f + __expf(-gv)) * uv);
          } else {
            const int slot = a.plan.sorted_slots[p0 + i];
            const float wt = a.weights[slot];
            float* o = a.slot_out + static_cast<size_t>(slot) * a.N;
#pragma unroll
            for (int m = 0; m < MT; ++m)
              if (rows[m] >= 0) o[rows[m] + r] = wt * acc[m][q][v];
          }
        }
      }
    }
    __syncthreads();  // red is reused by the next pass (and, over the tile, before a segment is loaded again)
    overlaid = !a.red_apart;
  }
  if (!landed) mbar_wait(&bar, phase & 1);  // no tokens: the copies still land before the CTA leaves
  if constexpr (kMode != kTileGateUp) {
    if (!a.fold.done) return;
    // The folded add and norm, by the CTA that finds itself last on the counter (each CTA's output rows are ordered
    // before its count: the barrier, then a fence by the counting thread; the last one's fence after the count orders
    // its loads after all of them), which clears the counter for the next launch. The rows: dense, the product's
    // one row; down, the token's slots.
    __shared__ unsigned last;
    __shared__ float sums[KW];
    const int c = threadIdx.x * 8;  // this thread's norm weights
    const uint4 wv = a.fold.w && c < a.N ? __ldg(reinterpret_cast<const uint4*>(a.fold.w + c)) : make_uint4(0, 0, 0, 0);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      last = atomicAdd(a.fold.done, 1u) == gridDim.x * gridDim.y - 1 ? 1u : 0u;
      if (last) __threadfence();
    }
    __syncthreads();
    if (!last) return;
    bf16* y = a.fold.w ? a.fold.y : nullptr;
    if constexpr (kMode == kTileDense)
      combine_norm_row(a.fold.x, static_cast<const bf16*>(a.out), nullptr, 1, wv, y, a.N, a.fold.eps, sums);
    else
      combine_norm_row(a.fold.x, static_cast<const float*>(a.slot_out), a.fold.ids, a.plan.top_k, wv, y, a.N,
                       a.fold.eps, sums);
    if (threadIdx.x == 0) *a.fold.done = 0u;
  }
}

// out[r, k] = bf16(f32(q[r, k]) * scale(r, k)): the rounding of the CUDA upload's dequantization. One thread per 16
// bytes.
__global__ void dequantize_fp8_kernel(Fp8Weight w, bf16* __restrict__ out, int rows, int K) {
  pdl_wait();
  const size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 16;
  if (i >= static_cast<size_t>(rows) * K) return;
  const int r = static_cast<int>(i / K), k = static_cast<int>(i % K);
  const float s = w.scales[static_cast<size_t>(r / 16) * ((K + 63) / 64) + k / 64];
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(w.q + i));
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t o[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const uint32_t u = e4m3x2_bf16x2(words[j], hf ? 0x3424 : 0x1404);
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
      const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * s, f.y * s);
      o[2 * j + hf] = *reinterpret_cast<const uint32_t*>(&b);
    }
  }
  uint4* dst = reinterpret_cast<uint4*>(out + i);
  dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
  dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
}

// One warp per (row, 128-column block): amax over the block, scale = amax / 448 (1 for an all-zero block), codes =
// e4m3(x * (448 / amax)) rounded to nearest even, saturating.
__global__ void quantize_rows_fp8_kernel(const bf16* __restrict__ x, uint8_t* __restrict__ q, float* __restrict__ scales,
                                         int rows, int K) {
  pdl_wait();
  const int blocks = K / 128;
  const int wid = static_cast<int>((static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32);
  const int lane = threadIdx.x & 31;
  if (wid >= rows * blocks) return;
  const int r = wid / blocks, b = wid - r * blocks;
  const size_t off = static_cast<size_t>(r) * K + b * 128 + lane * 4;
  const uint2 raw = __ldg(reinterpret_cast<const uint2*>(x + off));
  const float2 v01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 v23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  float amax = fmaxf(fmaxf(fabsf(v01.x), fabsf(v01.y)), fmaxf(fabsf(v23.x), fabsf(v23.y)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float inv = amax > 0.f ? 448.f / amax : 1.f;
  const __nv_fp8x2_storage_t lo = __nv_cvt_float2_to_fp8x2(make_float2(v01.x * inv, v01.y * inv), __NV_SATFINITE,
                                                           __NV_E4M3);
  const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(make_float2(v23.x * inv, v23.y * inv), __NV_SATFINITE,
                                                           __NV_E4M3);
  *reinterpret_cast<uint32_t*>(q + off) = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  if (lane == 0) scales[static_cast<size_t>(r) * blocks + b] = amax > 0.f ? amax / 448.f : 1.f;
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// KW: 8 warps split K from 16 chunks of 64 (K >= 1024), else 4; NG: token groups of 8 a pass.
template <template <int, int> class F, typename... A>
Status pick(int K, int maxTok, A... args) {
  const bool wide = (K + 63) / 64 >= 16;
  if (maxTok <= 8) return wide ? F<8, 1>::run(args...) : F<4, 1>::run(args...);
  if (maxTok <= 16) return wide ? F<8, 2>::run(args...) : F<4, 2>::run(args...);
  return wide ? F<8, kTokGroups>::run(args...) : F<4, kTokGroups>::run(args...);
}

// Launches the tile kernel on `grid` items. The whole tile in shared memory where it fits (its sums apart where an
// item can take several passes over its tokens: max_tokens above 8 NG), else segments of the most whole rounds of KW
// chunks that fit, the sums over the tile.
template <int KW, int NG, int kMode>
Status launch_tile(TileArgs a, int max_tokens, dim3 grid, cudaStream_t st) {
  constexpr int MT = tile_mtiles<kMode, NG>();
  const int chunks = (a.K + 63) / 64;
  a.seg = chunks;
  a.red_apart = max_tokens > 8 * NG ? 1 : 0;
  TileSmem m = tile_smem(KW, MT, NG, a.K, a.seg, a.red_apart != 0);
  if (m.total > kTileMaxSmem) {
    a.red_apart = 0;
    const TileSmem one = tile_smem(KW, MT, NG, a.K, KW, false);  // a segment of one round
    const size_t room = kTileMaxSmem - one.scales;
    const size_t row = room / (static_cast<size_t>(MT) * 16);
    a.seg = row > kTilePad ? static_cast<int>((row - kTilePad) / 64) / KW * KW : 0;
    if (a.seg < KW || one.red > room)
      return internal_error("FP8 product: K = " + std::to_string(a.K) + " leaves no room for a tile segment");
    m = tile_smem(KW, MT, NG, a.K, a.seg, false);
  }
  auto* kernel = fp8_tile_kernel<KW, NG, kMode>;
  const cudaError_t attr = once_per_device<cudaError_t>([&] {  // function attributes are per GPU
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kTileMaxSmem));
  });
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "FP8 tile kernel smem attribute"));
  const char* name = kMode == kTileDense ? "gemm_fp8" : kMode == kTileGateUp ? "moe_fp8_gate_up" : "moe_fp8_down";
  return launch(name, kernel, grid, dim3(KW * 32), m.total, st, a);
}

template <int KW, int NG>
struct GemmLaunch {
  static Status run(const bf16* x, Fp8Weight w, bf16* y, int M, int N, int K, cudaStream_t st,
                    const Fp8AddNorm* add_norm = nullptr, const KvPrefetch* kv = nullptr) {
    TileArgs a{};
    if (add_norm) a.fold = *add_norm;
    if (kv) a.kv = *kv;
    a.in = x;
    a.w = w;
    a.out = y;
    a.M = M;
    a.N = N;
    a.K = K;
    return launch_tile<KW, NG, kTileDense>(a, M, dim3(N / 16), st);
  }
};

template <int KW, int NG>
struct MoeLaunch {
  static Status run(const bf16* x, const MoePlan& plan, Fp8Weight gate_up, bf16* h, int N, int K, int E, int H, int I,
                    cudaStream_t st) {
    TileArgs a{};
    a.in = x;
    a.w = gate_up;
    a.out = h;
    a.plan = plan;
    a.N = H;
    a.K = H;
    a.I = I;
    return launch_tile<KW, NG, kTileGateUp>(a, N, dim3(I / 16, std::min(E, N * K)), st);
  }
};

template <int KW, int NG>
struct MoeDownLaunch {
  static Status run(const MoePlan& plan, const float* weights, Fp8Weight down, const bf16* h, float* slot_out, int N,
                    int K, int E, int H, int I, cudaStream_t st, const Fp8AddNorm* add_norm = nullptr) {
    TileArgs a{};
    if (add_norm) a.fold = *add_norm;
    a.in = h;
    a.w = down;
    a.slot_out = slot_out;
    a.weights = weights;
    a.plan = plan;
    a.N = H;
    a.K = I;
    a.I = I;
    constexpr int rows = 16 * tile_mtiles<kTileDown, NG>();
    return launch_tile<KW, NG, kTileDown>(a, N, dim3((H + rows - 1) / rows, std::min(E, N * K)), st);
  }
};

}  // namespace

bool fp8_weight_ok(int rows, int K) { return rows > 0 && K > 0 && rows % 16 == 0 && K % 16 == 0; }

size_t fp8_scale_count(int rows, int K) { return static_cast<size_t>(rows / 16) * ((K + 63) / 64); }

bool fp8_add_norm_ok(int M, int H) { return M == 1 && H > 0 && H % 8 == 0 && H <= 8 * 8 * 32; }

namespace {
// What a folded add and norm needs (fp8_add_norm_ok, x, a counter, y with w, 16-byte aligned rows); ids: the experts'.
bool add_norm_args_ok(const Fp8AddNorm& f, int M, int H, bool ids) {
  return fp8_add_norm_ok(M, H) && f.x && f.done && (!ids || f.ids) && (!f.w || f.y) && aligned16(f.x) &&
         (!f.w || aligned16(f.w)) && (!f.y || aligned16(f.y));
}
}  // namespace

Status gemm_fp8(const bf16* x, Fp8Weight w, bf16* y, int M, int N, int K, cudaStream_t stream,
                const Fp8AddNorm* add_norm) {
  if (M <= 0 || M > kFp8StreamMaxM || !fp8_weight_ok(N, K))
    return invalid_argument("gemm_fp8: need 0 < M <= 64, N a positive multiple of 16 and K of 16 (M " +
                            std::to_string(M) + ", N " + std::to_string(N) + ", K " + std::to_string(K) + ")");
  if (!aligned16(x) || !aligned16(w.q))
    return invalid_argument("gemm_fp8: x and the weight must be 16-byte aligned");
  if (add_norm) {  // on 8 warps: one 8-column chunk of the row a thread
    if (!add_norm_args_ok(*add_norm, M, N, false) || !aligned16(y))
      return invalid_argument("gemm_fp8: the folded add and norm takes one row of N <= 2048 (a multiple of 8), 16-byte "
                              "aligned x, y (and w) and a counter");
    return GemmLaunch<8, 1>::run(x, w, y, M, N, K, stream, add_norm);
  }
  return pick<GemmLaunch>(K, M, x, w, y, M, N, K, stream);
}

// At most this many token rows prefetch the KV rows (bf16's gemm_kv_prefetch measured faster at 1 and 2 rows only).
constexpr int kFp8PrefetchMaxRows = 2;

Status gemm_fp8_kv_prefetch(const bf16* x, Fp8Weight w, bf16* y, int M, int N, int K, const KvPrefetch& kv,
                            cudaStream_t stream) {
  if (kv.norm_w) return invalid_argument("gemm_fp8_kv_prefetch: the FP8 products take normalised rows (norm_w set)");
  // More rows, no cache described, or arguments gemm_fp8 refuses: gemm_fp8 itself.
  if (M > kFp8PrefetchMaxRows || M <= 0 || kv.batch <= 0 || !kv.k_cache || !kv.v_cache || !kv.block_table ||
      !kv.context_lens || kv.max_blocks <= 0 || kv.row_bytes <= 0 || kv.row_bytes % 16 != 0 || !fp8_weight_ok(N, K) ||
      !aligned16(x) || !aligned16(w.q))
    return gemm_fp8(x, w, y, M, N, K, stream);
  return pick<GemmLaunch>(K, M, x, w, y, M, N, K, stream, nullptr, &kv);
}

Status moe_experts_fp8(const bf16* x, const MoePlan& plan, const float* weights, Fp8Weight gate_up, Fp8Weight down,
                       bf16* h, float* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream,
                       const Fp8AddNorm* add_norm) {
  if (N <= 0 || K <= 0 || E <= 0 || !fp8_weight_ok(H, I) || !fp8_weight_ok(I, H))
    return invalid_argument("moe_experts_fp8: need tokens, experts, and H and I positive multiples of 16");
  if (!aligned16(x) || !aligned16(h) || !aligned16(gate_up.q) || !aligned16(down.q))
    return invalid_argument("moe_experts_fp8: x, h and the weights must be 16-byte aligned");
  if (N > plan.max_tokens || K != plan.top_k || E != plan.experts)
    return invalid_argument("moe_experts_fp8: the plan is bound for other sizes");
  // A token picks an expert at most once: an expert has at most N tokens.
  if (add_norm && !add_norm_args_ok(*add_norm, N, H, true))
    return invalid_argument("moe_experts_fp8: the folded combine takes one token, H <= 2048 (a multiple of 8), "
                            "16-byte aligned x (and w, y), the ids and a counter");
  ZEST_RETURN_IF_ERROR(pick<MoeLaunch>(H, N, x, plan, gate_up, h, N, K, E, H, I, stream));
  // The folded combine runs on 8 warps: one 8-column chunk of the row a thread.
  if (add_norm) return MoeDownLaunch<8, 1>::run(plan, weights, down, h, slot_out, N, K, E, H, I, stream, add_norm);
  return pick<MoeDownLaunch>(I, N, plan, weights, down, static_cast<const bf16*>(h), slot_out, N, K, E, H, I, stream);
}

Status quantize_rows_fp8(const bf16* x, uint8_t* q, float* scales, int rows, int K, cudaStream_t stream) {
  if (rows <= 0 || K <= 0 || K % 128 != 0)
    return invalid_argument("quantize_rows_fp8: need rows > 0 and K a positive multiple of 128 (K " +
                            std::to_string(K) + ")");
  if ((reinterpret_cast<uintptr_t>(x) & 7) != 0 || (reinterpret_cast<uintptr_t>(q) & 3) != 0)
    return invalid_argument("quantize_rows_fp8: x must be 8-byte and q 4-byte aligned");
  const size_t warps = static_cast<size_t>(rows) * (K / 128);
  return launch("quantize_rows_fp8", quantize_rows_fp8_kernel, dim3(static_cast<unsigned>((warps + 7) / 8)), dim3(256),
                0, stream, x, q, scales, rows, K);
}

Status dequantize_fp8(Fp8Weight w, bf16* out, int rows, int K, cudaStream_t stream) {
  if (!fp8_weight_ok(rows, K)) return invalid_argument("dequantize_fp8: rows and K must be positive multiples of 16");
  if (!aligned16(out) || !aligned16(w.q)) return invalid_argument("dequantize_fp8: operands must be 16-byte aligned");
  const size_t threads = static_cast<size_t>(rows) * K / 16;
  return launch("dequantize_fp8", dequantize_fp8_kernel, dim3(static_cast<unsigned>((threads + 255) / 256)), dim3(256),
                0, stream, w, out, rows, K);
}

}  // namespace zest::cuda
