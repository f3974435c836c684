// Block-wise FP8 weights (float8_e4m3fn with f32 scales, the format of the official -FP8 checkpoints) read as they
// are: the small-M products of decode (dense projections and the MoE experts) stream the FP8 bytes once and multiply
// on tensor cores; the dequantizer turns a weight into bf16 for the grouped GEMMs of prefill.
//
// The streaming products share one warp core. A CTA of KW warps owns up to two 16-row tiles of the weight ("m-tiles")
// and splits the reduction over K between its warps in chunks of 64 columns (warp w takes chunks w, w + KW, ...).
// In a chunk, lane (g, t) (g = lane / 4, t = lane % 4) loads the 16 bytes at columns 16t .. 16t + 15 of rows g and
// g + 8 of each m-tile and the same 16 columns of its token g; its four mma.m16n8k16 k-steps j take columns 16t + 4j ..
// 16t + 4j + 3 as the fragment's k pairs (2t, 2t + 1) and (2t + 8, 2t + 9). Every lane uses one permutation of k for
// the weight and for the token, so the products are the plain dot products. An e4m3 byte becomes bf16 exactly (bit
// moves, then a multiplication by 2^120: e4m3 values, subnormals included, are bf16 values); the chunk's products
// (one 16 x 64 block of one scale) are summed on the tensor cores and added to the f32 accumulators times the scale.
#include <cuda_fp8.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8.cuh"

namespace zest::cuda {

namespace {

constexpr int kTokGroups = 4;         // 8-token groups per pass (32 tokens); more tokens take more passes

// A 16-byte load that gives zeros when p is null.
__device__ __forceinline__ uint4 ld16_or_zero(const void* p) {
  return p ? __ldg(reinterpret_cast<const uint4*>(p)) : make_uint4(0, 0, 0, 0);
}

// The per-lane accumulators of one warp: [m-tile][token group][4] in the mma C layout (rows g, g + 8; tokens 2t, 2t+1).
template <int NG>
struct Acc {
  float v[2][NG][4];
};

// One warp's share of a CTA's tiles: for every chunk c = warp, warp + KW, ... < ceil(K / 64), acc[i][q] += scale(i, c)
// * (W rows of m-tile i, chunk c) x (tokens of group q, chunk c). w_row[i]: the lane's row g of m-tile i (row g + 8 is
// 8 * K bytes on), null for an m-tile the CTA does not have; s_row[i]: m-tile i's scale row; x_row[q]: the lane's
// token g of group q (bf16, K columns), null for none. Groups q >= groups are skipped.
template <int KW, int NG>
__device__ __forceinline__ void stream_tiles(Acc<NG>& acc, const uint8_t* const (&w_row)[2],
                                             const float* const (&s_row)[2], const bf16* const (&x_row)[NG], int groups,
                                             int K, int warp, int t) {
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int q = 0; q < NG; ++q)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc.v[i][q][e] = 0.f;
  const int chunks = (K + 63) / 64;
  const size_t row8 = static_cast<size_t>(8) * K;
  // The weight bytes of chunk c (zeros past K or for an absent m-tile; K % 16 == 0: a lane's 16 columns are all in
  // or all out); the next chunk's are loaded before this one is multiplied (two chunks in flight a warp).
  auto load_w = [&](int c, uint4 (&wa)[2], uint4 (&wb)[2]) {
    const int k0 = c * 64 + 16 * t;
    const bool in = c < chunks && k0 < K;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      wa[i] = in && w_row[i] ? ld_stream(w_row[i] + k0) : make_uint4(0, 0, 0, 0);
      wb[i] = in && w_row[i] ? ld_stream(w_row[i] + row8 + k0) : make_uint4(0, 0, 0, 0);
    }
  };
  uint4 wa[2], wb[2];
  load_w(warp, wa, wb);
  for (int c = warp; c < chunks; c += KW) {
    const int k0 = c * 64 + 16 * t;
    const bool in = k0 < K;
    uint4 na[2], nb[2];
    load_w(c + KW, na, nb);
    uint4 xa[NG], xb[NG];
#pragma unroll
    for (int q = 0; q < NG; ++q) {
      const bool use = q < groups && in && x_row[q];
      xa[q] = ld16_or_zero(use ? x_row[q] + k0 : nullptr);
      xb[q] = ld16_or_zero(use ? x_row[q] + k0 + 8 : nullptr);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      if (!w_row[i]) continue;
      const float s = s_row[i][c];
      const uint32_t ra[4] = {wa[i].x, wa[i].y, wa[i].z, wa[i].w}, rb[4] = {wb[i].x, wb[i].y, wb[i].z, wb[i].w};
      float part[NG][4];
#pragma unroll
      for (int q = 0; q < NG; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[q][e] = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t a0 = e4m3x2_bf16x2(ra[j], 0x1404), a2 = e4m3x2_bf16x2(ra[j], 0x3424);
        const uint32_t a1 = e4m3x2_bf16x2(rb[j], 0x1404), a3 = e4m3x2_bf16x2(rb[j], 0x3424);
#pragma unroll
        for (int q = 0; q < NG; ++q) {
          if (q >= groups) continue;
          // token columns 16t + 4j .. 16t + 4j + 3: words 2j and 2j + 1 of the lane's 32 bytes
          const uint32_t xw[8] = {xa[q].x, xa[q].y, xa[q].z, xa[q].w, xb[q].x, xb[q].y, xb[q].z, xb[q].w};
          mma16816(part[q], a0, a1, a2, a3, xw[2 * j], xw[2 * j + 1]);
        }
      }
#pragma unroll
      for (int q = 0; q < NG; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc.v[i][q][e] = fmaf(s, part[q][e], acc.v[i][q][e]);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      wa[i] = na[i];
      wb[i] = nb[i];
    }
  }
}

// Sums the KW warps' accumulators into warp 0's (shared memory red: KW * 2 * NG * 4 * 32 floats); every warp calls it.
template <int KW, int NG>
__device__ __forceinline__ void reduce_warps(Acc<NG>& acc, float* red, int warp, int lane, int groups) {
  constexpr int per = 2 * NG * 4;
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int q = 0; q < NG; ++q) {
        if (q >= groups) continue;
#pragma unroll
        for (int e = 0; e < 4; ++e) red[((warp * per) + (i * NG + q) * 4 + e) * 32 + lane] = acc.v[i][q][e];
      }
  }
  __syncthreads();
  if (warp == 0) {
    for (int w = 1; w < KW; ++w)
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int q = 0; q < NG; ++q) {
          if (q >= groups) continue;
#pragma unroll
          for (int e = 0; e < 4; ++e) acc.v[i][q][e] += red[((w * per) + (i * NG + q) * 4 + e) * 32 + lane];
        }
  }
  __syncthreads();  // red is reused by the next pass
}

