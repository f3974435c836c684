// Weight-streaming products for few tokens on tensor cores: out[token, row] = sum_k W[row, k] * src[token, k]
// with bf16 mma.m16n8k16 (fp32 accumulation). A warp owns 16 weight rows and one slice of k; the weights go
// from HBM straight into A fragments (16-byte loads, used once) and the tokens are the B fragments. Since a
// dot product may sum k in any order, each thread loads 8 consecutive k of a row and both A and B fragments
// use the same permutation of k. A CTA's warps split k and are reduced in shared memory in fixed order.
// Modes: dense small-M GEMM, MoE gate/up (SiLU * up epilogue) and MoE down (routing-weight epilogue).
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kv_prefetch.cuh"

namespace zest::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kRows = 16;     // weight rows per item
constexpr int kChunk = 32;    // k per warp step (two mma k16 steps; load_token_chunks' chunk width)
constexpr int kTokens = 16;   // tokens per pass (two n8 tiles)

enum Mode { kDense = 0, kGateUp = 1, kDown = 2 };

struct RowsParams {
  const bf16* src;        // token rows [*, Kdim]: x (dense, gate/up) or h by sorted position (down)
  const bf16* w;          // dense: [N, K]; gate/up: [E, 2I, H]; down: [E, H, I]
  bf16* out;              // dense: y [M, N]; gate/up: h [N*K, I]
  float* slot_out;        // down: [N*K, H]
  const float* route_w;   // down: routing weights [N*K]
  MoePlan plan;
  int M, N, Kdim, topk, I;
};

// Two k16 steps over one 32-wide chunk: A rows g and g+8 (a_lo, a_hi), B token rows (x0: tokens 0-7, x1: 8-15).
__device__ __forceinline__ void mma_chunk(float* c0, float* c1, const uint4& a_lo, const uint4& a_hi, const uint4& x0,
                                          const uint4& x1, bool two_tiles) {
  mma16816(c0, a_lo.x, a_hi.x, a_lo.y, a_hi.y, x0.x, x0.y);
  mma16816(c0, a_lo.z, a_hi.z, a_lo.w, a_hi.w, x0.z, x0.w);
  if (two_tiles) {
    mma16816(c1, a_lo.x, a_hi.x, a_lo.y, a_hi.y, x1.x, x1.y);
    mma16816(c1, a_lo.z, a_hi.z, a_lo.w, a_hi.w, x1.z, x1.w);
  }
}

