// Generic kernels of the CUDA text decoder: attention for any head_dim over the paged cache (every query
// token with its own context length and block-table row, so chunked prefill and mixed batches are plain
// queries) or over packed contiguous sequences; row gathers/scatters; SERE re-routing statistics.
#include "kernels/cuda/common.cuh"

namespace zest::cuda {

namespace {

constexpr int kAttnThreads = 128;
constexpr int kAttnWarps = kAttnThreads / 32;
constexpr int kMaxHeadDim = 2 * kAttnThreads;
constexpr int kMaxExperts = 1024;

struct GenericAttnArgs {
  const bf16* q;
  const bf16* k;  // paged: k_cache; contiguous: K rows
  const bf16* v;
  bf16* out;
  const int32_t* block_table;  // paged
  const int32_t* seq_rows;     // paged: block-table row per token (null: row t)
  const int32_t* ctx_lens;     // paged: keys per token
  const int32_t* rows;         // paged: query list (null: query i is token i)
  const int32_t* cu_seqlens;   // contiguous
  int q_stride, kv_stride, out_stride, max_blocks, Hq, Hkv, D;
  float scale;
};

__device__ __forceinline__ float block_reduce(float v, float* red, bool is_max) {
  v = is_max ? warp_max(v) : warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = red[0];
#pragma unroll
  for (int w = 1; w < kAttnWarps; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
  return r;
}

// CTA = (query, q head). Keys in tiles of 128: one thread per key for the score (fp32 dot product), an online
// softmax over tiles, then each thread accumulates its output dimensions (tid, tid + 128) over the tile.
template <bool kPaged>
__global__ void __launch_bounds__(kAttnThreads) attention_generic_kernel(GenericAttnArgs a) {
  pdl_wait();
  __shared__ float q_s[kMaxHeadDim];
  __shared__ float p_s[kAttnThreads];
  __shared__ size_t row_s[kAttnThreads];
  __shared__ float red[kAttnWarps];
  const int h = blockIdx.y, tid = threadIdx.x;
  int t, ctx;
  size_t key_base = 0;   // contiguous: first key row of the sequence
  const int32_t* table = nullptr;
  if constexpr (kPaged) {
    t = a.rows ? a.rows[blockIdx.x] : static_cast<int>(blockIdx.x);
    ctx = a.ctx_lens[t];
    table = a.block_table + static_cast<size_t>(a.seq_rows ? a.seq_rows[t] : t) * a.max_blocks;
  } else {
    const int start = a.cu_seqlens[blockIdx.z], len = a.cu_seqlens[blockIdx.z + 1] - start;
    const int qi = blockIdx.x;
    if (qi >= len) return;
    t = start + qi;
    ctx = qi + 1;
    key_base = start;
  }
  const int D = a.D, kvh = h / (a.Hq / a.Hkv);
  const bf16* qr = a.q + static_cast<size_t>(t) * a.q_stride + static_cast<size_t>(h) * D;
  for (int d = tid; d < D; d += kAttnThreads) q_s[d] = __bfloat162float(qr[d]);
  __syncthreads();

  float m = -INFINITY, l = 0.f, acc0 = 0.f, acc1 = 0.f;
  const int d0 = tid, d1 = tid + kAttnThreads;
  for (int k0 = 0; k0 < ctx; k0 += kAttnThreads) {
    const int j = k0 + tid;
    float s = -INFINITY;
    if (j < ctx) {
      size_t row;  // element offset of key j's head kvh
      if constexpr (kPaged) {
        const size_t slot = static_cast<size_t>(table[j / kKvBlock]) * kKvBlock + j % kKvBlock;
        row = (slot * a.Hkv + kvh) * D;
      } else {
        row = (key_base + j) * static_cast<size_t>(a.kv_stride) + static_cast<size_t>(kvh) * D;
      }
      row_s[tid] = row;
      const __nv_bfloat162* kr = reinterpret_cast<const __nv_bfloat162*>(a.k + row);
      float dot = 0.f;
      for (int d = 0; d < D / 2; ++d) {
        const float2 kv = __bfloat1622float2(kr[d]);
        dot = fmaf(q_s[2 * d], kv.x, dot);
        dot = fmaf(q_s[2 * d + 1], kv.y, dot);
      }
      s = dot * a.scale;
    }
    const float m_new = fmaxf(m, block_reduce(s, red, true));
    const float p = j < ctx ? __expf(s - m_new) : 0.f;
    p_s[tid] = p;
    const float tile_sum = block_reduce(p, red, false);  // its barriers also publish p_s and row_s
    const float alpha = __expf(m - m_new);
    l = l * alpha + tile_sum;
    m = m_new;
    acc0 *= alpha;
    acc1 *= alpha;
    const int nk = min(kAttnThreads, ctx - k0);
    if (d0 < D) {
      for (int jj = 0; jj < nk; ++jj) {
        const float vv = __bfloat162float(a.v[row_s[jj] + d0]);
        acc0 = fmaf(p_s[jj], vv, acc0);
        if (d1 < D) acc1 = fmaf(p_s[jj], __bfloat162float(a.v[row_s[jj] + d1]), acc1);
      }
    }
    __syncthreads();
  }
  const float inv = l > 0.f ? 1.f / l : 0.f;
  bf16* o = a.out + static_cast<size_t>(t) * a.out_stride + static_cast<size_t>(h) * D;
  if (d0 < D) o[d0] = __float2bfloat16(acc0 * inv);
  if (d1 < D) o[d1] = __float2bfloat16(acc1 * inv);
}

Status check_generic(const char* op, int Hq, int Hkv, int D) {
  if (Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0 || D <= 0 || D % 2 != 0 || D > kMaxHeadDim)
    return invalid_argument(std::string(op) + ": need heads > 0, q heads divisible by kv heads and an even head_dim <= " +
                            std::to_string(kMaxHeadDim) + " (Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) +
                            " D=" + std::to_string(D) + ")");
  return Status::ok();
}

__global__ void gather_rows_kernel(const bf16* __restrict__ src, const int32_t* __restrict__ idx, bf16* __restrict__ dst,
                                   int hidden) {
  pdl_wait();
  const bf16* s = src + static_cast<size_t>(idx[blockIdx.x]) * hidden;
  bf16* d = dst + static_cast<size_t>(blockIdx.x) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) d[i] = s[i];
}

__global__ void scatter_rows_kernel(const bf16* __restrict__ src, const int32_t* __restrict__ idx, bf16* __restrict__ dst,
                                    int hidden, bool add) {
  pdl_wait();
  const bf16* s = src + static_cast<size_t>(blockIdx.x) * hidden;
  bf16* d = dst + static_cast<size_t>(idx[blockIdx.x]) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x)
    d[i] = add ? __float2bfloat16(__bfloat162float(d[i]) + __bfloat162float(s[i])) : s[i];
}

__global__ void __launch_bounds__(1024) sere_stats_kernel(const int32_t* __restrict__ before,
                                                          const int32_t* __restrict__ after, int N, int K, int S,
                                                          int E, int64_t* __restrict__ counts,
                                                          const int32_t* __restrict__ n_rows) {
  pdl_wait();
  if (n_rows) N = max(0, min(N, *n_rows));
  __shared__ int in_before[kMaxExperts], in_after[kMaxExperts], in_primary[kMaxExperts];
  __shared__ int totals[4];  // distinct before, distinct after, |P|, re-routed slots
  for (int e = threadIdx.x; e < E; e += blockDim.x) in_before[e] = in_after[e] = in_primary[e] = 0;
  if (threadIdx.x < 4) totals[threadIdx.x] = 0;
  __syncthreads();
  int rerouted = 0;
  for (int i = threadIdx.x; i < N * K; i += blockDim.x) {
    const int b = before[i], a = after[i];
    if (b >= 0 && b < E) in_before[b] = 1;
    if (a >= 0 && a < E) in_after[a] = 1;
    if (i % K < S && b >= 0 && b < E) in_primary[b] = 1;
    rerouted += a != b;
  }
  __syncthreads();
  int db = 0, da = 0, np = 0;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    db += in_before[e];
    da += in_after[e];
    np += in_primary[e];
  }
  atomicAdd(&totals[0], db);
  atomicAdd(&totals[1], da);
  atomicAdd(&totals[2], np);
  atomicAdd(&totals[3], rerouted);
  __syncthreads();
  if (threadIdx.x == 0) {
    counts[0] += 1;
    counts[1] += totals[0];
    counts[2] += totals[1];
    counts[3] += totals[1] - totals[2];
    counts[4] += totals[3];
    counts[5] += static_cast<int64_t>(N) * K;
  }
}

}  // namespace

