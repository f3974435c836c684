// Decode attention over the paged KV cache (flash-decoding): CTA (split, kv head, sequence) with 4 warps,
// each warp streams whole 16-token blocks and keeps an online softmax for all G query heads of its kv head
// (K/V loaded once per group). The last CTA of a (sequence, kv head) merges the splits in fixed order.
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"

namespace zest::cuda {

namespace {

constexpr int kHeadDim = 128;
constexpr int kDecWarps = 4;
constexpr int kMaxSplits = 128;
// Per (head, split) partial: M, L, 2 pad, then D accumulators (16-byte aligned).
constexpr int kPartStride = kHeadDim + 4;

struct SplitPlan {
  int splits = 1, pages_per_split = 1;
};

__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t a) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
  return d;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0) : "memory");
}

// Tensor-core page loop for 8 query heads per kv head (one warp per page, pages pg_first, pg_first + kDecWarps, ...
// below pg_end). Per 16-token page: S^T[16 tokens x 8 heads] = K Q^T by mma (K rows straight from global memory
// as A fragments, q as B fragments, the same permutation of the head dimension for both: each thread holds 8
// consecutive values); online softmax per head over the tokens (column reductions over the 8 lanes of a thread
// quad position); P^T turned into B fragments by movmatrix; O^T[128 x 8] += V^T P^T with V^T A fragments from a
// swizzled shared-memory copy of the page (cp.async, ldmatrix.trans). The next page's K and V are in flight while
// the current one is computed. Leaves m, l (heads 2tq, 2tq+1) and O^T in registers.
struct MmaState {
  float m[2], l[2];
  float o[8][4];  // m-tile mt: [d mt*16 + g][heads 2tq, 2tq+1], [d mt*16 + g + 8][...]
};

__device__ __forceinline__ void mma_state_init(MmaState& st) {
  st.m[0] = st.m[1] = -INFINITY;
  st.l[0] = st.l[1] = 0.f;
#pragma unroll
  for (int mt = 0; mt < 8; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) st.o[mt][i] = 0.f;
}

// One page's online-softmax step of a warp's 8 query heads. sc: the scores S^T of the lane (g, tq) (c0, c1 = token
// g, heads 2tq, 2tq + 1; c2, c3 = token g + 8), scaled here and masked past nv tokens; the running max and sum and the
// output are updated, and P^T comes back as the B fragments (pb0, pb1) of the P V mma ([token g][heads 2tq..] blocks
// transposed to [head g][tokens 2tq..]).
__device__ __forceinline__ void page_softmax(MmaState& st, const float (&sc)[4], int nv, float scale, uint32_t& pb0,
                                             uint32_t& pb1) {
  const int g = (threadIdx.x & 31) >> 2;
  const bool v0 = g < nv, v1 = g + 8 < nv;
  const float s[4] = {v0 ? sc[0] * scale : -INFINITY, v0 ? sc[1] * scale : -INFINITY,
                      v1 ? sc[2] * scale : -INFINITY, v1 ? sc[3] * scale : -INFINITY};
  float p[4], alpha[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // head 2tq + h: values s[h] (token g) and s[2 + h] (token g + 8)
    float mx = fmaxf(s[h], s[2 + h]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float m_new = fmaxf(st.m[h], mx);
    const bool any = m_new != -INFINITY;
    p[h] = any && s[h] != -INFINITY ? __expf(s[h] - m_new) : 0.f;
    p[2 + h] = any && s[2 + h] != -INFINITY ? __expf(s[2 + h] - m_new) : 0.f;
    float ps = p[h] + p[2 + h];
    ps += __shfl_xor_sync(0xffffffffu, ps, 4);
    ps += __shfl_xor_sync(0xffffffffu, ps, 8);
    ps += __shfl_xor_sync(0xffffffffu, ps, 16);
    alpha[h] = st.m[h] == -INFINITY ? 0.f : __expf(st.m[h] - m_new);
    st.l[h] = st.l[h] * alpha[h] + ps;
    st.m[h] = m_new;
  }
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) {
    st.o[mt][0] *= alpha[0];
    st.o[mt][1] *= alpha[1];
    st.o[mt][2] *= alpha[0];
    st.o[mt][3] *= alpha[1];
  }
  pb0 = movmatrix_trans(pack_bf16(p[0], p[1]));
  pb1 = movmatrix_trans(pack_bf16(p[2], p[3]));
}

// The P V mma of one page: V^T as A fragments (ldmatrix.trans) from the page's 16 rows in shared memory at vb (rows
// of 128, 16-byte pieces swizzled by token: piece c8 of token t at (c8 ^ (t & 7))), P^T as B.
__device__ __forceinline__ void page_pv(MmaState& st, const bf16* vb, uint32_t pb0, uint32_t pb1) {
  constexpr int D = kHeadDim;
  const int lane = threadIdx.x & 31, mi = lane >> 3, r = lane & 7;
  const int tok = r + (mi >= 2 ? 8 : 0);
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) {
    const int c8 = mt * 2 + (mi & 1);
    const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(vb + tok * D + ((c8 ^ (tok & 7)) * 8)));
    uint32_t a0, a1, a2, a3;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                 : "r"(addr));
    mma16816(st.o[mt], a0, a1, a2, a3, pb0, pb1);
  }
}

// Issues the loads of page pg (kv head kvh) into buffer buf of v_s: V by cp.async (one commit group; tokens >= nv
// zero-filled) in page_pv's swizzled layout, K rows g and g + 8 of the lane into kf (register streaming).
__device__ __forceinline__ void issue_page(const int32_t* table, int pg, int ctx, int Hkv, int kvh,
                                           const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                                           bf16* v_s, int buf, uint4 (&kf)[4][2]) {
  constexpr int D = kHeadDim;
  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const size_t row_stride = static_cast<size_t>(Hkv) * D;
  const int blk = table[pg];
  const int nv = min(kKvBlock, ctx - pg * kKvBlock);
  const size_t base = (static_cast<size_t>(blk) * kKvBlock * Hkv + kvh) * D;
  bf16* vb = v_s + buf * kKvBlock * D;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int piece = lane + 32 * i, tok = piece >> 4, c8 = piece & 15;
    cp_async16(vb + tok * D + ((c8 ^ (tok & 7)) * 8), v_cache + base + (tok < nv ? tok : 0) * row_stride + c8 * 8,
               tok < nv);
  }
  asm volatile("cp.async.commit_group;" ::: "memory");
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    kf[c][0] = g < nv ? ld_stream(k_cache + base + g * row_stride + c * 32 + tq * 8) : make_uint4(0, 0, 0, 0);
    kf[c][1] = g + 8 < nv ? ld_stream(k_cache + base + (g + 8) * row_stride + c * 32 + tq * 8) : make_uint4(0, 0, 0, 0);
  }
}

// S^T of one page: K rows (g, g + 8) as A fragments from registers, q of head g as B.
__device__ __forceinline__ void page_scores(const uint4 (&kf)[4][2], const uint4 (&qf)[4], float (&sc)[4]) {
  sc[0] = sc[1] = sc[2] = sc[3] = 0.f;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    mma16816(sc, kf[c][0].x, kf[c][1].x, kf[c][0].y, kf[c][1].y, qf[c].x, qf[c].y);
    mma16816(sc, kf[c][0].z, kf[c][1].z, kf[c][0].w, kf[c][1].w, qf[c].z, qf[c].w);
  }
}

__device__ __forceinline__ void mma_decode_pages(MmaState& st, const bf16* __restrict__ qg,
                                                 const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
                                                 const int32_t* __restrict__ table, int Hkv, int kvh, int ctx,
                                                 int pg_first, int pg_end, float scale, bf16* v_s /* [2][16 * 128] */) {
  constexpr int D = kHeadDim;
  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  mma_state_init(st);
  uint4 qf[4];  // head g, d = c * 32 + tq * 8 .. + 7
#pragma unroll
  for (int c = 0; c < 4; ++c) qf[c] = __ldg(reinterpret_cast<const uint4*>(qg + g * D + c * 32 + tq * 8));
  uint4 kcur[4][2], knext[4][2];
  int buf = 0;
  if (pg_first < pg_end) issue_page(table, pg_first, ctx, Hkv, kvh, k_cache, v_cache, v_s, 0, kcur);
  for (int pg = pg_first; pg < pg_end; pg += kDecWarps) {
    const bool more = pg + kDecWarps < pg_end;
    if (more) issue_page(table, pg + kDecWarps, ctx, Hkv, kvh, k_cache, v_cache, v_s, buf ^ 1, knext);
    float sc[4];
    page_scores(kcur, qf, sc);
    uint32_t pb0, pb1;
    page_softmax(st, sc, min(kKvBlock, ctx - pg * kKvBlock), scale, pb0, pb1);
    if (more) asm volatile("cp.async.wait_group 1;" ::: "memory");
    else asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncwarp();
    page_pv(st, v_s + buf * kKvBlock * D, pb0, pb1);
    __syncwarp();  // this buffer is refilled two pages later
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      kcur[c][0] = knext[c][0];
      kcur[c][1] = knext[c][1];
    }
    buf ^= 1;
  }
}