// y[m, n] = sum_k x[m, k] * w(n, k) for m < M: CTA b owns rows tile * b .. (tile 16 or 32: one or two m-tiles; the
// second absent past N).
template <int KW, int NG>
__global__ void __launch_bounds__(KW * 32) gemm_fp8_kernel(const bf16* __restrict__ x, Fp8Weight w,
                                                           bf16* __restrict__ y, int M, int N, int K, int tile) {
  __shared__ float red[KW * 2 * NG * 4 * 32];
  pdl_wait();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = blockIdx.x * tile;
  const int kc = (K + 63) / 64;
  const uint8_t* w_row[2];
  const float* s_row[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int rb = r0 + 16 * i;
    const bool has = 16 * i < tile && rb < N;
    w_row[i] = has ? w.q + static_cast<size_t>(rb + g) * K : nullptr;
    s_row[i] = has ? w.scales + static_cast<size_t>(rb / 16) * kc : nullptr;
  }
  for (int base = 0; base < M; base += 8 * NG) {
    const int groups = min(NG, (M - base + 7) / 8);
    const bf16* x_row[NG];
#pragma unroll
    for (int q = 0; q < NG; ++q) {
      const int m = base + 8 * q + g;
      x_row[q] = m < M ? x + static_cast<size_t>(m) * K : nullptr;
    }
    Acc<NG> acc;
    stream_tiles<KW, NG>(acc, w_row, s_row, x_row, groups, K, warp, t);
    reduce_warps<KW, NG>(acc, red, warp, lane, groups);
    if (warp == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        if (!w_row[i]) continue;
#pragma unroll
        for (int q = 0; q < NG; ++q) {
          if (q >= groups) continue;
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int n = r0 + 16 * i + g + (e >= 2 ? 8 : 0), m = base + 8 * q + 2 * t + (e & 1);
            if (m < M) y[static_cast<size_t>(m) * N + n] = __float2bfloat16(acc.v[i][q][e]);
          }
        }
      }
    }
  }
}

