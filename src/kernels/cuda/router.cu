// MoE routing: softmax + top-k + renormalisation (one warp per token) and SERE re-routing (one CTA per layer).
#include "kernels/cuda/common.cuh"

namespace zest::cuda {

namespace {

constexpr int kRouterWarps = 4;
constexpr int kMaxExperts = 1024;
constexpr int kMaxTopK = 16;

// One token's router by one warp: p = softmax(fp32 logits + bias) over E (scratch p: E floats, shared memory),
// top-K by p (ties: lowest index) sorted descending, weights renormalised to sum 1 and rounded to bf16 precision.
// K <= kMaxTopK.
__device__ __forceinline__ void warp_router_topk(const bf16* row, const float* bias, float* p, int E, int K,
                                                 int32_t* ids, float* weights, int lane) {
  float mx = -INFINITY;
#pragma unroll 4
  for (int e = lane; e < E; e += 32) {  // unrolled: the loads of 4 columns per lane are in flight together
    const float v = __bfloat162float(row[e]) + (bias ? bias[e] : 0.f);
    p[e] = v;
    mx = fmaxf(mx, v);
  }
  mx = warp_max(mx);
  float sum = 0.f;
  for (int e = lane; e < E; e += 32) {
    const float v = expf(p[e] - mx);
    p[e] = v;
    sum += v;
  }
  sum = warp_sum(sum);
  const float inv = 1.f / sum;
  for (int e = lane; e < E; e += 32) p[e] *= inv;
  __syncwarp();
  // K rounds of warp argmax (ties: lowest index); chosen entries are marked -1.
  float sel_v[kMaxTopK];
  int sel_i[kMaxTopK];
  float total = 0.f;
#pragma unroll
  for (int k = 0; k < kMaxTopK; ++k) {
    if (k >= K) break;
    float best = -1.f;
    int bi = 0x7fffffff;
    for (int e = lane; e < E; e += 32) {
      const float v = p[e];
      if (v > best) {
        best = v;
        bi = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > best || (ov == best && oi < bi)) {
        best = ov;
        bi = oi;
      }
    }
    sel_v[k] = best;
    sel_i[k] = bi;
    total += best;
    __syncwarp();
    if (lane == 0) p[bi] = -1.f;
    __syncwarp();
  }
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < kMaxTopK; ++k) {
      if (k >= K) break;
      ids[k] = sel_i[k];
      weights[k] = bf16_round(sel_v[k] / total);
    }
  }
}

__global__ void __launch_bounds__(kRouterWarps * 32) router_topk_kernel(const bf16* __restrict__ logits,
                                                                        const float* __restrict__ bias,
                                                                        int32_t* __restrict__ ids,
                                                                        float* __restrict__ weights, int N, int E,
                                                                        int K) {
  pdl_wait();
  extern __shared__ float probs_all[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n = blockIdx.x * kRouterWarps + warp;
  if (n >= N) return;
  warp_router_topk(logits + static_cast<size_t>(n) * E, bias, probs_all + warp * E, E, K,
                   ids + static_cast<size_t>(n) * K, weights + static_cast<size_t>(n) * K, lane);
}

constexpr int kSereThreads = 1024;
constexpr int kSereRows = 4;  // expert rows per warp whose first 128 similarities are loaded up front

// Four similarities sim[u, c..c+3] (one float4 load when vec; columns >= E read as -inf).
__device__ __forceinline__ float4 sere_load4(const float* __restrict__ sim, int u, int c, int E, bool vec) {
  const float* p = sim + static_cast<size_t>(u) * E + c;
  if (vec && c < E) return __ldg(reinterpret_cast<const float4*>(p));
  return make_float4(c < E ? __ldg(p) : -INFINITY, c + 1 < E ? __ldg(p + 1) : -INFINITY,
                     c + 2 < E ? __ldg(p + 2) : -INFINITY, c + 3 < E ? __ldg(p + 3) : -INFINITY);
}

// Folds sim[u, c..c+3] into a lane's running best over primary experts (strictly greater wins, so the
// lowest column keeps a tie). primary holds one byte per expert, zero past E.
__device__ __forceinline__ void sere_scan4(float4 s, int c, const unsigned char* primary, float& best, int& bv) {
  const uchar4 p = *reinterpret_cast<const uchar4*>(primary + c);
  if (p.x && s.x > best) best = s.x, bv = c;
  if (p.y && s.y > best) best = s.y, bv = c + 1;
  if (p.z && s.z > best) best = s.z, bv = c + 2;
  if (p.w && s.w > best) best = s.w, bv = c + 3;
}

// Finishes expert row u: scans its columns from 128 on, takes the warp argmax (ties: lowest v) and lets
// lane 0 write map[u].
__device__ __forceinline__ void sere_finish_row(float4 first, const float* __restrict__ sim, int u, int E, bool vec,
                                                float rho, const unsigned char* primary, int* map, int lane) {
  float best = -INFINITY;
  int bv = 0x7fffffff;
  sere_scan4(first, 4 * lane, primary, best, bv);
  for (int c = 128 + 4 * lane; c < E; c += 128) sere_scan4(sere_load4(sim, u, c, E, vec), c, primary, best, bv);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int ov = __shfl_xor_sync(0xffffffffu, bv, o);
    if (ob > best || (ob == best && ov < bv)) best = ob, bv = ov;
  }
  if (lane == 0) map[u] = (primary[u] || bv == 0x7fffffff || (rho > 0.f && best < rho)) ? u : bv;
}