// Warp `warp`'s MmaState (8 query heads) into the CTA's per-warp partials: m_s / l_s [warps][8], acc_s [warps][8][128].
__device__ __forceinline__ void mma_state_to_smem(const MmaState& st, int warp, float (*m_s)[8], float (*l_s)[8],
                                                  float (*acc_s)[8][kHeadDim]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  if (g == 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_s[warp][2 * tq + h] = st.m[h];
      l_s[warp][2 * tq + h] = st.l[h];
    }
  }
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) {
    acc_s[warp][2 * tq][mt * 16 + g] = st.o[mt][0];
    acc_s[warp][2 * tq + 1][mt * 16 + g] = st.o[mt][1];
    acc_s[warp][2 * tq][mt * 16 + g + 8] = st.o[mt][2];
    acc_s[warp][2 * tq + 1][mt * 16 + g + 8] = st.o[mt][3];
  }
}

// The CTA's kDecWarps warp partials merged into one per query head, in warp order: store(idx, hh, d, M, L, A) for
// each element idx = hh * 128 + d of [G][128].
template <int G, class Store>
__device__ __forceinline__ void merge_warp_partials(const float (*m_s)[G], const float (*l_s)[G],
                                                    const float (*acc_s)[G][kHeadDim], Store store) {
  constexpr int D = kHeadDim;
  for (int idx = threadIdx.x; idx < G * D; idx += blockDim.x) {
    const int hh = idx / D, d = idx % D;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDecWarps; ++w) M = fmaxf(M, m_s[w][hh]);
    float L = 0.f, A = 0.f;
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kDecWarps; ++w) {
        const float e = __expf(m_s[w][hh] - M);
        L += l_s[w][hh] * e;
        A += acc_s[w][hh][d] * e;
      }
    }
    store(idx, hh, d, M, L, A);
  }
}

// After the CTA stored its split partial to global memory: true in the CTA that counts last on `counter` (which it
// resets for the next launch), with every other split's partial visible to it. Every thread of the CTA calls it.
__device__ __forceinline__ bool last_split(int* counter, int splits, int* flag_s) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int prev = atomicAdd(counter, 1);
    *flag_s = prev == splits - 1;
    if (*flag_s) *counter = 0;
  }
  __syncthreads();
  if (!*flag_s) return false;
  __threadfence();
  return true;
}

// Inside a cluster whose CTAs each hold a split partial in shared memory (at the same offsets: cp [heads][128] sums,
// cm and cl [heads] M and L): this CTA's share of the outputs o [heads][128], W consecutive elements per thread (1 or
// 4), the splits merged in rank order.
template <int W>
__device__ __forceinline__ void merge_cluster_partials(const float* cp, const float* cm, const float* cl, int heads,
                                                       bf16* o) {
  constexpr int D = kHeadDim;
  const int C = static_cast<int>(cluster_size()), rank = static_cast<int>(cluster_rank());
  for (int i = rank * static_cast<int>(blockDim.x) + threadIdx.x; i < heads * D / W;
       i += C * static_cast<int>(blockDim.x)) {
    const int hh = i / (D / W);
    float ms[16], ls[16], as[16][W];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      ms[r] = r < C ? ld_cluster_f32(cluster_map(cm + hh, r)) : -INFINITY;
      ls[r] = r < C ? ld_cluster_f32(cluster_map(cl + hh, r)) : 0.f;
      if constexpr (W == 4) {
        const float4 v = r < C ? ld_cluster_f32x4(cluster_map(cp + i * 4, r)) : make_float4(0.f, 0.f, 0.f, 0.f);
        as[r][0] = v.x;
        as[r][1] = v.y;
        as[r][2] = v.z;
        as[r][3] = v.w;
      } else {
        as[r][0] = r < C ? ld_cluster_f32(cluster_map(cp + i, r)) : 0.f;
      }
    }
    float M = -INFINITY;
#pragma unroll
    for (int r = 0; r < 16; ++r) M = fmaxf(M, ms[r]);
    float L = 0.f;
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      ms[r] = M == -INFINITY ? 0.f : __expf(ms[r] - M);
      L += ls[r] * ms[r];
    }
    const float inv = L > 0.f ? 1.f / L : 0.f;
    float A[W];
#pragma unroll
    for (int j = 0; j < W; ++j) A[j] = 0.f;
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const float w = ms[r] * inv;
#pragma unroll
      for (int j = 0; j < W; ++j) A[j] += as[r][j] * w;
    }
    if constexpr (W == 4) {
      uint2 pk;
      pk.x = pack_bf16(A[0], A[1]);
      pk.y = pack_bf16(A[2], A[3]);
      *reinterpret_cast<uint2*>(o + i * 4) = pk;
    } else {
      o[i] = __float2bfloat16(A[0]);
    }
  }
}

// kMma: the tensor-core page loop (G == 8 only); else CUDA cores for any G.
// The last CTA of a (sequence, head group) merges the split partials of `heads` consecutive query heads (pb: the
// first head's partials [heads][splits][kPartStride]; o: its output row) in fixed split order: M and L of every
// (head, split) in one round of loads into shared memory (wm: 2 * heads * max_splits floats), then per-head weights
// exp(M_s - M) / L, then four output elements per thread (16-byte loads, the loads of 8 splits issued before their
// sums so that they overlap).
__device__ void merge_split_partials(const float* pb, int heads, int splits, int max_splits, float* wm, bf16* o) {
  constexpr int D = kHeadDim;
  constexpr size_t part_stride = kPartStride;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  float* wl = wm + heads * max_splits;
  for (int i = threadIdx.x; i < heads * splits; i += blockDim.x) {
    const int hh = i / splits, sp = i % splits;
    wm[hh * max_splits + sp] = __ldcg(pb + (static_cast<size_t>(hh) * splits + sp) * part_stride);
    wl[hh * max_splits + sp] = __ldcg(pb + (static_cast<size_t>(hh) * splits + sp) * part_stride + 1);
  }
  __syncthreads();
  for (int hh = warp; hh < heads; hh += nwarps) {
    float M = -INFINITY;
    for (int sp = lane; sp < splits; sp += 32) M = fmaxf(M, wm[hh * max_splits + sp]);
    M = warp_max(M);
    float L = 0.f;
    for (int sp = lane; sp < splits; sp += 32) {
      const float e = M == -INFINITY ? 0.f : __expf(wm[hh * max_splits + sp] - M);
      L += wl[hh * max_splits + sp] * e;
      wm[hh * max_splits + sp] = e;
    }
    L = warp_sum(L);
    const float inv = L > 0.f ? 1.f / L : 0.f;
    __syncwarp();
    for (int sp = lane; sp < splits; sp += 32) wm[hh * max_splits + sp] *= inv;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < heads * D / 4; idx += blockDim.x) {
    const int hh = idx / (D / 4), d = (idx % (D / 4)) * 4;
    const float* pp = pb + static_cast<size_t>(hh) * splits * part_stride + 4 + d;
    const float* wg = wm + hh * max_splits;
    float4 A = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int s0 = 0; s0 < splits; s0 += 8) {
      float4 v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u)
        v[u] = s0 + u < splits ? __ldcg(reinterpret_cast<const float4*>(pp + (s0 + u) * part_stride))
                               : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (s0 + u >= splits) break;
        const float wv = wg[s0 + u];
        A.x += v[u].x * wv;
        A.y += v[u].y * wv;
        A.z += v[u].z * wv;
        A.w += v[u].w * wv;
      }
    }
    __nv_bfloat162 lo = __floats2bfloat162_rn(A.x, A.y), hi = __floats2bfloat162_rn(A.z, A.w);
    uint2 pk;
    pk.x = *reinterpret_cast<uint32_t*>(&lo);
    pk.y = *reinterpret_cast<uint32_t*>(&hi);
    *reinterpret_cast<uint2*>(o + static_cast<size_t>(hh) * D + d) = pk;
  }
}