// The MoE experts' two products over the plan (blockIdx.y: active expert j; blockIdx.x: tile b of the expert's rows, a
// CTA each: CTAs that took several tiles each measured slower, FP8 batch 32 at 22.9 ms against bf16 15.8 ms on one
// H200). kGateUp: tile b is gate rows 16b .. 16b + 15 and the matching up rows (I on); h[p, r] = bf16(silu(gate) *
// up) for the expert's sorted positions p. Down: tile b is output rows 32b .. 32b + 31; slot_out[slot(p), r] =
// weights[slot] * sum.
template <int KW, int NG, bool kGateUp>
__global__ void __launch_bounds__(KW * 32) moe_fp8_kernel(const bf16* __restrict__ in, MoePlan plan,
                                                          const float* __restrict__ weights, Fp8Weight w,
                                                          bf16* __restrict__ h, float* __restrict__ slot_out, int K,
                                                          int E, int H, int I) {
  __shared__ float red[KW * 2 * NG * 4 * 32];
  pdl_wait();
  const int j = blockIdx.y;
  if (j >= *plan.num_active) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int e = plan.active_experts[j], p0 = plan.offsets[j], cnt = plan.offsets[j + 1] - p0;
  const int rows = kGateUp ? 2 * I : H, cols = kGateUp ? H : I, kc = (cols + 63) / 64;
  const uint8_t* wq = w.q + static_cast<size_t>(e) * rows * cols;
  const float* ws = w.scales + static_cast<size_t>(e) * (rows / 16) * kc;
  const int tile = blockIdx.x;
  int rb[2];
  if (kGateUp) {
    rb[0] = tile * 16;
    rb[1] = I + tile * 16;
  } else {
    rb[0] = tile * 32;
    rb[1] = rb[0] + 16 < H ? rb[0] + 16 : -1;
  }
  const uint8_t* w_row[2];
  const float* s_row[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    w_row[i] = rb[i] >= 0 ? wq + static_cast<size_t>(rb[i] + g) * cols : nullptr;
    s_row[i] = rb[i] >= 0 ? ws + static_cast<size_t>(rb[i] / 16) * kc : nullptr;
  }
  for (int base = 0; base < cnt; base += 8 * NG) {
    const int groups = min(NG, (cnt - base + 7) / 8);
    const bf16* x_row[NG];
#pragma unroll
    for (int q = 0; q < NG; ++q) {
      const int i = base + 8 * q + g;
      if (i >= cnt) {
        x_row[q] = nullptr;
      } else if (kGateUp) {  // the token of sorted position p0 + i
        x_row[q] = in + static_cast<size_t>(plan.sorted_slots[p0 + i] / plan.top_k) * H;
      } else {  // h rows are indexed by sorted position
        x_row[q] = in + static_cast<size_t>(p0 + i) * I;
      }
    }
    Acc<NG> acc;
    stream_tiles<KW, NG>(acc, w_row, s_row, x_row, groups, cols, warp, t);
    reduce_warps<KW, NG>(acc, red, warp, lane, groups);
    if (warp == 0) {
#pragma unroll
      for (int q = 0; q < NG; ++q) {
        if (q >= groups) continue;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int i = base + 8 * q + 2 * t + (c & 1);
          if (i >= cnt) continue;
          const int p = p0 + i, r = g + (c >= 2 ? 8 : 0);
          if (kGateUp) {
            const float gv = acc.v[0][q][c], uv = acc.v[1][q][c];
            h[static_cast<size_t>(p) * I + rb[0] + r] = __float2bfloat16(gv / (1.f + __expf(-gv)) * uv);
          } else {
            const int slot = plan.sorted_slots[p];
            const float wt = weights[slot];
            float* out = slot_out + static_cast<size_t>(slot) * H;
            out[rb[0] + r] = wt * acc.v[0][q][c];
            if (w_row[1]) out[rb[1] + r] = wt * acc.v[1][q][c];
          }
        }
      }
    }
  }
}