// kU: 32-wide chunks in flight per warp and weight matrix; kMinBlocks: CTAs per SM the registers must allow (with
// an explicit 1, ptxas keeps every load of a round in registers: 160-230 registers, one CTA per SM).
template <int kMode, int kU, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) rows_mma_kernel(RowsParams p) {
  pdl_wait();
  constexpr int kMats = kMode == kGateUp ? 2 : 1;  // weight matrices per item (gate and up)
  constexpr int kVals = kMats * 2 * 4;             // accumulators per thread: mats x n-tiles x 4
  __shared__ float red[kWarps][kVals][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int tiles_per_group = p.N / kRows;
  const int groups = kMode == kDense ? 1 : *p.plan.num_active;
  const int items = groups * tiles_per_group;
  const int chunks = p.Kdim / kChunk;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int j = item / tiles_per_group, r0 = (item % tiles_per_group) * kRows;
    int beg = 0, end = p.M;
    const bf16* w0;
    if constexpr (kMode == kDense) {
      w0 = p.w + static_cast<size_t>(r0) * p.Kdim;
    } else {
      const int e = p.plan.active_experts[j];
      beg = p.plan.offsets[j];
      end = p.plan.offsets[j + 1];
      w0 = kMode == kGateUp ? p.w + (static_cast<size_t>(e) * 2 * p.N + r0) * p.Kdim
                            : p.w + (static_cast<size_t>(e) * p.N + r0) * p.Kdim;
    }
    const bf16* w1 = w0 + static_cast<size_t>(p.N) * p.Kdim;  // up rows (gate/up mode)
    const bf16* a_lo0 = w0 + static_cast<size_t>(g) * p.Kdim + tq * 8;
    const bf16* a_hi0 = a_lo0 + static_cast<size_t>(8) * p.Kdim;
    const bf16* a_lo1 = w1 + static_cast<size_t>(g) * p.Kdim + tq * 8;
    const bf16* a_hi1 = a_lo1 + static_cast<size_t>(8) * p.Kdim;
    for (int c0 = beg; c0 < end; c0 += kTokens) {
      const int nt = min(kTokens, end - c0);
      const bool two = nt > 8;
      // Token rows of B: this thread supplies tokens g and g + 8.
      auto src_row = [&](int t) -> const bf16* {
        if (t >= nt) return nullptr;
        int row = c0 + t;
        if constexpr (kMode == kGateUp) row = p.plan.sorted_slots[c0 + t] / p.topk;
        return p.src + static_cast<size_t>(row) * p.Kdim + tq * 8;
      };
      const bf16* x0p = src_row(g);
      const bf16* x1p = src_row(g + 8);
      float acc[kMats][2][4];
#pragma unroll
      for (int m = 0; m < kMats; ++m)
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[m][n][i] = 0.f;
      for (int cb = warp; cb < chunks; cb += kWarps * kU) {
        uint4 lo[kU][kMats], hi[kU][kMats], xa[kU], xb[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int c = cb + u * kWarps;
          const size_t k = static_cast<size_t>(c) * kChunk;
          const bool ok = c < chunks;
          lo[u][0] = ok ? ld_stream(a_lo0 + k) : make_uint4(0, 0, 0, 0);
          hi[u][0] = ok ? ld_stream(a_hi0 + k) : make_uint4(0, 0, 0, 0);
          if constexpr (kMats == 2) {
            lo[u][1] = ok ? ld_stream(a_lo1 + k) : make_uint4(0, 0, 0, 0);
            hi[u][1] = ok ? ld_stream(a_hi1 + k) : make_uint4(0, 0, 0, 0);
          }
          xa[u] = ok && x0p ? __ldg(reinterpret_cast<const uint4*>(x0p + k)) : make_uint4(0, 0, 0, 0);
          xb[u] = ok && x1p ? __ldg(reinterpret_cast<const uint4*>(x1p + k)) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kU; ++u)
#pragma unroll
          for (int m = 0; m < kMats; ++m) mma_chunk(acc[m][0], acc[m][1], lo[u][m], hi[u][m], xa[u], xb[u], two);
      }
      // Reduce the warps' partial sums in fixed order.
#pragma unroll
      for (int m = 0; m < kMats; ++m)
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) red[warp][(m * 2 + n) * 4 + i][lane] = acc[m][n][i];
      __syncthreads();
      for (int idx = threadIdx.x; idx < kVals * 32; idx += blockDim.x) {
        const int v = idx / 32, l = idx % 32;
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) s += red[w][v][l];
        red[0][v][l] = s;
      }
      __syncthreads();
      if (warp == 0) {
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int t = n * 8 + tq * 2 + (i & 1);
            const int row = r0 + g + (i >> 1) * 8;
            if (t >= nt) continue;
            const float v0 = red[0][n * 4 + i][lane];
            if constexpr (kMode == kDense) {
              p.out[static_cast<size_t>(c0 + t) * p.N + row] = __float2bfloat16(v0);
            } else if constexpr (kMode == kGateUp) {
              const float gt = bf16_round(v0), up = bf16_round(red[0][(2 + n) * 4 + i][lane]);
              const float sl = bf16_round(gt / (1.f + __expf(-gt)));
              p.out[static_cast<size_t>(c0 + t) * p.N + row] = __float2bfloat16(sl * up);
            } else {
              const int slot = p.plan.sorted_slots[c0 + t];
              p.slot_out[static_cast<size_t>(slot) * p.N + row] = bf16_round(bf16_round(v0) * p.route_w[slot]);
            }
          }
      }
      __syncthreads();
    }
  }
}

// Dense small-M GEMM with the weights in shared memory: one CTA per 16-row tile (the grid must fit on the GPU at
// once). Before waiting on the previous kernel (the weights are never written by it), thread 0 starts bulk copies
// (TMA) of the tile's 16 rows into shared memory, rows padded by 16 bytes so the A-fragment reads are free of bank
// conflicts; the weight stream so overlaps the previous kernel. After the wait the warps load their k-slices of the
// token rows (all chunks of a round in flight), wait for the tile and run the same mma chunks as rows_mma_kernel;
// the warps' partial sums are reduced in shared memory in fixed order. kTwo: more than 8 token rows (M <= 16).
constexpr int kPreRound = 8;  // token chunks in flight per warp

// L2 policy of rows_pre_kernel: none; the KV rows prefetched before the wait, the weight tile copied evict-first (the
// qkv GEMM of steps of at most 2 rows); no prefetch, the tile evict-first (the other GEMMs of such steps).
enum PreFetch { kPfNone = 0, kPfBefore = 1, kPfTileHint = 3 };