Status paged_attention(const bf16* q, int q_stride, const bf16* k_cache, const bf16* v_cache, const int32_t* block_table,
                       int max_blocks, const int32_t* seq_rows, const int32_t* ctx_lens, const int32_t* rows, int n,
                       bf16* out, int out_stride, int Hq, int Hkv, int D, float scale, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_generic("paged_attention", Hq, Hkv, D));
  if (n <= 0 || max_blocks <= 0) return invalid_argument("paged_attention: need queries > 0 and max_blocks > 0");
  if (!q || !k_cache || !v_cache || !block_table || !ctx_lens || !out)
    return invalid_argument("paged_attention: null pointer");
  GenericAttnArgs a{};
  a.q = q;
  a.k = k_cache;
  a.v = v_cache;
  a.out = out;
  a.block_table = block_table;
  a.seq_rows = seq_rows;
  a.ctx_lens = ctx_lens;
  a.rows = rows;
  a.q_stride = q_stride;
  a.out_stride = out_stride;
  a.max_blocks = max_blocks;
  a.Hq = Hq;
  a.Hkv = Hkv;
  a.D = D;
  a.scale = scale;
  return launch("paged_attention", attention_generic_kernel<true>, dim3(n, Hq), dim3(kAttnThreads), 0, stream, a);
}