// ---- the weight tile in shared memory ----
// One CTA per item takes its whole weight tile (MT 16-row m-tiles x K bytes) into shared memory with bulk copies, all
// issued at once (a dense weight's before the PDL wait: weights are not written by the previous kernel), and its
// scales beside it; meanwhile its warps load their token chunks. Every item's bytes are in flight together, where the
// register-streaming kernel above keeps two chunks a warp in flight and leaves the rest of its latency exposed (gemm_fp8
// at one token: 11 us for 8-10 MB). The chunk order, the per-chunk scaling and the fixed-order warp sums are
// stream_tiles' and reduce_warps', so the bits are the streaming kernel's.
enum TileMode { kTileDense = 0, kTileGateUp = 1, kTileDown = 2 };
constexpr int kTilePad = 64;  // row stride K + 64: rows g and g + 1 start 64 bytes apart mod 128 (conflict-free reads)
constexpr size_t kTileMaxSmem = 220 * 1024;

struct TileArgs {
  const bf16* in;        // dense: x [M, K]; gate/up: x [tokens, H]; down: h by sorted position [N * K, I]
  Fp8Weight w;           // dense: [N, K]; gate/up: [E, 2I, H]; down: [E, H, I]
  bf16* out;             // dense: y [M, N]; gate/up: h
  float* slot_out;       // down: [N * K, H]
  const float* weights;  // down: the slots' routing weights
  MoePlan plan;
  int M, N, K, I;        // M: dense token rows; N: dense rows, or H for the experts; K: the reduction width
  int red_apart;         // 1: the warps' sums get their own shared memory (several passes over the tokens)
};

template <int kMode>
constexpr int tile_mtiles() { return kMode == kTileDense ? 1 : 2; }

// Dynamic shared memory of a tile kernel: the tile, its scales [MT][ceil(K / 64)], and the warps' sums where they do
// not reuse the tile (red_apart).
template <int KW, int NG, int kMode>
size_t tile_smem(int K, bool red_apart) {
  constexpr int MT = tile_mtiles<kMode>();
  const size_t tile = static_cast<size_t>(MT) * 16 * (K + kTilePad);
  const size_t scales = (static_cast<size_t>(MT) * ((K + 63) / 64) * 4 + 15) / 16 * 16;
  const size_t red = static_cast<size_t>(KW) * MT * NG * 4 * 32 * 4;
  return red_apart ? tile + scales + red : std::max(tile, red) + scales;
}