// Normalises the one token row (M == 1) that the lanes g == 0 of 8 warps hold in xa (chunks warp + u * kWarps, one
// round: 256 <= K <= 2048) with the 256-thread norm kernels' arithmetic and summation order (8-element groups t = k / 8
// summed as thread t of such a CTA would: warp butterflies over groups 32 w .. 32 w + 31, then over the 8 warp sums),
// so that the GEMM sees the bits of the normalised row the chain writes. nw: the norm weights (shared or global);
// ss_s [kWarps * 32] and wsum [kWarps]: shared scratch; sync: a barrier over the 8 warps (thread t < 256 of them).
// kFromLane: the norm weights are in the xa of lanes g == 1 (loaded with the row: those lanes' B columns belong to
// a token row past M, whose outputs are never stored); lanes g == 0 take them by shuffle and nw is not read.
template <int kRound, bool kFromLane = false, typename Sync>
__device__ __forceinline__ void norm_row_regs(uint4 (&xa)[kRound], int cb, int chunks, int Kdim, const bf16* nw,
                                              float eps, float* ss_s, float* wsum, Sync sync) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
  if (tid * 8 >= Kdim) ss_s[tid] = 0.f;  // groups past K: zero (absent threads)
  if (g == 0) {
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int c = cb + u * kWarps;
      if (c < chunks) {
        float v[8];
        unpack8(xa[u], v);
        ss_s[4 * c + tq] = sumsq8(v);
      }
    }
  }
  sync();
  {
    const float v = warp_sum(ss_s[warp * 32 + lane]);
    if (lane == 0) wsum[warp] = v;
  }
  sync();
  const float inv = rsqrtf(warp_sum(lane < kWarps ? wsum[lane] : 0.f) / Kdim + eps);
  if constexpr (kFromLane) {
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      uint4 wv;
      wv.x = __shfl_down_sync(0xffffffffu, xa[u].x, 4);
      wv.y = __shfl_down_sync(0xffffffffu, xa[u].y, 4);
      wv.z = __shfl_down_sync(0xffffffffu, xa[u].z, 4);
      wv.w = __shfl_down_sync(0xffffffffu, xa[u].w, 4);
      float v[8];
      unpack8(xa[u], v);
      if (g == 0 && cb + u * kWarps < chunks) xa[u] = rms_scale8(v, inv, wv);
    }
  } else if (g == 0) {
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      float v[8];
      unpack8(xa[u], v);
      const int c = cb + u * kWarps;
      if (c < chunks) xa[u] = rms_scale8(v, inv, *reinterpret_cast<const uint4*>(nw + c * kChunk + tq * 8));
    }
  }
}