// The global-merge ending of the page-loop kernels: this split's partials of the G heads of (sequence b, kv head kvh),
// merged over the warps (m_s, l_s, acc_s), go to part; the last split of the pair to finish (counters) merges every
// split's partials into out, reusing acc_s.
template <int G>
__device__ __forceinline__ void finish_split_global(const float (*m_s)[G], const float (*l_s)[G],
                                                    float (*acc_s)[G][kHeadDim], float* part, int* counters, bf16* out,
                                                    int b, int kvh, int split, int splits, int Hq, int Hkv,
                                                    int* last_s) {
  float* pb = part + ((static_cast<size_t>(b) * Hq + kvh * G) * splits + split) * kPartStride;
  merge_warp_partials<G>(m_s, l_s, acc_s, [&](int, int hh, int d, float M, float L, float A) {
    float* pp = pb + static_cast<size_t>(hh) * splits * kPartStride;
    pp[4 + d] = A;
    if (d == 0) {
      pp[0] = M;
      pp[1] = L;
    }
  });
  if (!last_split(counters + b * Hkv + kvh, splits, last_s)) return;
  merge_split_partials(part + (static_cast<size_t>(b) * Hq + kvh * G) * splits * kPartStride, G, splits, kMaxSplits,
                       &acc_s[0][0][0], out + (static_cast<size_t>(b) * Hq + kvh * G) * kHeadDim);
}


template <int G, bool kMma>
__global__ void __launch_bounds__(kDecWarps * 32, 3) decode_attention_kernel(
    const bf16* __restrict__ q, int q_stride, const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
    const int32_t* __restrict__ block_table, int max_blocks, const int32_t* __restrict__ context_lens,
    bf16* __restrict__ out, float* __restrict__ part, int* __restrict__ counters, int Hkv, int splits,
    int pages_per_split, float scale) {
  pdl_wait();
  constexpr int D = kHeadDim;
  // Shared memory of the page loop (CUDA cores: q and probabilities; mma: two V pages per warp), reused for the
  // per-warp partial outputs once every warp has left the loop.
  constexpr size_t kCoreBytes = (G * D + kDecWarps * G * kKvBlock) * sizeof(float);
  constexpr size_t kMmaBytes = kMma ? kDecWarps * 2 * kKvBlock * D * sizeof(bf16) : 0;
  constexpr size_t kAccBytes = kDecWarps * G * D * sizeof(float);
  constexpr size_t kBytes = kCoreBytes > kMmaBytes ? (kCoreBytes > kAccBytes ? kCoreBytes : kAccBytes)
                                                   : (kMmaBytes > kAccBytes ? kMmaBytes : kAccBytes);
  __shared__ __align__(16) unsigned char smem_raw[kBytes];
  float(*q_s)[D] = reinterpret_cast<float(*)[D]>(smem_raw);
  float(*p_s)[G][kKvBlock] = reinterpret_cast<float(*)[G][kKvBlock]>(smem_raw + G * D * sizeof(float));
  float(*acc_s)[G][D] = reinterpret_cast<float(*)[G][D]>(smem_raw);
  __shared__ float m_s[kDecWarps][G], l_s[kDecWarps][G];
  __shared__ int last_s;
  step_timeline_phase(0);

  const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int Hq = Hkv * G;
  const int ctx = context_lens[b];
  const int pg_begin = split * pages_per_split;
  const int pg_end = min(pg_begin + pages_per_split, (ctx + kKvBlock - 1) / kKvBlock);

  if constexpr (kMma) {
    static_assert(!kMma || G == 8, "the tensor-core page loop serves 8 query heads per kv head");
    MmaState st;
    mma_decode_pages(st, q + static_cast<size_t>(b) * q_stride + kvh * G * D, k_cache, v_cache,
                     block_table + static_cast<size_t>(b) * max_blocks, Hkv, kvh, ctx, pg_begin + warp, pg_end, scale,
                     reinterpret_cast<bf16*>(smem_raw) + warp * 2 * kKvBlock * D);
    __syncthreads();  // acc_s overlays the V pages
    mma_state_to_smem(st, warp, reinterpret_cast<float(*)[8]>(m_s), reinterpret_cast<float(*)[8]>(l_s),
                      reinterpret_cast<float(*)[8][D]>(acc_s));
  } else {
  {
    const bf16* qg = q + static_cast<size_t>(b) * q_stride + kvh * G * D;
    if ((reinterpret_cast<uintptr_t>(qg) & 15) == 0) {  // 8 values per 16-byte load, all loads in flight at once
      for (int i = threadIdx.x; i < G * D / 8; i += blockDim.x) {
        const uint4 v = __ldg(reinterpret_cast<const uint4*>(qg) + i);
        const __nv_bfloat162* h2 = reinterpret_cast<const __nv_bfloat162*>(&v);
        float* dst = &q_s[0][0] + i * 8;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __bfloat1622float2(h2[j]);
          dst[2 * j] = f.x;
          dst[2 * j + 1] = f.y;
        }
      }
    } else {
      for (int i = threadIdx.x; i < G * D; i += blockDim.x) q_s[i / D][i % D] = __bfloat162float(qg[i]);
    }
  }
  __syncthreads();

  float m[G], l[G], acc[G][4];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[g][i] = 0.f;
  }

  const int t = lane >> 1, hf = lane & 1;
  const size_t row_stride = static_cast<size_t>(Hkv) * D;
  // Block ids of this warp's pages, fetched together (lane i holds the i-th page's id).
  int blk_lane = 0;
  {
    const int pg = pg_begin + warp + lane * kDecWarps;
    if (pg < pg_end && lane < 32) blk_lane = block_table[static_cast<size_t>(b) * max_blocks + pg];
  }
  int page_i = 0;
  for (int pg = pg_begin + warp; pg < pg_end; pg += kDecWarps, ++page_i) {
    int blk = __shfl_sync(0xffffffffu, blk_lane, page_i & 31);
    if (page_i >= 32) blk = block_table[static_cast<size_t>(b) * max_blocks + pg];
    const int nv = min(kKvBlock, ctx - pg * kKvBlock);
    const size_t base = (static_cast<size_t>(blk) * kKvBlock * Hkv + kvh) * D;
    // Scores: lanes 2t, 2t+1 hold token t's two halves of the head dimension.
    uint4 kv[8];
    const bool valid = t < nv;
    const bf16* krow = k_cache + base + t * row_stride + hf * 64;
#pragma unroll
    for (int i = 0; i < 8; ++i) kv[i] = valid ? ld_stream(krow + i * 8) : make_uint4(0, 0, 0, 0);
    uint2 vv[kKvBlock];
    const bf16* vbase = v_cache + base + lane * 4;
#pragma unroll
    for (int tt = 0; tt < kKvBlock; ++tt)
      vv[tt] = tt < nv ? *reinterpret_cast<const uint2*>(vbase + tt * row_stride) : make_uint2(0, 0);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float4* qv = reinterpret_cast<const float4*>(&q_s[g][hf * 64]);
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const __nv_bfloat162* pk = reinterpret_cast<const __nv_bfloat162*>(&kv[i]);
        const float4 a = qv[2 * i], c = qv[2 * i + 1];
        const float2 k0 = __bfloat1622float2(pk[0]), k1 = __bfloat1622float2(pk[1]);
        const float2 k2 = __bfloat1622float2(pk[2]), k3 = __bfloat1622float2(pk[3]);
        s = fmaf(a.x, k0.x, s);
        s = fmaf(a.y, k0.y, s);
        s = fmaf(a.z, k1.x, s);
        s = fmaf(a.w, k1.y, s);
        s = fmaf(c.x, k2.x, s);
        s = fmaf(c.y, k2.y, s);
        s = fmaf(c.z, k3.x, s);
        s = fmaf(c.w, k3.y, s);
      }
      s += __shfl_xor_sync(0xffffffffu, s, 1);
      s = valid ? s * scale : -INFINITY;
      float mx = s;
#pragma unroll
      for (int o = 2; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      const float m_new = fmaxf(m[g], mx);
      const float pv = valid ? __expf(s - m_new) : 0.f;
      float ps = hf == 0 ? pv : 0.f;
#pragma unroll
      for (int o = 2; o < 32; o <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
      const float alpha = __expf(m[g] - m_new);
      l[g] = l[g] * alpha + ps;
      m[g] = m_new;
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[g][i] *= alpha;
      if (hf == 0) p_s[warp][g][t] = pv;
    }
    __syncwarp();
#pragma unroll
    for (int tt = 0; tt < kKvBlock; ++tt) {
      const __nv_bfloat162* pv2 = reinterpret_cast<const __nv_bfloat162*>(&vv[tt]);
      const float2 v01 = __bfloat1622float2(pv2[0]), v23 = __bfloat1622float2(pv2[1]);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float p = p_s[warp][g][tt];
        acc[g][0] = fmaf(p, v01.x, acc[g][0]);
        acc[g][1] = fmaf(p, v01.y, acc[g][1]);
        acc[g][2] = fmaf(p, v23.x, acc[g][2]);
        acc[g][3] = fmaf(p, v23.y, acc[g][3]);
      }
    }
    __syncwarp();
  }

  __syncthreads();  // acc_s overlays q_s and p_s
  // Merge the warps of this CTA into one partial per query head.
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (lane == 0) {
      m_s[warp][g] = m[g];
      l_s[warp][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) acc_s[warp][g][lane * 4 + i] = acc[g][i];
  }
  }  // CUDA-core page loop
  __syncthreads();
  finish_split_global<G>(m_s, l_s, acc_s, part, counters, out, b, kvh, split, splits, Hq, Hkv, &last_s);
}