template <int KW, int NG, int kMode>
__global__ void __launch_bounds__(KW * 32) fp8_tile_kernel(TileArgs a) {
  constexpr int MT = tile_mtiles<kMode>();
  constexpr int U = NG >= 4 ? 1 : 4 / NG;  // chunks a warp loads tokens for at once
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t bar;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int K = a.K, kc = (K + 63) / 64;
  const uint32_t stride = static_cast<uint32_t>(K) + kTilePad;
  const size_t tile_bytes = static_cast<size_t>(MT) * 16 * stride;
  // the warps' sums: apart, or over the tile once every warp is done with it (one pass over the tokens)
  const size_t red_bytes = static_cast<size_t>(KW) * MT * NG * 4 * 32 * 4;
  const size_t scale_off = a.red_apart ? tile_bytes : std::max(tile_bytes, red_bytes);
  float* s_sm = reinterpret_cast<float*>(smem + scale_off);
  float* red = reinterpret_cast<float*>(a.red_apart ? smem + scale_off + (MT * kc * 4 + 15) / 16 * 16 : smem);

  int rows[MT];  // first weight row of each m-tile (-1: absent)
  const uint8_t* wq = a.w.q;
  const float* ws = a.w.scales;
  int tokens = a.M, p0 = 0, e = 0;
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
      if constexpr (kMode == kTileDown) pdl_wait();  // every CTA passes its wait before it leaves (see above)
      return;
    }
    e = __ldcg(a.plan.active_experts + j);
    p0 = __ldcg(a.plan.offsets + j);
    tokens = __ldcg(a.plan.offsets + j + 1) - p0;
    const int er = kMode == kTileGateUp ? 2 * a.I : a.N;  // an expert's rows
    wq += static_cast<size_t>(e) * er * K;
    ws += static_cast<size_t>(e) * (er / 16) * kc;
    if constexpr (kMode == kTileGateUp) {
      rows[0] = blockIdx.x * 16;
      rows[1] = a.I + blockIdx.x * 16;
    } else {
      rows[0] = blockIdx.x * 32;
      rows[1] = rows[0] + 16 < a.N ? rows[0] + 16 : -1;
    }
  }
  if (threadIdx.x == 0) {
    mbar_init(&bar);
    int present = 0;
#pragma unroll
    for (int i = 0; i < MT; ++i) present += rows[i] >= 0;
    mbar_arrive_expect_tx(&bar, static_cast<uint32_t>(present) * 16 * K);
    const uint64_t pol = evict_first_policy();
#pragma unroll
    for (int i = 0; i < MT; ++i) {
      if (rows[i] < 0) continue;
      for (int r = 0; r < 16; ++r)
        bulk_load_hint(smem + static_cast<size_t>(i * 16 + r) * stride, wq + static_cast<size_t>(rows[i] + r) * K,
                       static_cast<uint32_t>(K), &bar, pol);
    }
  }
  for (int idx = threadIdx.x; idx < MT * kc; idx += KW * 32) {
    const int i = idx / kc, c = idx - i * kc;
    s_sm[idx] = rows[i] >= 0 ? ws[static_cast<size_t>(rows[i] / 16) * kc + c] : 0.f;
  }
  __syncthreads();  // the barrier's initialisation and the scales
  if constexpr (kMode != kTileGateUp) pdl_wait();  // the tokens (x, or gate/up's h) are the previous kernel's

  const int chunks = kc;
  bool landed = false;
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
    for (int cb = warp; cb < chunks; cb += KW * U) {
      uint4 xa[U][NG], xb[U][NG];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int k0 = (cb + u * KW) * 64 + 16 * t;
#pragma unroll
        for (int q = 0; q < NG; ++q) {
          const bool use = q < groups && cb + u * KW < chunks && k0 < K && x_row[q];
          xa[u][q] = ld16_or_zero(use ? x_row[q] + k0 : nullptr);
          xb[u][q] = ld16_or_zero(use ? x_row[q] + k0 + 8 : nullptr);
        }
      }
      if (!landed) {
        mbar_wait(&bar, 0);
        landed = true;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = cb + u * KW;
        if (c >= chunks) break;
        const int k0 = c * 64 + 16 * t;
        const bool in = k0 < K;
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          if (rows[i] < 0) continue;
          const unsigned char* lo = smem + static_cast<size_t>(i * 16 + g) * stride + k0;
          const uint4 wa = in ? *reinterpret_cast<const uint4*>(lo) : make_uint4(0, 0, 0, 0);
          const uint4 wb = in ? *reinterpret_cast<const uint4*>(lo + 8 * stride) : make_uint4(0, 0, 0, 0);
          const float sc = s_sm[i * kc + c];
          float part[NG][4];
#pragma unroll
          for (int q = 0; q < NG; ++q)
#pragma unroll
            for (int v = 0; v < 4; ++v) part[q][v] = 0.f;
          const uint32_t ra[4] = {wa.x, wa.y, wa.z, wa.w}, rb[4] = {wb.x, wb.y, wb.z, wb.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const uint32_t a0 = e4m3x2_bf16x2(ra[j], 0x1404), a2 = e4m3x2_bf16x2(ra[j], 0x3424);
            const uint32_t a1 = e4m3x2_bf16x2(rb[j], 0x1404), a3 = e4m3x2_bf16x2(rb[j], 0x3424);
#pragma unroll
            for (int q = 0; q < NG; ++q) {
              if (q >= groups) continue;
              const uint32_t xw[8] = {xa[u][q].x, xa[u][q].y, xa[u][q].z, xa[u][q].w,
                                      xb[u][q].x, xb[u][q].y, xb[u][q].z, xb[u][q].w};
              mma16816(part[q], a0, a1, a2, a3, xw[2 * j], xw[2 * j + 1]);
            }
          }
#pragma unroll
          for (int q = 0; q < NG; ++q)
#pragma unroll
            for (int v = 0; v < 4; ++v) acc[i][q][v] = fmaf(sc, part[q][v], acc[i][q][v]);
        }
      }
    }
    if (!landed) {  // a warp without chunks still waits: the tile's shared memory may be reused below
      mbar_wait(&bar, 0);
      landed = true;
    }
    // The warps' sums in fixed order (warp 0, then 1, 2, ...: reduce_warps' order).
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
            o[rows[0] + r] = wt * acc[0][q][v];
            if (rows[MT - 1] >= 0) o[rows[MT - 1] + r] = wt * acc[MT - 1][q][v];
          }
        }
      }
    }
    __syncthreads();  // red is reused by the next pass
  }
  if (!landed) mbar_wait(&bar, 0);  // no tokens: the copies still land before the CTA leaves
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