// kRound: token chunks per warp and round (all of a warp's chunks in one round for K <= 32 * kWarps * kRound).
// Registers allow 3 CTAs per SM for K <= 2048 (as the shared memory does): one token tile with 8 chunks per round
// (62 registers) or two with 4 (70); K = 4096 tiles (one CTA per SM) take one token tile's 16 chunks in one round.
// kPf (PreFetch): the L2 prefetches of kv's rows and the tile's cache policy.
// kNorm (kv.norm_w, one token row, 256 <= K <= 2048: one round of every warp): x holds the residual row; after
// loading it each CTA normalises it itself with the 256-thread norm kernels' arithmetic and summation order (8-element
// groups t = k / 8 summed as thread t of such a CTA would: warp butterflies over groups 32 w .. 32 w + 31, then over
// the 8 warp sums), so the GEMM sees the bits of the normalised row the chain writes.
// The norm weights are not staged in shared memory: lanes g == 1, whose token row does not exist at M = 1, load them
// into their B fragments beside the row (one round trip for both) and hand them to lanes g == 0 by shuffle. Three
// such CTAs (64 registers each, no weight copy in shared memory) leave room for a compact cluster decode attention
// CTA on an SM, so that its cluster becomes resident before they leave (measured faster than the weights in shared
// memory: batch-1 TPOT -0.02 to -0.09 ms). Measured: the weights read from L1 after the wait instead (a prefetch
// before it) cost ~1 us per layer; 56 registers (room for a 164-register attention) cost ~0.9 us per layer in the qkv
// GEMM (spills).
template <bool kTwo, int kRound, int kPf, bool kNorm>
__device__ __forceinline__ void rows_pre_body(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                              bf16* __restrict__ y, int M, int N, int Kdim, const KvPrefetch& kv) {
  static_assert(!kNorm || (!kTwo && kRound == kPreRound), "the norm takes one token tile in one round");
  extern __shared__ __align__(128) unsigned char wsm[];
  __shared__ __align__(8) uint64_t bar;
  step_timeline_phase(0);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int r0 = blockIdx.x * kRows;
  const uint32_t row_bytes = static_cast<uint32_t>(Kdim) * 2, stride = row_bytes + 16;
  if (threadIdx.x == 0) {
    mbar_init(&bar);
    mbar_arrive_expect_tx(&bar, kRows * row_bytes);
    if constexpr (kPf != kPfNone) {
      const uint64_t pol = evict_first_policy();
      for (int r = 0; r < kRows; ++r)
        bulk_load_hint(wsm + r * stride, w + static_cast<size_t>(r0 + r) * Kdim, row_bytes, &bar, pol);
    } else {
      for (int r = 0; r < kRows; ++r)
        bulk_load(wsm + r * stride, w + static_cast<size_t>(r0 + r) * Kdim, row_bytes, &bar);
    }
  }
  // Block tables and context lengths are step inputs, not written by the previous kernel.
  if constexpr (kPf == kPfBefore) prefetch_kv_l2(kv);
  __syncthreads();
  pdl_wait();
  const int chunks = Kdim / kChunk;
  // kNorm: lanes g == 1 load the norm weights beside the row (norm_row_regs<kFromLane>).
  const bf16* x0p = g < M ? x + static_cast<size_t>(g) * Kdim + tq * 8
                    : kNorm && g == 1 ? kv.norm_w + tq * 8
                                      : nullptr;
  const bf16* x1p = kTwo && g + 8 < M ? x + static_cast<size_t>(g + 8) * Kdim + tq * 8 : nullptr;
  const unsigned char* a_lo = wsm + g * stride + tq * 16;
  const unsigned char* a_hi = a_lo + 8 * stride;
  float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
  bool landed = false;
  for (int cb = warp; cb < chunks; cb += kWarps * kRound) {
    uint4 xa[kRound], xb[kRound];
    load_token_chunks(xa, xb, x0p, x1p, cb, kWarps, chunks);  // x1p is null without kTwo
    if constexpr (kNorm) {  // one token row (M == 1): lanes g == 0 hold it
      __shared__ float ss_s[kWarps * 32];  // per 8-element group
      __shared__ float wsum[kWarps];
      norm_row_regs<kRound, true>(xa, cb, chunks, Kdim, nullptr, kv.norm_eps, ss_s, wsum, [] { __syncthreads(); });
    }
    if (!landed) {
      mbar_wait(&bar, 0);
      landed = true;
      if (warp == 0) step_timeline_phase(1);  // the weight tile has landed
    }
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int c = cb + u * kWarps;
      if (c >= chunks) break;
      const uint4 lo = *reinterpret_cast<const uint4*>(a_lo + c * kChunk * 2);
      const uint4 hi = *reinterpret_cast<const uint4*>(a_hi + c * kChunk * 2);
      mma_chunk(acc[0], acc[1], lo, hi, xa[u], xb[u], kTwo);
    }
  }
  // The warps' partial sums go into the weight tile's shared memory once every warp is done with the tile.
  if (!landed) mbar_wait(&bar, 0);
  __syncthreads();
  float(*red)[8][32] = reinterpret_cast<float(*)[8][32]>(wsm);
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) red[warp][n * 4 + i][lane] = acc[n][i];
  __syncthreads();
  {
    const int v = threadIdx.x >> 5, l = threadIdx.x & 31;  // 256 threads: one (value, lane) each
    const int n = v >> 2, i = v & 3;
    const int t = n * 8 + (l & 3) * 2 + (i & 1);
    const int row = r0 + (l >> 2) + (i >> 1) * 8;
    if (t < M) {
      float s = 0.f;
#pragma unroll
      for (int ww = 0; ww < kWarps; ++ww) s += red[ww][v][l];
      y[static_cast<size_t>(t) * N + row] = __float2bfloat16(s);
    }
  }
}

// kNorm is bounded to 64 registers (4 CTAs' worth), so that three CTAs leave 16 K registers for a compact decode
// attention CTA of at most 128 whatever else the build adds (the step timeline's stamps).
template <bool kTwo, int kRound, int kPf, bool kNorm = false>
__global__ void __launch_bounds__(kWarps * 32, kNorm ? 4 : kRound <= 8 ? 3 : 1)
    rows_pre_kernel(const bf16* __restrict__ x, const bf16* __restrict__ w, bf16* __restrict__ y, int M, int N,
                    int Kdim, KvPrefetch kv) {
  rows_pre_body<kTwo, kRound, kPf, kNorm>(x, w, y, M, N, Kdim, kv);
}

constexpr size_t kPreMaxSmem = 200 * 1024;

// The weight tile (rows padded by 16 bytes), at least the 8 KiB of the final reduction that reuses it.
size_t rows_pre_smem(int K) {
  return std::max<size_t>(static_cast<size_t>(kRows) * (static_cast<size_t>(K) * 2 + 16), kWarps * 8 * 32 * sizeof(float));
}

// The instantiation for (M, K, prefetch): two token tiles above 8 rows; 16 chunks per round for one tile when
// K > 2048.
using PreKernel = void (*)(const bf16*, const bf16*, bf16*, int, int, int, KvPrefetch);
template <int kPf>
PreKernel rows_pre_pick_pf(int M, int K, bool norm = false) {
  if (norm) return rows_pre_kernel<false, kPreRound, kPf, true>;
  if (M > 8) return rows_pre_kernel<true, kPreRound / 2, kPf>;
  return K > kWarps * kChunk * kPreRound ? rows_pre_kernel<false, 2 * kPreRound, kPf>
                                         : rows_pre_kernel<false, kPreRound, kPf>;
}
// pf: a PreFetch mode.
PreKernel rows_pre_pick(int M, int K, int pf, bool norm = false) {
  switch (pf) {
    case kPfBefore: return rows_pre_pick_pf<kPfBefore>(M, K, norm);
    case kPfTileHint: return rows_pre_pick_pf<kPfTileHint>(M, K, norm);
    default: return rows_pre_pick_pf<kPfNone>(M, K, norm);
  }
}