// ---- decode attention with the current token's q/k RMSNorm + RoPE + KV write folded in (G == 8, D == 128) -----
// The function of qk_norm_rope_kv (decode: one token per sequence) followed by decode_attention, in one launch:
// - before waiting on the previous kernel (the qkv GEMM), each warp issues the loads of its first KV page (K rows
//   into registers, V by cp.async), since the cache holds no value of this step yet;
// - after the wait, every CTA normalises and rotates the 8 query heads of its kv head itself (the same arithmetic
//   as qk_norm_rope_kv, lane i holding elements i, i + 32, i + 64, i + 96) into shared memory; the CTA whose split
//   holds the current token's page also normalises and rotates that token's k, copies its v, stores both into the
//   cache slot and patches its page in registers (K) and shared memory (V) with them;
// - the page loop, the split partials and the merge are those of decode_attention_kernel<8, true>.
struct DecodeFuse {
  const bf16* q_norm;
  const bf16* k_norm;
  const int32_t* pos;
  int pos_stride;
  RopeParams rope;
  const int32_t* slots;
  float eps;
};

// A lane's RoPE factors for its two rotation pairs (j = lane, lane + 32) and its four norm weights (elements lane + 32 i).
struct RopeLane {
  float c[2], s[2];
};

__device__ __forceinline__ RopeLane rope_lane(const float* p_axis, const RopeParams& rope, int lane) {
  constexpr int D = kHeadDim;
  RopeLane r;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int j = lane + 32 * i;
    int axis = 0;
    if (j % 3 == 1 && j < 3 * rope.section_h) axis = 1;
    else if (j % 3 == 2 && j < 3 * rope.section_w) axis = 2;
    const float inv_freq = 1.f / powf(rope.theta, static_cast<float>(2 * j) / static_cast<float>(D));
    const float ang = p_axis[axis] * inv_freq;
    r.c[i] = bf16_round(cosf(ang));
    r.s[i] = bf16_round(sinf(ang));
  }
  return r;
}

// Sequence b's RoPE factors for this lane (rope_lane over its position's three axes) and the lane's four q and k norm
// weights (elements lane + 32 i): step inputs and weights, which the fused kernels load before their wait.
__device__ __forceinline__ RopeLane lane_rope_and_norms(const DecodeFuse& f, int b, int lane, float (&qw)[4],
                                                        float (&kw)[4]) {
  float p_axis[3];
  p_axis[0] = static_cast<float>(f.pos[b]);
  p_axis[1] = static_cast<float>(f.pos[f.pos_stride + b]);
  p_axis[2] = static_cast<float>(f.pos[2 * f.pos_stride + b]);
  const RopeLane rl = rope_lane(p_axis, f.rope, lane);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    qw[i] = __bfloat162float(f.q_norm[lane + 32 * i]);
    kw[i] = __bfloat162float(f.k_norm[lane + 32 * i]);
  }
  return rl;
}

// Lane's part of one head row, its 4 values (elements lane + 32 i) in registers: RMSNorm with weights w4 (the same
// elements) then rotate-half RoPE with the lane's factors; writes the 4 results to dst (shared) and, when kv_dst !=
// null, to kv_dst. The same arithmetic as qk_norm_rope_kv.
__device__ __forceinline__ void norm_rope_vals(const float (&v)[4], const float* w4, const RopeLane& rl, float eps,
                                               bf16* dst, bf16* kv_dst, int lane) {
  constexpr int D = kHeadDim, half = D / 2;
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) ss += v[i] * v[i];
  const float inv = rsqrtf(warp_sum(ss) / D + eps);
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // pairs (j, j + 64), j = lane + 32 i
    const int j = lane + 32 * i;
    const float a = bf16_round(bf16_round(v[i] * inv) * w4[i]);
    const float b = bf16_round(bf16_round(v[i + 2] * inv) * w4[i + 2]);
    const bf16 o1 = __float2bfloat16(a * rl.c[i] - b * rl.s[i]);
    const bf16 o2 = __float2bfloat16(b * rl.c[i] + a * rl.s[i]);
    dst[j] = o1;
    dst[j + half] = o2;
    if (kv_dst) {
      kv_dst[j] = o1;
      kv_dst[j + half] = o2;
    }
  }
}

// norm_rope_vals on one head row x [128] (bf16, global).
__device__ __forceinline__ void norm_rope_head(const bf16* __restrict__ x, const float* w4, const RopeLane& rl,
                                               float eps, bf16* dst, bf16* kv_dst, int lane) {
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = __bfloat162float(x[lane + 32 * i]);
  norm_rope_vals(v, w4, rl, eps, dst, kv_dst, lane);
}

