// Pieces of the small-M tensor-core products (rows_mma.cu) that other decode kernels share so that they produce the
// same bits: the one-token-row RMSNorm in the GEMM's registers and the KV-row L2 prefetch of the qkv projection.
#pragma once
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"

namespace zest::cuda::small_m {

constexpr int kWarps = 8;   // warps of a CTA splitting k
constexpr int kChunk = 32;  // k per warp step

// The KV rows of kv's earlier tokens into L2: items (sequence, page, K or V) dealt round-robin over the `ctas` CTAs (this one: `cta`) (an SM's
// copy engine serves bulk prefetches in order with the CTA's own copies, so they are spread over every SM), one bulk
// prefetch per item of the page's rows before the current token (position context_lens[b] - 1).
__device__ __forceinline__ void prefetch_kv_l2(const KvPrefetch& kv, int cta, int ctas) {
  const int threads = ctas * blockDim.x;
  const int items = kv.batch * kv.max_blocks * 2;
  for (int it = threadIdx.x * ctas + cta; it < items; it += threads) {
    const int b = it / (2 * kv.max_blocks), pg = (it >> 1) % kv.max_blocks;
    const int ctx = kv.context_lens[b];
    const int blk = kv.block_table[static_cast<size_t>(b) * kv.max_blocks + pg];  // both loads in flight at once
    const int r0 = pg * kKvBlock, r1 = min(r0 + kKvBlock, ctx - 1);
    if (r1 <= r0) continue;
    const unsigned char* base = reinterpret_cast<const unsigned char*>((it & 1) ? kv.v_cache : kv.k_cache) +
                                static_cast<size_t>(blk) * kKvBlock * kv.row_bytes;
    bulk_prefetch_l2(base, static_cast<uint32_t>((r1 - r0) * kv.row_bytes));
  }
}

// Normalises the one token row (M == 1) that the lanes g == 0 of 8 warps hold in xa (chunks warp + u * kWarps, one
// round: 256 <= K <= 2048) with the 256-thread norm kernels' arithmetic and summation order (8-element groups t = k / 8
// summed as thread t of such a CTA would: warp butterflies over groups 32 w .. 32 w + 31, then over the 8 warp sums),
// so that the GEMM sees the bits of the normalised row the chain writes. nw: the norm weights (shared or global);
// ss_s [kWarps * 32] and wsum [kWarps]: shared scratch; sync: a barrier over the 8 warps (thread t < 256 of them).
template <int kRound, typename Sync>
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
  if (g == 0) {
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      float v[8];
      unpack8(xa[u], v);
      const int c = cb + u * kWarps;
      if (c < chunks) xa[u] = rms_scale8(v, inv, *reinterpret_cast<const uint4*>(nw + c * kChunk + tq * 8));
    }
  }
}

}  // namespace zest::cuda::small_m