// Rewrites one token's slots k >= S through map and folds duplicates into their first slot.
template <int kK>
__device__ __forceinline__ void sere_fold(int (&id)[kK], float (&w)[kK], int K, int S, int E, const int* map) {
#pragma unroll
  for (int k = 0; k < kK; ++k)
    if (k < K && k >= S && id[k] >= 0 && id[k] < E) id[k] = map[id[k]];
#pragma unroll
  for (int k = 1; k < kK; ++k) {
    if (k >= K || id[k] < 0) continue;
    bool done = false;
#pragma unroll
    for (int j = 0; j < k; ++j)
      if (!done && id[j] == id[k]) {
        w[j] += w[k];
        w[k] = 0.f;
        id[k] = -1;
        done = true;
      }
  }
}

template <int kK>
__device__ __forceinline__ void sere_load_token(const int32_t* ids, const float* weights, int n, int K, int (&id)[kK],
                                                float (&w)[kK]) {
#pragma unroll
  for (int k = 0; k < kK; ++k)
    if (k < K) {
      id[k] = ids[static_cast<size_t>(n) * K + k];
      w[k] = weights[static_cast<size_t>(n) * K + k];
    }
}

template <int kK>
__device__ __forceinline__ void sere_store_token(int32_t* ids, float* weights, int n, int K, const int (&id)[kK],
                                                 const float (&w)[kK]) {
#pragma unroll
  for (int k = 0; k < kK; ++k)
    if (k < K) {
      ids[static_cast<size_t>(n) * K + k] = id[k];
      weights[static_cast<size_t>(n) * K + k] = w[k];
    }
}

// One CTA of kSereThreads. Every global load that does not depend on P is issued first (the similarity rows
// before pdl_wait: sim is a weight no kernel writes), so their latencies overlap: thread t holds token t's
// ids/weights, warp w the first 128 similarities of rows w + r * 32 (r < kSereRows). Three barriers: P cleared,
// P marked, map built. K <= kK.
template <int kK>
__global__ void __launch_bounds__(kSereThreads) sere_reroute_kernel(int32_t* __restrict__ ids,
                                                                    float* __restrict__ weights,
                                                                    const float* __restrict__ sim, int N, int E, int K,
                                                                    int S, float rho, bool vec) {
  __shared__ __align__(16) unsigned char primary[kMaxExperts];
  __shared__ int map[kMaxExperts];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  constexpr int kWarps = kSereThreads / 32;
  float4 first[kSereRows];
#pragma unroll
  for (int r = 0; r < kSereRows; ++r) {
    const int u = warp + r * kWarps;
    first[r] = u < E ? sere_load4(sim, u, 4 * lane, E, vec) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  pdl_wait();
  const bool own = tid < N;
  int id[kK];
  float w[kK];
  if (own) sere_load_token(ids, weights, tid, K, id, w);
  for (int i = tid; i < kMaxExperts / 4; i += kSereThreads) reinterpret_cast<unsigned*>(primary)[i] = 0u;
  __syncthreads();
  if (own)
#pragma unroll
    for (int k = 0; k < kK; ++k)
      if (k < S && id[k] >= 0 && id[k] < E) primary[id[k]] = 1;
  for (int n = tid + kSereThreads; n < N; n += kSereThreads)
    for (int k = 0; k < S; ++k) {
      const int v = ids[static_cast<size_t>(n) * K + k];
      if (v >= 0 && v < E) primary[v] = 1;
    }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < kSereRows; ++r) {
    const int u = warp + r * kWarps;
    if (u < E) sere_finish_row(first[r], sim, u, E, vec, rho, primary, map, lane);
  }
  for (int u = warp + kSereRows * kWarps; u < E; u += kWarps)
    sere_finish_row(sere_load4(sim, u, 4 * lane, E, vec), sim, u, E, vec, rho, primary, map, lane);
  __syncthreads();
  if (own) {
    sere_fold(id, w, K, S, E, map);
    sere_store_token(ids, weights, tid, K, id, w);
  }
  for (int n = tid + kSereThreads; n < N; n += kSereThreads) {
    sere_load_token(ids, weights, n, K, id, w);
    sere_fold(id, w, K, S, E, map);
    sere_store_token(ids, weights, n, K, id, w);
  }
}