// kCluster: the grid's splits of one (kv head, sequence) form one thread-block cluster; each CTA keeps its partial
// (M, L and the 8 x 128 sums) in its shared memory and, after a cluster barrier, merges a slice of the outputs from
// every CTA's partial (distributed shared memory, fixed split order): no global partials, fences or counters.
// kVSlots: shared-memory V page buffers. 8 = two per warp. 5 (the compact form, where a split has at most 5 pages:
// only warp 0 has a second page) = one per warp and warp 0's second in slot 4: 23 KB of shared memory instead of 35,
// and at most 128 registers (164 otherwise; 56 bytes of spills), so that the CTA fits on an SM beside three qkv GEMM
// CTAs of the one-token form with the norm folded in (3 x 65 KB tiles, 3 x 256 x 64 registers) or of the plain form
// (batch 2), and its cluster becomes resident (and issues its pages) before they leave (measured at batch 1 and 2:
// TPOT -0.02 to -0.09 and -0.085 to -0.1 ms). The same arithmetic either way.
template <bool kCluster, int kVSlots = 2 * kDecWarps>
__global__ void __launch_bounds__(kDecWarps * 32, kVSlots == 2 * kDecWarps ? 3 : 4) decode_attention_fused_kernel(
    const bf16* __restrict__ qkv, int q_stride, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
    const int32_t* __restrict__ block_table, int max_blocks, const int32_t* __restrict__ context_lens,
    bf16* __restrict__ out, float* __restrict__ part, int* __restrict__ counters, int Hkv, int splits,
    int pages_per_split, float scale, DecodeFuse f) {
  constexpr int G = 8, D = kHeadDim;
  static_assert(kVSlots == 2 * kDecWarps || kVSlots == kDecWarps + 1, "V slots: two per warp, or warp 0's two");
  constexpr size_t kMmaBytes = kVSlots * kKvBlock * D * sizeof(bf16);
  constexpr size_t kAccBytes = kDecWarps * G * D * sizeof(float);
  constexpr size_t kClusterBytes = kAccBytes + (G * D + 2 * G) * sizeof(float);
  constexpr size_t kBytes0 = kMmaBytes > kAccBytes ? kMmaBytes : kAccBytes;
  constexpr size_t kBytes = kCluster && kClusterBytes > kBytes0 ? kClusterBytes : kBytes0;
  __shared__ __align__(16) unsigned char smem_raw[kBytes];
  __shared__ __align__(16) bf16 q_s[G * D];
  __shared__ __align__(16) bf16 kn_s[D], vn_s[D];
  float(*acc_s)[G][D] = reinterpret_cast<float(*)[G][D]>(smem_raw);
  __shared__ float m_s[kDecWarps][G], l_s[kDecWarps][G];
  __shared__ int last_s;
  step_timeline_phase(0);  // the CTA is resident

  const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int Hq = Hkv * G;
  const int ctx = context_lens[b];  // a step input, not written by the previous kernel
  const int pg_begin = split * pages_per_split;
  const int pg_end = min(pg_begin + pages_per_split, (ctx + kKvBlock - 1) / kKvBlock);
  const int new_pos = ctx - 1;
  const int new_pg = new_pos >= 0 && new_pos / kKvBlock >= pg_begin && new_pos / kKvBlock < pg_end ? new_pos / kKvBlock
                                                                                                  : -1;
  const int32_t* table = block_table + static_cast<size_t>(b) * max_blocks;
  // This warp's V buffer buf (0 or 1).
  auto v_buf = [&](int buf) {
    return reinterpret_cast<bf16*>(smem_raw) +
           static_cast<size_t>(kVSlots == 2 * kDecWarps ? warp * 2 + buf : (buf == 0 ? warp : kDecWarps + warp)) *
               kKvBlock * D;
  };

  auto load_page = [&](int pg, int buf, uint4 (&kf)[4][2]) {
    issue_page(table, pg, ctx, Hkv, kvh, k_cache, v_cache, v_buf(buf), 0, kf);
  };

  const int pg_first = pg_begin + warp;
  uint4 kcur[4][2], knext[4][2];
  // Before the wait (the cache is not written by this step yet): the warp's first two pages, both buffers.
  if (pg_first < pg_end) load_page(pg_first, 0, kcur);
  if (pg_first + kDecWarps < pg_end) load_page(pg_first + kDecWarps, 1, knext);
  // Also before the wait: the RoPE factors (positions are step inputs) and the norm weights.
  float qw[4], kw[4];
  const RopeLane rl = lane_rope_and_norms(f, b, lane, qw, kw);
  const int slot = new_pg >= 0 && f.slots ? f.slots[b] : -1;
  pdl_wait();

  {  // q heads 2 warp, 2 warp + 1 of this kv head; the current token's k (warp 0) and v (warp 1) in the owner CTA
    const bf16* row = qkv + static_cast<size_t>(b) * q_stride;
    for (int h = 2 * warp; h < 2 * warp + 2; ++h)
      norm_rope_head(row + static_cast<size_t>(kvh * G + h) * D, qw, rl, f.eps, q_s + h * D, nullptr, lane);
    if (new_pg >= 0) {
      const size_t dst = (static_cast<size_t>(slot) * Hkv + kvh) * D;
      if (warp == 0) {
        norm_rope_head(row + static_cast<size_t>(Hq + kvh) * D, kw, rl, f.eps, kn_s,
                       slot >= 0 ? k_cache + dst : nullptr, lane);
      } else if (warp == 1) {
        const bf16* vr = row + static_cast<size_t>(Hq + Hkv + kvh) * D;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const bf16 v = vr[lane + 32 * i];
          vn_s[lane + 32 * i] = v;
          if (slot >= 0) v_cache[dst + lane + 32 * i] = v;
        }
      }
    }
  }
  __syncthreads();
  step_timeline_phase(1);  // q normalised and roped, the current token's k / v stored

  MmaState st;
  mma_state_init(st);
  uint4 qf[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) qf[c] = *reinterpret_cast<const uint4*>(q_s + g * D + c * 32 + tq * 8);
  int buf = 0;
  for (int pg = pg_first; pg < pg_end; pg += kDecWarps) {
    const bool more = pg + kDecWarps < pg_end;
    if (more && pg != pg_first) load_page(pg + kDecWarps, buf ^ 1, knext);  // the second page was issued before
    const int nv = min(kKvBlock, ctx - pg * kKvBlock);
    const int tn = pg == new_pg ? new_pos - pg * kKvBlock : -1;  // the current token's row in this page
    if (tn >= 0 && (tn & 7) == g) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const uint4 kv = *reinterpret_cast<const uint4*>(kn_s + c * 32 + tq * 8);
        if (tn < 8) kcur[c][0] = kv;
        else kcur[c][1] = kv;
      }
    }
    float sc[4];
    page_scores(kcur, qf, sc);
    uint32_t pb0, pb1;
    page_softmax(st, sc, nv, scale, pb0, pb1);
    if (more) asm volatile("cp.async.wait_group 1;" ::: "memory");
    else asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncwarp();
    bf16* vb = v_buf(buf);
    if (tn >= 0) {  // the current token's v over the (stale) cache row
      if (lane < 16)
        *reinterpret_cast<uint4*>(vb + tn * D + ((lane ^ (tn & 7)) * 8)) =
            *reinterpret_cast<const uint4*>(vn_s + lane * 8);
      __syncwarp();
    }
    page_pv(st, vb, pb0, pb1);
    __syncwarp();
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      kcur[c][0] = knext[c][0];
      kcur[c][1] = knext[c][1];
    }
    buf ^= 1;
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  __syncthreads();  // acc_s overlays the V pages
  mma_state_to_smem(st, warp, m_s, l_s, acc_s);
  __syncthreads();
  step_timeline_phase(2);  // the pages attended
  if constexpr (kCluster) {
    // This CTA's partial, in the bytes after acc_s: [G][D] sums, then M and L per head.
    float* cp = reinterpret_cast<float*>(smem_raw + kAccBytes);
    float* cm = cp + G * D;
    float* cl = cm + G;
    merge_warp_partials<G>(m_s, l_s, acc_s, [&](int idx, int hh, int d, float M, float L, float A) {
      cp[idx] = A;
      if (d == 0) {
        cm[hh] = M;
        cl[hh] = L;
      }
    });
    cluster_arrive();
    cluster_wait();
    step_timeline_phase(3);  // every split's partial in its CTA's shared memory
    merge_cluster_partials<1>(cp, cm, cl, G, out + static_cast<size_t>(b) * Hq * D + static_cast<size_t>(kvh) * G * D);
    step_timeline_phase(4);  // this CTA's slice of the output written
    cluster_arrive();  // no CTA leaves while another may still read its partial
    cluster_wait();
    return;
  }
  finish_split_global<G>(m_s, l_s, acc_s, part, counters, out, b, kvh, split, splits, Hq, Hkv, &last_s);
}

// ---- fused decode attention fed by a bulk-copy ring (4 kv heads per CTA) ----------------------------------------
// The paged cache stores a token's row with all its kv heads ([block][token][kv head][128]), so the 4 kv heads
// [4 grp, 4 grp + 4) of one token are 1 KB of contiguous bytes. CTA (split, group, sequence), 5 warps:
// - the producer warp copies every page of the split (16 token rows of K and 16 of V, 1 KB each, one
//   cp.async.bulk per row and lane) into a ring of kRingStages shared-memory stages (rows padded to 1040 bytes so
//   that ldmatrix is free of bank conflicts), completing on the stage's full mbarrier; the first stages are issued
//   before the wait on the previous kernel, later ones when the four consumer warps have released the stage;
// - consumer warp w serves kv head 4 grp + w and its 8 query heads over every page of the split: q/k RMSNorm +
//   RoPE and the current token's k/v as in decode_attention_fused_kernel (the CTA whose split holds the current
//   token patches that row of the stage), S^T = K q^T with K A fragments by ldmatrix, the online softmax,
//   movmatrix and V^T P^T steps of mma_decode_pages; rows past the context are copies of the page's last valid
//   row (finite values, masked scores, zero probabilities);
// - every warp ends with a whole split partial of its 8 heads (no merge across warps); splits merge through
//   global partials and a last-CTA merge of all 32 heads (kCluster false) or inside a thread-block cluster over
//   distributed shared memory (kCluster true, at most 16 splits).
constexpr int kRingHeads = 4;                                   // kv heads per CTA (one consumer warp each)
constexpr int kRingRowCopy = kRingHeads * kHeadDim * 2;        // bytes of one token row's 4 heads
constexpr int kRingRow = kRingRowCopy + 16;                     // padded row in shared memory
constexpr int kRingStageBytes = 2 * kKvBlock * kRingRow;        // K rows, then V rows
constexpr int kRingStages = 3;  // measured faster than two or four (with one CTA per SM)
constexpr int kRingMaxSplits = 64;
constexpr int kRingThreads = (kRingHeads + 1) * 32;
constexpr int kRingQHeads = kRingHeads * 8;                     // query heads per CTA
// Dynamic shared memory of a ring of S stages: the stages, q_s [32][128] bf16, kn_s and vn_s [4][128] bf16, then the
// full [S] and empty [S] mbarriers.
constexpr size_t ring_q_off(int S) { return static_cast<size_t>(S) * kRingStageBytes; }
constexpr size_t ring_kn_off(int S) { return ring_q_off(S) + kRingQHeads * kHeadDim * 2; }
constexpr size_t ring_bar_off(int S) { return ring_kn_off(S) + 2 * kRingHeads * kHeadDim * 2; }
constexpr size_t ring_smem(int S) { return ring_bar_off(S) + 2 * S * sizeof(uint64_t); }
static_assert(kRingQHeads * kHeadDim * sizeof(float) + 2 * kRingQHeads * sizeof(float) <= ring_q_off(2),
              "the cluster partial fits in the ring");
static_assert(2 * kRingQHeads * kRingMaxSplits * sizeof(float) <= ring_q_off(2), "the merge weights fit in the ring");

