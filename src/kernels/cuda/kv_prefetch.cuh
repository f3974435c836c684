// The L2 prefetch of a decode step's KV rows by the kernel before the decode attention (KvPrefetch, kernels.h): the
// bf16 small-M products (rows_mma.cu) and the FP8 ones (fp8.cu) issue it before their PDL wait.
#pragma once
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/kernels.h"

namespace zest::cuda {

// The KV rows of kv's earlier tokens into L2: items (sequence, page, K or V) dealt round-robin over the CTAs (an SM's
// copy engine serves bulk prefetches in order with the CTA's own copies, so they are spread over every SM), one bulk
// prefetch per item of the page's rows before the current token (position context_lens[b] - 1).
__device__ __forceinline__ void prefetch_kv_l2(const KvPrefetch& kv) {
  const int threads = gridDim.x * blockDim.x;
  const int items = kv.batch * kv.max_blocks * 2;
  for (int it = threadIdx.x * gridDim.x + blockIdx.x; it < items; it += threads) {
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

}  // namespace zest::cuda