// Per-CTA map variant for E <= 128: 256 threads; thread t owns half (t & 1) of expert row u = t >> 1 of the
// similarity matrix, 64 floats held in registers, loaded before pdl_wait (sim is a weight). After the wait each
// thread loads its own token (16-byte loads when K % 4 == 0); with one CTA (N <= 256) the primary set P comes from
// those registers, else each CTA also reads all tokens' primaries; P is a 128-bit mask OR-reduced per warp
// (__reduce_or_sync) and over the warps (one barrier); every CTA builds the whole map (one more barrier) and folds
// its 256 tokens. (Every warp reading all 512 primaries itself, without the first barrier, measured 7.9 us at
// N = 256 against 5.6.)
constexpr int kSereFastThreads = 256;
constexpr int kSereFastMaxE = 128;

template <int kK>
__global__ void __launch_bounds__(kSereFastThreads) sere_reroute_fast_kernel(int32_t* __restrict__ ids,
                                                                             float* __restrict__ weights,
                                                                             const float* __restrict__ sim, int N,
                                                                             int E, int K, int S, float rho, bool vec,
                                                                             bool vec_tok) {
  __shared__ int map[kSereFastMaxE];
  __shared__ unsigned warp_mask[kSereFastThreads / 32][kSereFastMaxE / 32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int u = tid >> 1, half = tid & 1;
  // Columns 4 * (2 i + half) .. + 3 of row u, i < 16 (pairs of threads read adjacent 16-byte pieces).
  float4 row[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int c = 4 * (2 * i + half);
    row[i] = u < E ? sere_load4(sim, u, c, E, vec) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
  }
  pdl_wait();
  const int n_own = blockIdx.x * kSereFastThreads + tid;
  const bool own = n_own < N;
  int id[kK];
  float w[kK];
  if (own) {
    if (vec_tok) {  // K % 4 == 0, rows 16-byte aligned
#pragma unroll
      for (int k = 0; k < kK; k += 4)
        if (k < K) {
          const int4 iv = __ldg(reinterpret_cast<const int4*>(ids + static_cast<size_t>(n_own) * K + k));
          const float4 wv = __ldg(reinterpret_cast<const float4*>(weights + static_cast<size_t>(n_own) * K + k));
          id[k] = iv.x, id[k + 1] = iv.y, id[k + 2] = iv.z, id[k + 3] = iv.w;
          w[k] = wv.x, w[k + 1] = wv.y, w[k + 2] = wv.z, w[k + 3] = wv.w;
        }
    } else {
      sere_load_token(ids, weights, n_own, K, id, w);
    }
  }
  // P: a 128-bit mask, built per thread without branches, OR-reduced per warp, then over the warps (one barrier).
  unsigned m0 = 0, m1 = 0, m2 = 0, m3 = 0;
  auto mark = [&](int v) {
    const unsigned bit = v >= 0 && v < E ? 1u << (v & 31) : 0u;
    const int word = v >> 5;
    m0 |= word == 0 ? bit : 0u;
    m1 |= word == 1 ? bit : 0u;
    m2 |= word == 2 ? bit : 0u;
    m3 |= word == 3 ? bit : 0u;
  };
  if (gridDim.x == 1) {  // every token is one thread's own: its primaries are already in registers
    if (own)
#pragma unroll
      for (int k = 0; k < kK; ++k)
        if (k < S) mark(id[k]);
  } else {
    for (int n = tid; n < N; n += kSereFastThreads)
      for (int k = 0; k < S; ++k) mark(__ldg(ids + static_cast<size_t>(n) * K + k));
  }
  m0 = __reduce_or_sync(0xffffffffu, m0);
  m1 = __reduce_or_sync(0xffffffffu, m1);
  m2 = __reduce_or_sync(0xffffffffu, m2);
  m3 = __reduce_or_sync(0xffffffffu, m3);
  if (lane == 0) {
    warp_mask[warp][0] = m0;
    warp_mask[warp][1] = m1;
    warp_mask[warp][2] = m2;
    warp_mask[warp][3] = m3;
  }
  __syncthreads();
  unsigned P[4] = {0u, 0u, 0u, 0u};  // indexed by constants only (stays in registers)
#pragma unroll
  for (int wi = 0; wi < kSereFastThreads / 32; ++wi)
#pragma unroll
    for (int q = 0; q < 4; ++q) P[q] |= warp_mask[wi][q];
  auto p_word = [&](int word) { return word == 0 ? P[0] : word == 1 ? P[1] : word == 2 ? P[2] : P[3]; };
  // Masked argmax over this thread's 64 columns in ascending order (strictly greater wins: lowest column on ties).
  float best = -INFINITY;
  int bv = 0x7fffffff;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int c = 4 * (2 * i + half);  // c >> 5 == i >> 2 for both halves
    const unsigned bits = (P[i >> 2] >> (c & 31)) & 0xfu;
    if ((bits & 1u) && row[i].x > best) best = row[i].x, bv = c;
    if ((bits & 2u) && row[i].y > best) best = row[i].y, bv = c + 1;
    if ((bits & 4u) && row[i].z > best) best = row[i].z, bv = c + 2;
    if ((bits & 8u) && row[i].w > best) best = row[i].w, bv = c + 3;
  }
  {  // the other half of the row (ties: lowest column)
    const float ob = __shfl_xor_sync(0xffffffffu, best, 1);
    const int ov = __shfl_xor_sync(0xffffffffu, bv, 1);
    if (ob > best || (ob == best && ov < bv)) best = ob, bv = ov;
  }
  if (half == 0 && u < E) {
    const bool primary = (p_word(u >> 5) >> (u & 31)) & 1u;
    map[u] = (primary || bv == 0x7fffffff || (rho > 0.f && best < rho)) ? u : bv;
  }
  __syncthreads();
  if (own) {
    sere_fold(id, w, K, S, E, map);
    if (vec_tok) {
#pragma unroll
      for (int k = 0; k < kK; k += 4)
        if (k < K) {
          *reinterpret_cast<int4*>(ids + static_cast<size_t>(n_own) * K + k) =
              make_int4(id[k], id[k + 1], id[k + 2], id[k + 3]);
          *reinterpret_cast<float4*>(weights + static_cast<size_t>(n_own) * K + k) =
              make_float4(w[k], w[k + 1], w[k + 2], w[k + 3]);
        }
    } else {
      sere_store_token(ids, weights, n_own, K, id, w);
    }
  }
}

}  // namespace