template <int kPf>
bool rows_pre_configure() {
  return once_per_device<bool>([] {
    for (PreKernel f : {rows_pre_kernel<true, kPreRound / 2, kPf>, rows_pre_kernel<false, kPreRound, kPf>,
                        rows_pre_kernel<false, 2 * kPreRound, kPf>, rows_pre_kernel<false, kPreRound, kPf, true>})
      if (cudaFuncSetAttribute(reinterpret_cast<const void*>(f), cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kPreMaxSmem)) != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
    return true;
  });
}

// Whether rows_pre_kernel (with prefetch mode pf) serves (M, N, K): the tile fits in shared memory and every tile
// has its CTA resident.
bool rows_pre_ok(int M, int N, int K, int pf = kPfNone, bool norm = false) {
  if (M < 1 || M > kTokens || N % kRows != 0 || K % kChunk != 0 || rows_pre_smem(K) > kPreMaxSmem) return false;
  if (norm && (M != 1 || K < kWarps * kChunk || K > kWarps * kChunk * kPreRound)) return false;
  const size_t smem = rows_pre_smem(K);
  const bool configured = pf == kPfBefore     ? rows_pre_configure<kPfBefore>()
                          : pf == kPfTileHint ? rows_pre_configure<kPfTileHint>()
                                              : rows_pre_configure<kPfNone>();
  if (!configured) return false;
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, reinterpret_cast<const void*>(rows_pre_pick(M, K, pf, norm)),
                                                    kWarps * 32, smem) != cudaSuccess)
    return false;
  return N / kRows <= n * sm_count();
}

Status launch_rows_pre(const bf16* x, const bf16* w, bf16* y, int M, int N, int K, cudaStream_t stream,
                       int pf = kPfNone, const KvPrefetch& kv = KvPrefetch{}) {
  // The largest carveout, so that an SM that holds this kernel's CTAs (or, for the o projection, two fused-attention
  // CTAs) keeps room for the next ones (measured at batch 1: TPOT -0.025 ms against the driver's default).
  const PreKernel fn = rows_pre_pick(M, K, pf, kv.norm_w != nullptr);
  ZEST_RETURN_IF_ERROR(set_max_carveout(reinterpret_cast<const void*>(fn)));
  return launch("rows_pre", fn, dim3(N / kRows), dim3(kWarps * 32), rows_pre_smem(K), stream, x, w, y, M, N, K, kv);
}

// Dense small-M GEMM with many more 16-row tiles than SMs (the lm_head: 9496 tiles at Qwen3-30B-A3B shapes), where
// rows_pre's one CTA per tile does not fit and rows_mma's register streaming leaves its loads' latency exposed between
// items (a round of 4 chunks, then the CTA's reduction, then the next item's loads). One persistent CTA per SM takes
// tiles b, b + G, b + 2G, ...: a producer warp bulk-copies each tile's 16 rows (padded by 16 bytes, as rows_pre's)
// into a ring of stages, evict-first, starting before the PDL wait (weights are never written by the previous kernel);
// the 8 consumer warps load their k-slices of the token rows once after the wait (K <= 2048: one round of 8 chunks per
// warp, rows_pre's registers) and per tile run rows_pre's mma chunks, free the stage, and reduce the warps' partial
// sums in fixed order through a double buffer (one named barrier per tile). Chunk order and reduction order are
// rows_pre's and rows_mma's, so the bits are theirs. kTwo: more than 8 token rows (M <= 16). kNorm (one token row,
// 256 <= K <= 2048): x is the residual row, which the consumers normalise first (norm_row_regs: the bits of rmsnorm's
// row), so the final norm of a one-token decode step needs no launch of its own.
constexpr int kRingMaxStages = 4;
constexpr size_t kRingRedBytes = 2 * kWarps * 8 * 32 * sizeof(float);  // two [warp][8 values][lane] buffers
constexpr size_t kRingMaxSmem = 227 * 1024;
constexpr size_t kRingStatic = 2048;  // room for the kernel's static shared memory (barriers; the norm's sums)

__device__ __forceinline__ void consumer_bar_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kWarps * 32) : "memory");  // the consumer warps only (barrier 0 is CTA-wide)
}