template <bool kCluster>
__global__ void __launch_bounds__(kRingThreads, 2) decode_attention_ring_kernel(
    const bf16* __restrict__ qkv, int q_stride, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
    const int32_t* __restrict__ block_table, int max_blocks, const int32_t* __restrict__ context_lens,
    bf16* __restrict__ out, float* __restrict__ part, int* __restrict__ counters, int Hkv, int splits,
    int pages_per_split, float scale, DecodeFuse f) {
  constexpr int G = 8, D = kHeadDim, S = kRingStages, GH = kRingQHeads;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* q_s = reinterpret_cast<bf16*>(smem + ring_q_off(S));
  bf16* kn_s = reinterpret_cast<bf16*>(smem + ring_kn_off(S));
  bf16* vn_s = kn_s + kRingHeads * D;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + ring_bar_off(S));
  uint64_t* empty = full + S;
  __shared__ int last_s;
  step_timeline_phase(0);  // the CTA is resident

  const int split = blockIdx.x, grp = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int Hq = Hkv * G;
  const int kvh0 = grp * kRingHeads;
  const int ctx = context_lens[b];  // a step input, not written by the previous kernel
  const int pg_begin = split * pages_per_split;
  const int pg_end = min(pg_begin + pages_per_split, (ctx + kKvBlock - 1) / kKvBlock);
  const int npages = max(0, pg_end - pg_begin);
  const int new_pos = ctx - 1;
  const int new_pg = new_pos >= 0 && new_pos / kKvBlock >= pg_begin && new_pos / kKvBlock < pg_end ? new_pos / kKvBlock
                                                                                                  : -1;
  const int32_t* table = block_table + static_cast<size_t>(b) * max_blocks;
  const size_t row_stride = static_cast<size_t>(Hkv) * D;

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init_count(&full[s], 1);
      mbar_init_count(&empty[s], kRingHeads * 32);  // one arrival per consumer thread
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();

  MmaState st;
  if (warp == kRingHeads) {
    // Producer: page pg_begin + i into stage i % S; lanes 0-15 copy K rows, lanes 16-31 V rows.
    auto issue = [&](int i) {
      const int s = i % S, pg = pg_begin + i;
      const int blk = table[pg];
      const int nv = min(kKvBlock, ctx - pg * kKvBlock);
      if (lane == 0) mbar_arrive_expect_tx(&full[s], 2 * kKvBlock * kRingRowCopy);
      __syncwarp();
      const bf16* base = (lane < 16 ? k_cache : v_cache) + static_cast<size_t>(blk) * kKvBlock * row_stride +
                         static_cast<size_t>(kvh0) * D;
      unsigned char* half = smem + static_cast<size_t>(s) * kRingStageBytes + (lane < 16 ? 0 : kKvBlock * kRingRow);
      const int r = lane & 15, row = min(r, nv - 1);
      bulk_load(half + r * kRingRow, base + static_cast<size_t>(row) * row_stride, kRingRowCopy, &full[s]);
    };
    const int pre = min(npages, S);
    for (int i = 0; i < pre; ++i) issue(i);  // before the wait: the cache holds no value of this step yet
    pdl_wait();
    for (int i = S; i < npages; ++i) {
      mbar_wait(&empty[i % S], ((i / S) - 1) & 1);
      issue(i);
    }
  } else {
    const int kvh = kvh0 + warp;
    float qw[4], kw[4];
    const RopeLane rl = lane_rope_and_norms(f, b, lane, qw, kw);
    const int slot = new_pg >= 0 && f.slots ? f.slots[b] : -1;
    pdl_wait();
    const bf16* row = qkv + static_cast<size_t>(b) * q_stride;
    {  // this kv head's 8 query heads (all loads issued first), then the current token's k and v in the owner CTA
      float v[G][4];
#pragma unroll
      for (int h = 0; h < G; ++h)
#pragma unroll
        for (int i = 0; i < 4; ++i)
          v[h][i] = __bfloat162float(row[static_cast<size_t>(kvh * G + h) * D + lane + 32 * i]);
#pragma unroll
      for (int h = 0; h < G; ++h) norm_rope_vals(v[h], qw, rl, f.eps, q_s + (warp * G + h) * D, nullptr, lane);
      if (new_pg >= 0) {
        const size_t dst = (static_cast<size_t>(slot) * Hkv + kvh) * D;
        float kv4[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) kv4[i] = __bfloat162float(row[static_cast<size_t>(Hq + kvh) * D + lane + 32 * i]);
        norm_rope_vals(kv4, kw, rl, f.eps, kn_s + warp * D, slot >= 0 ? k_cache + dst : nullptr, lane);
        const bf16* vr = row + static_cast<size_t>(Hq + Hkv + kvh) * D;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const bf16 x = vr[lane + 32 * i];
          vn_s[warp * D + lane + 32 * i] = x;
          if (slot >= 0) v_cache[dst + lane + 32 * i] = x;
        }
      }
    }
    __syncwarp();
    step_timeline_phase(1);  // (thread 0: consumer warp 0) q normalised and roped, the current token's k / v stored
    uint32_t qb[8][2];  // B fragments of q^T: head g, d = kc * 16 + 2 tq (+1), + 8
#pragma unroll
    for (int kc = 0; kc < 8; ++kc) {
      const bf16* qr = q_s + (warp * G + g) * D + kc * 16 + 2 * tq;
      qb[kc][0] = *reinterpret_cast<const uint32_t*>(qr);
      qb[kc][1] = *reinterpret_cast<const uint32_t*>(qr + 8);
    }
    mma_state_init(st);
    const int mi = lane >> 3, r8 = lane & 7;
    // ldmatrix row addresses: K (non-transposed, rows = tokens) and V (transposed).
    const uint32_t k_lane = (r8 + (mi & 1) * 8) * kRingRow + warp * D * 2 + (mi >> 1) * 16;
    const uint32_t v_lane = (r8 + (mi >= 2 ? 8 : 0)) * kRingRow + warp * D * 2 + (mi & 1) * 16;
    for (int i = 0; i < npages; ++i) {
      const int s = i % S;
      mbar_wait(&full[s], (i / S) & 1);
      unsigned char* kst = smem + static_cast<size_t>(s) * kRingStageBytes;
      unsigned char* vst = kst + kKvBlock * kRingRow;
      const int pg = pg_begin + i;
      const int nv = min(kKvBlock, ctx - pg * kKvBlock);
      const int tn = pg == new_pg ? new_pos - pg * kKvBlock : -1;  // the current token's row in this page
      if (tn >= 0) {  // its k and v over the (stale) copies of the cache row
        const bf16* src = (lane < 16 ? kn_s : vn_s) + warp * D + (lane & 15) * 8;
        unsigned char* dst = (lane < 16 ? kst : vst) + tn * kRingRow + warp * D * 2 + (lane & 15) * 16;
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
        __syncwarp();
      }
      // Two accumulator chains (even and odd head-dimension chunks) halve the dependent mma latency.
      float sc[4] = {0.f, 0.f, 0.f, 0.f}, sc2[4] = {0.f, 0.f, 0.f, 0.f};
      const uint32_t ka = smem_addr(kst) + k_lane;
#pragma unroll
      for (int kc = 0; kc < 8; ++kc) {
        uint32_t a0, a1, a2, a3;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                     : "r"(ka + kc * 32));
        mma16816(kc & 1 ? sc2 : sc, a0, a1, a2, a3, qb[kc][0], qb[kc][1]);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) sc[k] += sc2[k];
      uint32_t pb0, pb1;
      page_softmax(st, sc, nv, scale, pb0, pb1);
      const uint32_t va = smem_addr(vst) + v_lane;
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
        uint32_t a0, a1, a2, a3;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                     : "r"(va + mt * 32));
        mma16816(st.o[mt], a0, a1, a2, a3, pb0, pb1);
      }
      // The patched row was written through the generic proxy; the stage's next bulk copy must come after it.
      if (tn >= 0) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      mbar_arrive(&empty[s]);  // each thread releases its own reads of the stage
      if (i == 0) step_timeline_phase(2);  // the first page attended
    }
    step_timeline_phase(3);  // every page attended
  }
  __syncthreads();  // every stage consumed: the ring's bytes are free

  if constexpr (kCluster) {
    // This CTA's partial at the start of the ring: [32][128] sums, then M and L per query head.
    float* cp = reinterpret_cast<float*>(smem);
    float* cm = cp + GH * D;
    float* cl = cm + GH;
    if (warp < kRingHeads) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int hh = warp * G + 2 * tq + h;
#pragma unroll
        for (int mt = 0; mt < 8; ++mt) {
          cp[hh * D + mt * 16 + g] = st.o[mt][h];
          cp[hh * D + mt * 16 + g + 8] = st.o[mt][2 + h];
        }
        if (g == 0) {
          cm[hh] = st.m[h];
          cl[hh] = st.l[h];
        }
      }
    }
    cluster_arrive();
    cluster_wait();
    step_timeline_phase(4);  // every split's partial in its CTA's shared memory
    // Four consecutive outputs per thread (16-byte loads from every CTA of the cluster), splits in rank order.
    merge_cluster_partials<4>(cp, cm, cl, GH,
                              out + static_cast<size_t>(b) * Hq * D + static_cast<size_t>(kvh0) * G * D);
    step_timeline_phase(5);  // this CTA's slice of the output written
    cluster_arrive();  // no CTA leaves while another may still read its partial
    cluster_wait();
    return;
  }

  constexpr size_t part_stride = kPartStride;
  if (warp < kRingHeads) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int qh = (kvh0 + warp) * G + 2 * tq + h;
      float* pp = part + ((static_cast<size_t>(b) * Hq + qh) * splits + split) * part_stride;
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) {
        pp[4 + mt * 16 + g] = st.o[mt][h];
        pp[4 + mt * 16 + g + 8] = st.o[mt][2 + h];
      }
      if (g == 0) {
        pp[0] = st.m[h];
        pp[1] = st.l[h];
      }
    }
  }
  if (!last_split(counters + b * Hkv + kvh0, splits, &last_s)) return;
  // Merge the splits of the 32 query heads (as decode_attention_kernel's merge, G = 32).
  merge_split_partials(part + (static_cast<size_t>(b) * Hq + kvh0 * G) * splits * kPartStride, GH, splits,
                       kRingMaxSplits, reinterpret_cast<float*>(smem),
                       out + (static_cast<size_t>(b) * Hq + kvh0 * G) * kHeadDim);
}