Status router_topk(const bf16* logits, const float* bias, int32_t* ids, float* weights, int N, int E, int K,
                   cudaStream_t stream) {
  if (N <= 0 || E <= 0 || E > kMaxExperts || K <= 0 || K > kMaxTopK || K > E)
    return invalid_argument("router_topk: need N > 0, 0 < E <= 1024 and 0 < K <= min(16, E) (N=" + std::to_string(N) +
                            " E=" + std::to_string(E) + " K=" + std::to_string(K) + ")");
  const size_t smem = static_cast<size_t>(kRouterWarps) * E * sizeof(float);
  return launch("router_topk", router_topk_kernel, dim3((N + kRouterWarps - 1) / kRouterWarps),
                dim3(kRouterWarps * 32), smem, stream, logits, bias, ids, weights, N, E, K);
}

Status sere_reroute(int32_t* ids, float* weights, const float* sim, int N, int E, int K, int S, float rho,
                    cudaStream_t stream) {
  if (S <= 0 || S >= K) return Status::ok();
  if (N <= 0 || E <= 0 || E > kMaxExperts || K > kMaxTopK)
    return invalid_argument("sere_reroute: need N > 0, 0 < E <= 1024 and K <= 16 (N=" + std::to_string(N) +
                            " E=" + std::to_string(E) + " K=" + std::to_string(K) + ")");
  if (!sim) return invalid_argument("sere_reroute: the similarity matrix is null");
  const bool vec = E % 4 == 0 && reinterpret_cast<uintptr_t>(sim) % 16 == 0;
  if (E <= kSereFastMaxE && decode_option(DecodeOption::kSereKernel) == 0) {
    const bool vec_tok =
        K % 4 == 0 && (reinterpret_cast<uintptr_t>(ids) | reinterpret_cast<uintptr_t>(weights)) % 16 == 0;
    const dim3 grid((N + kSereFastThreads - 1) / kSereFastThreads);
    if (K <= 8)
      return launch("sere_reroute", sere_reroute_fast_kernel<8>, grid, dim3(kSereFastThreads), 0, stream, ids, weights,
                    sim, N, E, K, S, rho, vec, vec_tok);
    return launch("sere_reroute", sere_reroute_fast_kernel<kMaxTopK>, grid, dim3(kSereFastThreads), 0, stream, ids,
                  weights, sim, N, E, K, S, rho, vec, vec_tok);
  }
  if (K <= 8)
    return launch("sere_reroute", sere_reroute_kernel<8>, dim3(1), dim3(kSereThreads), 0, stream, ids, weights, sim, N,
                  E, K, S, rho, vec);
  return launch("sere_reroute", sere_reroute_kernel<kMaxTopK>, dim3(1), dim3(kSereThreads), 0, stream, ids, weights,
                sim, N, E, K, S, rho, vec);
}

}  // namespace zest::cuda