// KW: 8 warps split K from 16 chunks of 64 (K >= 1024), else 4.
template <template <int, int> class F, typename... A>
Status pick(int K, int maxTok, A... args) {
  const bool wide = (K + 63) / 64 >= 16;
  if (maxTok <= 8) return wide ? F<8, 1>::run(args...) : F<4, 1>::run(args...);
  if (maxTok <= 16) return wide ? F<8, 2>::run(args...) : F<4, 2>::run(args...);
  return wide ? F<8, kTokGroups>::run(args...) : F<4, kTokGroups>::run(args...);
}

// Multiprocessors of the current device (cached per device).
int sm_count() {
  static int cached[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 132;
  if (cached[dev] == 0) {
    int n = 0;
    cached[dev] = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0 ? n : 132;
  }
  return cached[dev];
}

// Launches the tile kernel (red_apart from the most tokens an item can have); false in *done where its shared memory
// does not fit (the caller streams instead).
template <int KW, int NG, int kMode>
Status launch_tile(TileArgs a, int max_tokens, dim3 grid, cudaStream_t st, bool* done) {
  a.red_apart = max_tokens > 8 * NG ? 1 : 0;
  const size_t smem = tile_smem<KW, NG, kMode>(a.K, a.red_apart != 0);
  *done = smem <= kTileMaxSmem;
  if (!*done) return Status::ok();
  auto* kernel = fp8_tile_kernel<KW, NG, kMode>;
  const cudaError_t attr = once_per_device<cudaError_t>([&] {  // function attributes are per GPU
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kTileMaxSmem));
  });
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "FP8 tile kernel smem attribute"));
  const char* name = kMode == kTileDense ? "gemm_fp8" : kMode == kTileGateUp ? "moe_fp8_gate_up" : "moe_fp8_down";
  return launch(name, kernel, grid, dim3(KW * 32), smem, st, a);
}

template <int KW, int NG>
struct GemmLaunch {
  static Status run(const bf16* x, Fp8Weight w, bf16* y, int M, int N, int K, cudaStream_t st) {
    TileArgs a{};
    a.in = x;
    a.w = w;
    a.out = y;
    a.M = M;
    a.N = N;
    a.K = K;
    bool done = false;
    ZEST_RETURN_IF_ERROR((launch_tile<KW, NG, kTileDense>(a, M, dim3(N / 16), st, &done)));
    if (done) return Status::ok();
    // 32 rows a CTA where that still gives two CTAs per multiprocessor, else 16 (more CTAs streaming at once)
    const int tile = (N + 31) / 32 >= 2 * sm_count() ? 32 : 16;
    return launch("gemm_fp8", gemm_fp8_kernel<KW, NG>, dim3((N + tile - 1) / tile), dim3(KW * 32), 0, st, x, w, y, M,
                  N, K, tile);
  }
};