struct RingPlan {
  int splits = 1, pages_per_split = 1;
};

// Splits of the ring kernel: about two CTAs per SM over all (sequence, kv-head group) pairs, at least 4 pages per
// split with the global merge (its one merging CTA per sequence reads every split's partial) and 2 with the cluster
// merge (at most 16 splits there, 64 otherwise).
RingPlan ring_plan(const DecodeAttention& p, bool cluster) {
  constexpr int ctas_per_sm = 2;
  const int pages = std::max(1, (p.max_context + kKvBlock - 1) / kKvBlock);
  const int units = std::max(1, rows_class(p.batch) * std::max(1, p.kv_heads / kRingHeads));  // (kernels.h)
  const int split_target = std::max(1, ctas_per_sm * sm_count() / units);
  int per = std::max(cluster ? 2 : 4, (pages + split_target - 1) / split_target);
  per = std::max(per, (pages + (cluster ? 15 : kRingMaxSplits - 1)) / (cluster ? 16 : kRingMaxSplits));
  per = std::min(per, pages);
  RingPlan r;
  r.pages_per_split = per;
  r.splits = (pages + per - 1) / per;
  return r;
}

// CTAs of decode_attention_kernel<G, false> resident per SM (3 from the launch bounds when the query fails). The
// split plan (and so the workspace size) depends on this only, not on the page loop (tensor or CUDA cores).
int decode_ctas_per_sm(int G) {
  const void* fn = nullptr;
  switch (G) {
    case 1: fn = reinterpret_cast<const void*>(decode_attention_kernel<1, false>); break;
    case 2: fn = reinterpret_cast<const void*>(decode_attention_kernel<2, false>); break;
    case 4: fn = reinterpret_cast<const void*>(decode_attention_kernel<4, false>); break;
    case 8: fn = reinterpret_cast<const void*>(decode_attention_kernel<8, false>); break;
    case 16: fn = reinterpret_cast<const void*>(decode_attention_kernel<16, false>); break;
    default: return 3;
  }
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, kDecWarps * 32, 0) != cudaSuccess || n <= 0) return 3;
  return n;
}

SplitPlan split_plan(const DecodeAttention& p) {
  // At least about two CTAs per SM and at least one block per warp per split; among those split counts, the one
  // with the least (waves of resident CTAs) x (blocks per split), so the last wave is not left mostly empty.
  const int pages = std::max(1, (p.max_context + kKvBlock - 1) / kKvBlock);
  const int ctas = std::max(1, rows_class(p.batch) * p.kv_heads);  // planned for the row class (kernels.h)
  const int slots = decode_ctas_per_sm(p.q_heads / std::max(1, p.kv_heads)) * sm_count();
  const int max_splits = std::min(kMaxSplits, std::max(1, (pages + kDecWarps - 1) / kDecWarps));
  const int min_splits = std::min(max_splits, std::max(1, (2 * sm_count() + ctas - 1) / ctas));
  SplitPlan best;
  long long best_cost = -1;
  for (int s = min_splits; s <= max_splits; ++s) {
    const int per = (pages + s - 1) / s;
    const int splits = (pages + per - 1) / per;
    const long long waves = (static_cast<long long>(ctas) * splits + slots - 1) / slots;
    const long long cost = waves * per;
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best.splits = splits;
      best.pages_per_split = per;
    }
  }
  return best;
}

}  // namespace

namespace {

// Workspace: split partials (as many as the larger of the page-loop and ring kernels' plans needs), then the
// (sequence, kv head) counters at an offset that does not depend on the kernel (a workspace may serve several).
size_t counters_offset(const DecodeAttention& p) {
  const int splits = std::max(split_plan(p).splits, ring_plan(p, false).splits);
  const size_t parts = static_cast<size_t>(p.batch) * p.q_heads * splits * kPartStride * sizeof(float);
  return (parts + 255) / 256 * 256;
}

// The counters of DecodeAttention::counters, or the workspace's after the partials.
int* split_counters(const DecodeAttention& p, void* workspace) {
  return p.counters ? p.counters : reinterpret_cast<int*>(static_cast<char*>(workspace) + counters_offset(p));
}

}  // namespace

size_t decode_attention_workspace_bytes(const DecodeAttention& p) {
  return counters_offset(p) + (p.counters ? 0 : static_cast<size_t>(p.batch) * p.kv_heads * sizeof(int));
}

Status decode_attention(const DecodeAttention& p, const bf16* q, int q_stride, const bf16* k_cache,
                        const bf16* v_cache, const int32_t* block_table, const int32_t* context_lens, bf16* out,
                        void* workspace, cudaStream_t stream) {
  if (p.batch <= 0 || p.q_heads <= 0 || p.kv_heads <= 0 || p.q_heads % p.kv_heads != 0)
    return invalid_argument("decode_attention: need batch, heads > 0 and q_heads divisible by kv_heads");
  if (p.max_context <= 0 || p.max_blocks * kKvBlock < p.max_context)
    return invalid_argument("decode_attention: max_context must be positive and fit in max_blocks * 16");
  if (p.head_dim != kHeadDim)
    return paged_attention(q, q_stride, k_cache, v_cache, block_table, p.max_blocks, nullptr, context_lens, nullptr,
                           p.batch, out, p.q_heads * p.head_dim, p.q_heads, p.kv_heads, p.head_dim, p.scale, stream);
  if (!workspace) return invalid_argument("decode_attention: workspace is null");
  const SplitPlan sp = split_plan(p);
  float* part = static_cast<float*>(workspace);
  int* counters = split_counters(p, workspace);
  const dim3 grid(sp.splits, p.kv_heads, p.batch), block(kDecWarps * 32);
  const int G = p.q_heads / p.kv_heads;
  const bool q_aligned = q_stride % 8 == 0 && reinterpret_cast<uintptr_t>(q) % 16 == 0;
  if (G == 8 && q_aligned)  // the tensor-core page loop
    return launch("decode_attention", decode_attention_kernel<8, true>, grid, block, 0, stream, q, q_stride, k_cache,
                  v_cache, block_table, p.max_blocks, context_lens, out, part, counters, p.kv_heads, sp.splits,
                  sp.pages_per_split, p.scale);
#define ZEST_DECODE_CASE(g)                                                                                        \
  case g:                                                                                                          \
    return launch("decode_attention", decode_attention_kernel<g, false>, grid, block, 0, stream, q, q_stride,      \
                  k_cache, v_cache, block_table, p.max_blocks, context_lens, out, part, counters, p.kv_heads,      \
                  sp.splits, sp.pages_per_split, p.scale);
  switch (G) {
    ZEST_DECODE_CASE(1)
    ZEST_DECODE_CASE(2)
    ZEST_DECODE_CASE(4)
    ZEST_DECODE_CASE(8)
    ZEST_DECODE_CASE(16)
    default:
      return unsupported("decode_attention: " + std::to_string(G) + " query heads per kv head is not supported");
  }
#undef ZEST_DECODE_CASE
}