template <bool kTwo, bool kNorm = false>
__global__ void __launch_bounds__((kWarps + 1) * 32, 1) rows_ring_kernel(const bf16* __restrict__ x,
                                                                        const bf16* __restrict__ w,
                                                                        bf16* __restrict__ y, int M, int N, int Kdim,
                                                                        int stages, const bf16* __restrict__ norm_w,
                                                                        float eps) {
  static_assert(!kNorm || !kTwo, "the norm takes one token row");
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ __align__(8) uint64_t full[kRingMaxStages], empty[kRingMaxStages];
  step_timeline_phase(0);
  float(*red)[kWarps][8][32] = reinterpret_cast<float(*)[kWarps][8][32]>(smem);
  unsigned char* ring = smem + kRingRedBytes;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int tiles = N / kRows;
  const uint32_t row_bytes = static_cast<uint32_t>(Kdim) * 2, stride = row_bytes + 16, tile_bytes = kRows * stride;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      mbar_init_count(&full[s], 1);
      mbar_init_count(&empty[s], kWarps * 32);  // one arrival per consumer thread
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  if (warp == kWarps) {  // the producer
    if (lane == 0) {
      const uint64_t pol = evict_first_policy();
      int i = 0;
      for (int t = blockIdx.x; t < tiles; t += gridDim.x, ++i) {
        const int s = i % stages;
        if (i >= stages) mbar_wait(&empty[s], ((i / stages) & 1) ^ 1);  // the consumers are done with its last tile
        mbar_arrive_expect_tx(&full[s], kRows * row_bytes);
        unsigned char* dst = ring + static_cast<size_t>(s) * tile_bytes;
        const bf16* src = w + static_cast<size_t>(t) * kRows * Kdim;
        for (int r = 0; r < kRows; ++r)
          bulk_load_hint(dst + r * stride, src + static_cast<size_t>(r) * Kdim, row_bytes, &full[s], pol);
      }
    }
    return;
  }
  pdl_wait();
  const int g = lane >> 2, tq = lane & 3;
  const int chunks = Kdim / kChunk;
  const bf16* x0p = g < M ? x + static_cast<size_t>(g) * Kdim + tq * 8 : nullptr;
  const bf16* x1p = kTwo && g + 8 < M ? x + static_cast<size_t>(g + 8) * Kdim + tq * 8 : nullptr;
  uint4 xa[kPreRound], xb[kPreRound];
  load_token_chunks(xa, xb, x0p, x1p, warp, kWarps, chunks);  // x1p is null without kTwo
  if constexpr (kNorm) {
    __shared__ float ss_s[kWarps * 32];
    __shared__ float wsum[kWarps];
    norm_row_regs(xa, warp, chunks, Kdim, norm_w, eps, ss_s, wsum, [] { consumer_bar_sync(); });
  }
  int i = 0;
  for (int t = blockIdx.x; t < tiles; t += gridDim.x, ++i) {
    const int s = i % stages;
    mbar_wait(&full[s], (i / stages) & 1);
    const unsigned char* a_lo = ring + static_cast<size_t>(s) * tile_bytes + g * stride + tq * 16;
    const unsigned char* a_hi = a_lo + 8 * stride;
    float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int u = 0; u < kPreRound; ++u) {
      const int c = warp + u * kWarps;
      if (c >= chunks) break;
      const uint4 lo = *reinterpret_cast<const uint4*>(a_lo + c * kChunk * 2);
      const uint4 hi = *reinterpret_cast<const uint4*>(a_hi + c * kChunk * 2);
      mma_chunk(acc[0], acc[1], lo, hi, xa[u], xb[u], kTwo);
    }
    mbar_arrive(&empty[s]);  // this thread's reads of the stage are done (each releases its own reads)
    float(*rb)[8][32] = red[i & 1];
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int q = 0; q < 4; ++q) rb[warp][n * 4 + q][lane] = acc[n][q];
    // One barrier per tile: a buffer is written again two tiles later, after every consumer passed the next barrier
    // (so after its sums of this tile).
    consumer_bar_sync();
    const int v = threadIdx.x >> 5, l = threadIdx.x & 31;  // 256 consumer threads: one (value, lane) each
    const int n = v >> 2, q = v & 3;
    const int tok = n * 8 + (l & 3) * 2 + (q & 1);
    const int row = t * kRows + (l >> 2) + (q >> 1) * 8;
    if (tok < M) {
      float sum = 0.f;
#pragma unroll
      for (int ww = 0; ww < kWarps; ++ww) sum += rb[ww][v][l];
      y[static_cast<size_t>(tok) * N + row] = __float2bfloat16(sum);
    }
  }
}