template <int KW, int NG>
struct MoeLaunch {
  static Status run(const bf16* x, const MoePlan& plan, const float* weights, Fp8Weight gate_up, Fp8Weight down,
                    bf16* h, float* slot_out, int N, int K, int E, int H, int I, cudaStream_t st) {
    const int maxActive = std::min(E, N * K);
    TileArgs a{};
    a.in = x;
    a.w = gate_up;
    a.out = h;
    a.plan = plan;
    a.N = H;
    a.K = H;
    a.I = I;
    bool done = false;
    ZEST_RETURN_IF_ERROR((launch_tile<KW, NG, kTileGateUp>(a, N, dim3(I / 16, maxActive), st, &done)));
    if (done) return Status::ok();
    ZEST_RETURN_IF_ERROR(launch("moe_fp8_gate_up", moe_fp8_kernel<KW, NG, true>,
                                dim3(I / 16, maxActive), dim3(KW * 32), 0, st, x, plan,
                                weights, gate_up, h, slot_out, K, E, H, I));
    return Status::ok();
  }
};

template <int KW, int NG>
struct MoeDownLaunch {
  static Status run(const MoePlan& plan, const float* weights, Fp8Weight down, bf16* h, float* slot_out, int N, int K,
                    int E, int H, int I, cudaStream_t st) {
    const int maxActive = std::min(E, N * K);
    TileArgs a{};
    a.in = h;
    a.w = down;
    a.slot_out = slot_out;
    a.weights = weights;
    a.plan = plan;
    a.N = H;
    a.K = I;
    a.I = I;
    bool done = false;
    ZEST_RETURN_IF_ERROR((launch_tile<KW, NG, kTileDown>(a, N, dim3((H + 31) / 32, maxActive), st, &done)));
    if (done) return Status::ok();
    return launch("moe_fp8_down", moe_fp8_kernel<KW, NG, false>,
                  dim3((H + 31) / 32, maxActive), dim3(KW * 32), 0, st,
                  static_cast<const bf16*>(h), plan, weights, down, static_cast<bf16*>(nullptr), slot_out, K, E, H, I);
  }
};

}  // namespace

bool fp8_weight_ok(int rows, int K) { return rows > 0 && K > 0 && rows % 16 == 0 && K % 16 == 0; }

size_t fp8_scale_count(int rows, int K) { return static_cast<size_t>(rows / 16) * ((K + 63) / 64); }

Status gemm_fp8(const bf16* x, Fp8Weight w, bf16* y, int M, int N, int K, cudaStream_t stream) {
  if (M <= 0 || M > kFp8StreamMaxM || !fp8_weight_ok(N, K))
    return invalid_argument("gemm_fp8: need 0 < M <= 64, N a positive multiple of 16 and K of 16 (M " +
                            std::to_string(M) + ", N " + std::to_string(N) + ", K " + std::to_string(K) + ")");
  if (!aligned16(x) || !aligned16(w.q))
    return invalid_argument("gemm_fp8: x and the weight must be 16-byte aligned");
  return pick<GemmLaunch>(K, M, x, w, y, M, N, K, stream);
}

Status moe_experts_fp8(const bf16* x, const MoePlan& plan, const float* weights, Fp8Weight gate_up, Fp8Weight down,
                       bf16* h, float* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream) {
  if (N <= 0 || K <= 0 || E <= 0 || !fp8_weight_ok(H, I) || !fp8_weight_ok(I, H))
    return invalid_argument("moe_experts_fp8: need tokens, experts, and H and I positive multiples of 16");
  if (!aligned16(x) || !aligned16(h) || !aligned16(gate_up.q) || !aligned16(down.q))
    return invalid_argument("moe_experts_fp8: x, h and the weights must be 16-byte aligned");
  if (N > plan.max_tokens || K != plan.top_k || E != plan.experts)
    return invalid_argument("moe_experts_fp8: the plan is bound for other sizes");
  // A token picks an expert at most once: an expert has at most N tokens.
  ZEST_RETURN_IF_ERROR(pick<MoeLaunch>(H, N, x, plan, weights, gate_up, down, h, slot_out, N, K, E, H, I, stream));
  return pick<MoeDownLaunch>(I, N, plan, weights, down, h, slot_out, N, K, E, H, I, stream);
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