namespace {

constexpr int kClusterMaxPages = 16 * kDecWarps * 2;  // cluster merge up to 2 pages per warp (2048 tokens)
constexpr int kClusterMaxPairs = 8;                    // and up to 8 (sequence, kv head) pairs
// Above the cluster merge's sizes, the ring kernel up to kRingMaxPairs (sequence, kv head) pairs, the page-loop
// kernel with the global merge above. Measured on H200 at Qwen3-30B-A3B shapes, context 1024 (51ca14c, ce692be): in
// the decode graph the ring kernel costs 13.2-14.2 us per layer at batch 8 against 15.8 for the page-loop kernel
// (TPOT at batch 4 / 8: 5.720 / 8.430 ms against 5.793 / 8.498), but is slower at batch 32 and 64 (TPOT 16.44 / 19.05
// ms against 15.93 / 18.54; alone at batch 64 60 us against 51).
constexpr int kRingMaxPairs = 32;

// Whether 16-CTA clusters of the fused kernel (kVSlots: its form, see the kernel) can be scheduled (checked once).
template <int kVSlots = 2 * kDecWarps>
bool cluster_attention_ok() {
  return once_per_device<bool>([] {
    bool ok = false;
    const auto kernel = decode_attention_fused_kernel<true, kVSlots>;
    const void* fn = reinterpret_cast<const void*>(kernel);
    // The largest shared-memory carveout, as the ring kernel: measured 0.03-0.04 ms faster per batch-1 step (H200).
    if (cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) !=
        cudaSuccess)
      cudaGetLastError();
    if (cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess &&
        max_active_clusters(kernel, 16, 16, dim3(kDecWarps * 32), 0) > 0)
      ok = true;
    cudaGetLastError();
    return ok;
  });
}

// The ring kernel serves groups of 4 kv heads and copies cache rows with 16-byte aligned bulk copies.
bool ring_ok(const DecodeAttention& p, const bf16* k_cache, const bf16* v_cache) {
  return p.kv_heads % kRingHeads == 0 && reinterpret_cast<uintptr_t>(k_cache) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(v_cache) % 16 == 0;
}

// The dynamic shared memory size, and the largest shared-memory carveout (two CTAs of the three-stage ring per SM
// need 222 KB of the 228).
template <bool kCluster>
bool ring_smem_set() {
  return once_per_device<bool>([] {
    const void* fn = reinterpret_cast<const void*>(decode_attention_ring_kernel<kCluster>);
    const bool size_ok = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(ring_smem(kRingStages))) == cudaSuccess;
    if (cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) !=
        cudaSuccess)
      cudaGetLastError();
    return size_ok;
  });
}

// Whether clusters of `size` CTAs of the ring kernel can be scheduled (checked once per size).
bool ring_cluster_ok(int size) {
  static int oks[64][17] = {};  // per device, per size
  static std::mutex mu;
  if (size < 1 || size > 16) return false;
  const int dev = current_device();
  if (dev < 0 || dev >= 64) return false;
  std::lock_guard<std::mutex> lock(mu);
  int* ok = oks[dev];
  if (ok[size] == 0) {
    ok[size] = 2;
    const void* fn = reinterpret_cast<const void*>(decode_attention_ring_kernel<true>);
    if (ring_smem_set<true>() &&
        cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess &&
        max_active_clusters(decode_attention_ring_kernel<true>, size, size, dim3(kRingThreads),
                            ring_smem(kRingStages)) > 0)
      ok[size] = 1;
    cudaGetLastError();
  }
  return ok[size] == 1;
}

// The ring kernel: the cluster merge when clusters of the plan's splits can be scheduled, else the global merge (its
// plan: the workspace is sized for it).
Status launch_ring(const DecodeAttention& p, const bf16* qkv, int q_stride, bf16* k_cache, bf16* v_cache,
                   const int32_t* block_table, const int32_t* context_lens, bf16* out, float* part, int* counters,
                   const DecodeFuse& f, cudaStream_t stream) {
  const dim3 block(kRingThreads);
  const int groups = p.kv_heads / kRingHeads;
  const size_t smem = ring_smem(kRingStages);
  {
    const RingPlan rp = ring_plan(p, true);
    if (ring_cluster_ok(rp.splits))
      return launch_cluster("decode_attention_fused (ring, cluster)", decode_attention_ring_kernel<true>,
                            dim3(rp.splits, groups, p.batch), block, smem, stream, rp.splits, qkv, q_stride, k_cache,
                            v_cache, block_table, p.max_blocks, context_lens, out, part, counters, p.kv_heads,
                            rp.splits, rp.pages_per_split, p.scale, f);
  }
  if (!ring_smem_set<false>()) return internal_error("decode_attention_fused: ring kernel shared memory attribute");
  const RingPlan rp = ring_plan(p, false);
  return launch("decode_attention_fused (ring)", decode_attention_ring_kernel<false>, dim3(rp.splits, groups, p.batch),
                block, smem, stream, qkv, q_stride, k_cache, v_cache, block_table, p.max_blocks, context_lens, out,
                part, counters, p.kv_heads, rp.splits, rp.pages_per_split, p.scale, f);
}

}  // namespace

bool decode_attention_fused_ok(const DecodeAttention& p, const bf16* qkv, int q_stride) {
  return p.head_dim == kHeadDim && p.kv_heads > 0 && p.q_heads == 8 * p.kv_heads && p.batch > 0 &&
         p.max_context > 0 && p.max_blocks * kKvBlock >= p.max_context && q_stride % 8 == 0 &&
         q_stride >= (p.q_heads + 2 * p.kv_heads) * kHeadDim && reinterpret_cast<uintptr_t>(qkv) % 16 == 0;
}

Status decode_attention_fused(const DecodeAttention& p, const bf16* qkv, int q_stride, const bf16* q_norm,
                              const bf16* k_norm, const int32_t* pos, int pos_stride, RopeParams rope,
                              const int32_t* slot_mapping, bf16* k_cache, bf16* v_cache, const int32_t* block_table,
                              const int32_t* context_lens, bf16* out, void* workspace, float eps, cudaStream_t stream) {
  if (!decode_attention_fused_ok(p, qkv, q_stride))
    return invalid_argument("decode_attention_fused: needs head_dim 128, 8 query heads per kv head, q rows of q, k and "
                            "v heads at a 16-byte aligned stride, and max_context within max_blocks * 16");
  if (!workspace || !q_norm || !k_norm || !pos || !k_cache || !v_cache)
    return invalid_argument("decode_attention_fused: null pointer");
  if (pos_stride < 0) return invalid_argument("decode_attention_fused: pos_stride must be >= 0");
  const SplitPlan sp = split_plan(p);
  float* part = static_cast<float*>(workspace);
  int* counters = split_counters(p, workspace);
  DecodeFuse f{q_norm, k_norm, pos, pos_stride, rope, slot_mapping, eps};
  // By size: the cluster merge up to kClusterMaxPairs (sequence, kv head) pairs and kClusterMaxPages pages (measured at
  // batch 1: 13 splits of 5 pages; at batch 8 and 64 the many CTAs of the forced 13+ splits cost more than the global
  // merge saves), the ring kernel above up to kRingMaxPairs pairs, else the global merge.
  const int pages = (p.max_context + kKvBlock - 1) / kKvBlock;
  const int pairs = p.batch * p.kv_heads;
  const bool small = pages <= kClusterMaxPages && pairs <= kClusterMaxPairs;
  if (!small && pairs <= kRingMaxPairs && ring_ok(p, k_cache, v_cache))
    return launch_ring(p, qkv, q_stride, k_cache, v_cache, block_table, context_lens, out, part, counters, f, stream);
  if (small && cluster_attention_ok()) {
    // At most 16 splits (one cluster per kv head and sequence), at least one page per warp; the compact form where a
    // split has at most 5 pages.
    const int per = std::max(kDecWarps, (pages + 15) / 16);
    const int splits = (pages + per - 1) / per;
    // The largest carveout, so that an SM with two of these CTAs (2 x ~36 KB) still takes an o GEMM CTA (~132 KB)
    // before they leave (measured at batch 1: TPOT -0.025 ms against the driver's default).
    const auto kernel = per <= kDecWarps + 1 && cluster_attention_ok<kDecWarps + 1>()
                            ? decode_attention_fused_kernel<true, kDecWarps + 1>
                            : decode_attention_fused_kernel<true>;
    ZEST_RETURN_IF_ERROR(set_max_carveout(reinterpret_cast<const void*>(kernel)));
    return launch_cluster("decode_attention_fused (cluster)", kernel,
                          dim3(splits, p.kv_heads, p.batch), dim3(kDecWarps * 32), 0, stream, splits, qkv, q_stride,
                          k_cache, v_cache, block_table, p.max_blocks, context_lens, out, part, counters, p.kv_heads,
                          splits, per, p.scale, f);
  }
  return launch("decode_attention_fused", decode_attention_fused_kernel<false>, dim3(sp.splits, p.kv_heads, p.batch),
                dim3(kDecWarps * 32), 0, stream, qkv, q_stride, k_cache, v_cache, block_table, p.max_blocks,
                context_lens, out, part, counters, p.kv_heads, sp.splits, sp.pages_per_split, p.scale, f);
}

}  // namespace zest::cuda