// Ring stages for K (0: rows_ring does not serve it).
int rows_ring_stages(int K) {
  if (K < kChunk || K % kChunk != 0 || K > kWarps * kChunk * kPreRound) return 0;
  const size_t tile = static_cast<size_t>(kRows) * (static_cast<size_t>(K) * 2 + 16);
  return static_cast<int>(std::min<size_t>(kRingMaxStages, (kRingMaxSmem - kRingStatic - kRingRedBytes) / tile));
}

// Whether rows_ring serves (M, N, K): M <= 16, at least two stages, and at least 4 tiles per SM (fewer tiles are the
// qkv / o projections, which rows_pre or rows_mma serve as measured). Measured faster than rows_mma for the lm_head on
// H200: 149-154 us eager against 152-158, TPOT batch 8 -0.02 to -0.07 ms, batch 16 -0.2 ms.
bool rows_ring_ok(int M, int N, int K) {
  return M >= 1 && M <= kTokens && N % kRows == 0 && rows_ring_stages(K) >= 2 && N / kRows >= 4 * sm_count();
}

// norm_w: the norm folded in (one token row, 256 <= K <= 2048).
Status launch_rows_ring(const bf16* x, const bf16* w, bf16* y, int M, int N, int K, cudaStream_t stream,
                        const bf16* norm_w = nullptr, float eps = 0.f) {
  const int stages = rows_ring_stages(K);
  const size_t smem = kRingRedBytes + static_cast<size_t>(stages) * kRows * (static_cast<size_t>(K) * 2 + 16);
  auto fn = norm_w ? rows_ring_kernel<false, true> : M > 8 ? rows_ring_kernel<true> : rows_ring_kernel<false>;
  const bool configured = once_per_device<bool>([] {
    for (auto f : {rows_ring_kernel<true>, rows_ring_kernel<false>, rows_ring_kernel<false, true>})
      if (cudaFuncSetAttribute(reinterpret_cast<const void*>(f), cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kRingMaxSmem - kRingStatic)) != cudaSuccess) {
        cudaGetLastError();
        return false;
      }
    return true;
  });
  if (!configured) return internal_error("rows_ring: the shared-memory size was refused");
  const int grid = std::min(N / kRows, sm_count());
  return launch("rows_ring", fn, dim3(grid), dim3((kWarps + 1) * 32), smem, stream, x, w, y, M, N, K, stages, norm_w,
                eps);
}

// The register-streamed kernel for 9-16 token rows when K <= 2048 (the qkv GEMM at Qwen3-30B-A3B shapes), measured
// faster than the shared-memory tile at batch 16 on H200 (TPOT 11.810 / 11.748 against 11.890 / 11.872-11.850
// ms at b8cfb69 / f8caf08; at 12 / 16 10.10-10.13 / 11.74-11.78 against 10.21 / 11.86-11.87 at d84b9e8 and aea5e48;
// batch 8 and below equal or slower, so the tile stays up to 8 rows).
constexpr int kStreamMinRows = 9;
// gemm_kv_prefetch prefetches the KV rows (with evict-first qkv tiles) for steps of at most this many rows:
// measured faster at batch 1 and 2 (TPOT -0.04 to -0.07 ms in four comparisons at batch 1, two at batch 2), slower
// at batch 4 (+0.1 ms) and equal at 8 and 16 (b8cfb69, f8caf08); the other small-M GEMMs' tiles (the o GEMM's)
// evict-first as well: batch 1 -0.009 to -0.018 ms in five comparisons, batch 2 equal (89d6b4e, aea5e48).
constexpr int kPrefetchMaxRows = 2;

template <int kMode, int kU, int kMinBlocks>
Status launch_rows(const RowsParams& p, int max_items, cudaStream_t stream) {
  int per_sm = 0;
  ZEST_RETURN_IF_ERROR(cuda_status(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                       &per_sm, rows_mma_kernel<kMode, kU, kMinBlocks>, kWarps * 32, 0),
                                   "occupancy"));
  const int grid = std::max(1, std::min(max_items, std::max(1, per_sm) * sm_count()));
  return launch("rows_mma", rows_mma_kernel<kMode, kU, kMinBlocks>, dim3(grid), dim3(kWarps * 32), 0, stream, p);
}

}  // namespace

bool rows_mma_gemm_ok(int M, int N, int K) { return M >= 1 && M <= kTokens && N % kRows == 0 && K % kChunk == 0; }

Status rows_mma_gemm(const bf16* x, const bf16* w, bf16* y, int M, int N, int K, cudaStream_t stream) {
  RowsParams p{};
  p.src = x;
  p.w = w;
  p.out = y;
  p.M = M;
  p.N = N;
  p.Kdim = K;
  const bool long_k = K > kWarps * kChunk * kPreRound;  // rows_pre holds one 16-row tile per SM
  // The tile in shared memory (copied evict-first for steps of at most kPrefetchMaxRows rows) where every tile's CTA
  // fits, except 9-16 rows at K <= 2048; the ring for many tiles; else register streaming.
  const int pf = M <= kPrefetchMaxRows ? kPfTileHint : kPfNone;
  if ((long_k || M < kStreamMinRows) && rows_pre_ok(M, N, K, pf)) return launch_rows_pre(x, w, y, M, N, K, stream, pf);
  if (rows_ring_ok(M, N, K)) return launch_rows_ring(x, w, y, M, N, K, stream);
  return launch_rows<kDense, 4, 3>(p, N / kRows, stream);
}