Status prefill_attention_generic(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride,
                                 const int32_t* cu_seqlens, int nseq, int max_seqlen, bf16* out, int Hq, int Hkv, int D,
                                 float scale, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_generic("prefill_attention", Hq, Hkv, D));
  if (nseq <= 0 || max_seqlen <= 0) return invalid_argument("prefill_attention: need nseq > 0 and max_seqlen > 0");
  if (nseq > 65535) return invalid_argument("prefill_attention: at most 65535 sequences per launch");
  GenericAttnArgs a{};
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.cu_seqlens = cu_seqlens;
  a.q_stride = q_stride;
  a.kv_stride = kv_stride;
  a.out_stride = Hq * D;
  a.Hq = Hq;
  a.Hkv = Hkv;
  a.D = D;
  a.scale = scale;
  return launch("prefill_attention_generic", attention_generic_kernel<false>, dim3(max_seqlen, Hq, nseq),
                dim3(kAttnThreads), 0, stream, a);
}

Status gather_rows(const bf16* src, const int32_t* idx, bf16* dst, int n, int hidden, cudaStream_t stream) {
  if (n <= 0 || hidden <= 0) return invalid_argument("gather_rows: rows and hidden must be positive");
  return launch("gather_rows", gather_rows_kernel, dim3(n), dim3(128), 0, stream, src, idx, dst, hidden);
}

Status scatter_rows(const bf16* src, const int32_t* idx, bf16* dst, int n, int hidden, bool add, cudaStream_t stream) {
  if (n <= 0 || hidden <= 0) return invalid_argument("scatter_rows: rows and hidden must be positive");
  return launch("scatter_rows", scatter_rows_kernel, dim3(n), dim3(128), 0, stream, src, idx, dst, hidden, add);
}

Status sere_stats(const int32_t* ids_before, const int32_t* ids_after, int N, int K, int S, int E, int64_t* counts,
                  cudaStream_t stream, const int32_t* n_rows) {
  if (N <= 0 || K <= 0 || E <= 0 || E > kMaxExperts)
    return invalid_argument("sere_stats: need N, K > 0 and 0 < E <= 1024");
  return launch("sere_stats", sere_stats_kernel, dim3(1), dim3(1024), 0, stream, ids_before, ids_after, N, K, S, E,
                counts, n_rows);
}

}  // namespace zest::cuda