namespace {
// The folded norm on the shared-memory tile path (rows_pre: every tile's CTA resident at once); else gemm_kv_prefetch
// folds it into rows_ring (no KV prefetch there: the lm_head).
bool pre_norm_ok(int M, int N, int K) {
  return M == 1 && rows_mma_gemm_ok(M, N, K) && K >= kWarps * kChunk && K <= kWarps * kChunk * kPreRound &&
         rows_pre_ok(M, N, K, kPfNone, true) && rows_pre_ok(M, N, K, kPfBefore, true);
}
}  // namespace

Status gemm_kv_prefetch(const bf16* x, const bf16* w, bf16* y, int M, int N, int K, const KvPrefetch& kv,
                        cudaStream_t stream) {
  const int pf = M <= kPrefetchMaxRows ? kPfBefore : kPfNone;
  const bool kv_ok = kv.k_cache && kv.v_cache && kv.block_table && kv.context_lens && kv.batch > 0 &&
                     kv.max_blocks > 0 && kv.row_bytes > 0 && kv.row_bytes % 16 == 0 &&
                     (reinterpret_cast<uintptr_t>(kv.k_cache) | reinterpret_cast<uintptr_t>(kv.v_cache)) % 16 == 0;
  const bool aligned =
      x && w && y && K % 8 == 0 && (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16 == 0;
  // Whether gemm() would run rows_pre_kernel for these sizes.
  const bool long_k = K > kWarps * kChunk * kPreRound;
  const bool pre = long_k || M < kStreamMinRows;
  if (kv.norm_w) {  // x is the residual: the norm in the GEMM's CTAs (the KV prefetch where it would run)
    if (!aligned || !gemm_kv_norm_ok(M, N, K))
      return invalid_argument("gemm_kv_prefetch: the folded RMSNorm needs gemm_kv_norm_ok sizes and aligned operands");
    if (!pre_norm_ok(M, N, K)) return launch_rows_ring(x, w, y, M, N, K, stream, kv.norm_w, kv.norm_eps);
    int use = pf != kPfNone && kv_ok && pre ? pf : kPfNone;
    if (!rows_pre_ok(M, N, K, use, true)) use = kPfNone;  // also sets the instantiation's shared-memory size
    return launch_rows_pre(x, w, y, M, N, K, stream, use, kv);
  }
  if (pf != kPfNone && kv_ok && aligned && pre && rows_mma_gemm_ok(M, N, K) && rows_pre_ok(M, N, K, pf))
    return launch_rows_pre(x, w, y, M, N, K, stream, pf, kv);
  return gemm(x, w, y, M, N, K, stream);
}

bool gemm_kv_norm_ok(int M, int N, int K) {
  // One round of every warp: K in [8 * 32, 8 * 32 * kPreRound]; the tile per CTA (rows_pre) or the ring (rows_ring).
  const bool one_round = M == 1 && rows_mma_gemm_ok(M, N, K) && K >= kWarps * kChunk && K <= kWarps * kChunk * kPreRound;
  return one_round && (pre_norm_ok(M, N, K) || rows_ring_ok(M, N, K));
}

bool rows_mma_moe_ok(int H, int I) { return H % kChunk == 0 && I % kChunk == 0 && H % kRows == 0 && I % kRows == 0; }

Status rows_mma_moe(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up, const bf16* down,
                    bf16* h, float* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream) {
  const int max_active = std::min(E, N * K);
  RowsParams gu{};
  gu.src = x;
  gu.w = gate_up;
  gu.out = h;
  gu.plan = plan;
  gu.N = I;
  gu.Kdim = H;
  gu.topk = K;
  const int gu_items = max_active * (I / kRows), dn_items = max_active * (H / kRows);
  // 2 (gate/up) and 4 (down) chunks in flight per warp, 3 CTAs per SM: measured faster than more chunks or CTAs.
  ZEST_RETURN_IF_ERROR((launch_rows<kGateUp, 2, 3>(gu, gu_items, stream)));
  RowsParams dn{};
  dn.src = h;
  dn.w = down;
  dn.slot_out = slot_out;
  dn.route_w = weights;
  dn.plan = plan;
  dn.N = H;
  dn.Kdim = I;
  dn.topk = K;
  return launch_rows<kDown, 4, 3>(dn, dn_items, stream);
}

}  // namespace zest::cuda
