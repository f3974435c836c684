// Weight-streaming products for few tokens on tensor cores: out[token, row] = sum_k W[row, k] * src[token, k]
// with bf16 mma.m16n8k16 (fp32 accumulation). A warp owns 16 weight rows and one slice of k; the weights go
// from HBM straight into A fragments (16-byte loads, used once) and the tokens are the B fragments. Since a
// dot product may sum k in any order, each thread loads 8 consecutive k of a row and both A and B fragments
// use the same permutation of k. A CTA's warps split k and are reduced in shared memory in fixed order.
// Modes: dense small-M GEMM, MoE gate/up (SiLU * up epilogue) and MoE down (routing-weight epilogue).
#include <algorithm>
#include <map>
#include <mutex>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_route.cuh"

namespace zest::cuda {

namespace {

constexpr int kWarps = 8;
constexpr int kRows = 16;     // weight rows per item
constexpr int kChunk = 32;    // k per warp step (two mma k16 steps)
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
  int prefetch;           // dense: pull the CTA's first weight tile into L2 before waiting on the previous kernel
  int prefetch_next;      // pull the weight rows of the CTA's next item into L2 while the current one runs
  // Dense split-K (ksplit > 1): item = (row tile, k slice); slices write fp32 partials [ksplit][M][N] and the last
  // CTA of a row tile (counters[tile], left at zero) sums them in slice order.
  int ksplit;
  float* partial;
  int* counters;
  // Dense epilogue run by the CTA that completes the last row tile (counter `done`, left at zero), one warp per
  // token row: 1 = residual add + RMSNorm (x_res, norm_w, xn, eps); 2 = router softmax + top-k (bias, ids,
  // route_w, top_k; N <= 256 experts).
  int epilogue;
  int* done;
  bf16* x_res;
  const bf16* norm_w;
  bf16* xn;
  float eps;
  const float* bias;
  int32_t* ids;
  float* route_w_out;
  int top_k;
  // Router epilogue, continued: SERE re-routing when sere_sim != nullptr (E <= 128), then the MoE plan into `plan`
  // when route_plan (count added to *count_sum when not null).
  const float* sere_sim;
  int sere_s;
  float sere_rho;
  int route_plan;
  int64_t* count_sum;
  // Epilogue 3 (qk_norm_rope_kv per head; counters head_done[head], left at zero).
  int* head_done;
  const bf16* q_norm;
  const bf16* k_norm;
  const int32_t* pos;
  int pos_stride;
  RopeParams rope;
  const int32_t* slot_mapping;
  bf16* k_cache;
  bf16* v_cache;
  int q_heads, kv_heads, head_dim;
};

__device__ __forceinline__ void mma16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

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

// kU: 32-wide chunks in flight per warp and weight matrix; kMinBlocks: CTAs per SM the registers must allow;
// kEpilogue (dense): the fused row epilogues are compiled in (they cost registers).
template <int kMode, int kU, int kMinBlocks, bool kEpilogue = false>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) rows_mma_kernel(RowsParams p) {
  if constexpr (kMode == kDense) {
    // Weights are never written by the previous kernel: start pulling this CTA's first tile now.
    if (p.prefetch && threadIdx.x == 0 && static_cast<int>(blockIdx.x) < p.N / kRows)
      prefetch_l2_bulk(p.w + static_cast<size_t>(blockIdx.x) * kRows * p.Kdim,
                       static_cast<uint32_t>(kRows * p.Kdim * sizeof(bf16)));
  }
  pdl_wait();
  constexpr int kMats = kMode == kGateUp ? 2 : 1;  // weight matrices per item (gate and up)
  constexpr int kVals = kMats * 2 * 4;             // accumulators per thread: mats x n-tiles x 4
  __shared__ float red[kWarps][kVals][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tq = lane & 3;
  __shared__ int last_s;
  const int tiles_per_group = p.N / kRows;
  const int ksplit = kMode == kDense ? p.ksplit : 1;
  const int groups = kMode == kDense ? ksplit : *p.plan.num_active;
  const int items = groups * tiles_per_group;
  const int chunks_all = p.Kdim / kChunk;
  const int chunks_per_split = (chunks_all + ksplit - 1) / ksplit;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int j = item / tiles_per_group, r0 = (item % tiles_per_group) * kRows;
    // Dense: j is the k slice [c_lo, c_hi) of chunks; MoE: one slice, j is the active expert.
    const int c_lo = kMode == kDense ? j * chunks_per_split : 0;
    const int c_hi = kMode == kDense ? min(chunks_all, c_lo + chunks_per_split) : chunks_all;
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
    if (p.prefetch_next && threadIdx.x == 0 && (kMode != kDense || ksplit == 1)) {
      // Keep HBM busy through this item's reductions: the next item's rows (16 x Kdim, contiguous per matrix)
      // go to L2 now; an MoE CTA's first item is fetched the same way (its expert was unknown before the wait).
      const uint32_t bytes = static_cast<uint32_t>(kRows * p.Kdim * sizeof(bf16));
      auto rows_of = [&](int it) -> const bf16* {
        const int jj = it / tiles_per_group, rr = (it % tiles_per_group) * kRows;
        if constexpr (kMode == kDense) return p.w + static_cast<size_t>(rr) * p.Kdim;
        const int ee = p.plan.active_experts[jj];
        return kMode == kGateUp ? p.w + (static_cast<size_t>(ee) * 2 * p.N + rr) * p.Kdim
                                : p.w + (static_cast<size_t>(ee) * p.N + rr) * p.Kdim;
      };
      if (kMode != kDense && item == static_cast<int>(blockIdx.x)) {
        prefetch_l2_bulk(w0, bytes);
        if (kMode == kGateUp) prefetch_l2_bulk(w1, bytes);
      }
      const int next = item + gridDim.x;
      if (next < items) {
        const bf16* n0 = rows_of(next);
        prefetch_l2_bulk(n0, bytes);
        if (kMode == kGateUp) prefetch_l2_bulk(n0 + static_cast<size_t>(p.N) * p.Kdim, bytes);
      }
    }
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
      for (int cb = c_lo + warp; cb < c_hi; cb += kWarps * kU) {
        uint4 lo[kU][kMats], hi[kU][kMats], xa[kU], xb[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int c = cb + u * kWarps;
          const size_t k = static_cast<size_t>(c) * kChunk;
          const bool ok = c < c_hi;
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
      if (kMode == kDense && ksplit > 1) {
        // Publish this slice's partial sums; the last slice of the row tile adds all slices in fixed order.
        const int tile = item % tiles_per_group;
        if (warp == 0) {
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int t = n * 8 + tq * 2 + (i & 1);
              const size_t at = (static_cast<size_t>(j) * p.M + c0 + t) * p.N + r0 + g + (i >> 1) * 8;
              if (t < nt) p.partial[at] = red[0][n * 4 + i][lane];
            }
          __threadfence();
        }
        __syncthreads();
        if (threadIdx.x == 0) {
          const int prev = atomicAdd(p.counters + tile, 1);
          last_s = prev == ksplit - 1;
          if (last_s) p.counters[tile] = 0;
        }
        __syncthreads();
        if (last_s && warp == 0) {
          __threadfence();
#pragma unroll
          for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int t = n * 8 + tq * 2 + (i & 1);
              float v = 0.f;
              if (t < nt)
                for (int sl = 0; sl < ksplit; ++sl)
                  v += __ldcg(p.partial + (static_cast<size_t>(sl) * p.M + c0 + t) * p.N + r0 + g + (i >> 1) * 8);
              red[0][n * 4 + i][lane] = v;
            }
        }
        if (!last_s) {
          __syncthreads();
          continue;
        }
      }
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
      if constexpr (kMode == kDense && kEpilogue) {
        if (p.epilogue == 3) {
          // The CTA that writes a head's last row tile normalises and rotates that head for all tokens.
          const int head = r0 / p.head_dim;
          if (warp == 0) __threadfence();
          __syncthreads();
          if (threadIdx.x == 0) {
            const int prev = atomicAdd(p.head_done + head, 1);
            last_s = prev == p.head_dim / kRows - 1;
            if (last_s) p.head_done[head] = 0;
          }
          __syncthreads();
          if (last_s) {
            __threadfence();
            for (int t = warp; t < p.M; t += kWarps) {
              float p_axis[3];
              p_axis[0] = static_cast<float>(p.pos[t]);
              p_axis[1] = static_cast<float>(p.pos[p.pos_stride + t]);
              p_axis[2] = static_cast<float>(p.pos[2 * p.pos_stride + t]);
              const int slot = p.slot_mapping ? p.slot_mapping[t] : -1;
              warp_qk_norm_rope_head<true>(p.out + static_cast<size_t>(t) * p.N, head, p.q_norm, p.k_norm, p_axis,
                                           p.rope, slot, p.k_cache, p.v_cache, p.q_heads, p.kv_heads, p.head_dim,
                                           p.eps, lane);
            }
          }
        } else if (p.epilogue) {
          // The CTA that writes the last row tile runs the row epilogue over all M rows.
          __shared__ RouteSmem route_sm;
          if (warp == 0) __threadfence();
          __syncthreads();
          if (threadIdx.x == 0) {
            const int prev = atomicAdd(p.done, 1);
            last_s = prev == tiles_per_group - 1;
            if (last_s) *p.done = 0;
          }
          __syncthreads();
          if (last_s) {
            __threadfence();
            for (int m = warp; m < p.M; m += kWarps) {
              const size_t row = static_cast<size_t>(m) * p.N;
              if (p.epilogue == 1)
                warp_add_rmsnorm_row(p.x_res + row, p.out + row, p.norm_w, p.xn + row, p.N, p.eps, lane);
              else
                warp_router_topk(p.out + row, p.bias, &red[warp][0][0], p.N, p.top_k,
                                 p.ids + static_cast<size_t>(m) * p.top_k,
                                 p.route_w_out + static_cast<size_t>(m) * p.top_k, lane);
            }
            if (p.epilogue == 2 && p.sere_sim) {
              __syncthreads();
              cta_sere_small(p.ids, p.route_w_out, p.sere_sim, p.M, p.N, p.top_k, p.sere_s, p.sere_rho, route_sm);
            }
            if (p.epilogue == 2 && p.route_plan) {
              __syncthreads();
              cta_moe_plan(p.ids, p.M * p.top_k, p.N, p.plan, p.count_sum, route_sm);
            }
          }
        }
      }
      __syncthreads();
    }
  }
}

template <int kMode, int kU, int kMinBlocks, bool kEpilogue = false>
Status launch_rows(const RowsParams& p, int max_items, cudaStream_t stream) {
  int per_sm = 0;
  ZEST_RETURN_IF_ERROR(cuda_status(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                       &per_sm, rows_mma_kernel<kMode, kU, kMinBlocks, kEpilogue>, kWarps * 32, 0),
                                   "occupancy"));
  const int grid = std::max(1, std::min(max_items, std::max(1, per_sm) * sm_count()));
  return launch("rows_mma", rows_mma_kernel<kMode, kU, kMinBlocks, kEpilogue>, dim3(grid), dim3(kWarps * 32), 0,
                stream, p);
}

// Split-K scratch of the dense path, one per stream (kernels on different streams may run concurrently).
struct SplitScratch {
  float* partial = nullptr;
  int* counters = nullptr;
};
constexpr size_t kSplitPartialFloats = 1u << 20;  // 4 MiB: ksplit * M * N fp32
constexpr int kSplitCounters = 1 << 14;           // row tiles (then one for the epilogue, then per-head ones)
constexpr int kHeadCounters = 1024;

Status split_scratch(cudaStream_t stream, SplitScratch* out) {
  static std::mutex mu;
  static std::map<cudaStream_t, SplitScratch> all;
  std::lock_guard<std::mutex> lock(mu);
  SplitScratch& s = all[stream];
  if (!s.partial) {
    ZEST_RETURN_IF_ERROR(cuda_status(cudaMalloc(&s.partial, kSplitPartialFloats * sizeof(float)), "split-K scratch"));
    const size_t n = kSplitCounters + 1 + kHeadCounters;
    ZEST_RETURN_IF_ERROR(cuda_status(cudaMalloc(&s.counters, n * sizeof(int)), "split-K counters"));
    ZEST_RETURN_IF_ERROR(cuda_status(cudaMemset(s.counters, 0, n * sizeof(int)), "split-K counters"));
  }
  *out = s;
  return Status::ok();
}

// Slices of K for a dense product (option kGemmSplitK: 1 = about four items per SM, n > 1 = n), at least two chunks
// per warp per slice.
int dense_ksplit(int M, int N, int K) {
  const int mode = decode_option(DecodeOption::kGemmSplitK);
  if (mode <= 0) return 1;
  const int tiles = N / kRows, chunks = K / kChunk;
  int ks = mode > 1 ? mode : (4 * sm_count() + tiles - 1) / tiles;
  ks = std::min({ks, 16, std::max(1, chunks / (2 * kWarps))});
  if (ks <= 1 || tiles > kSplitCounters || static_cast<size_t>(ks) * M * N > kSplitPartialFloats) return 1;
  return ks;
}

}  // namespace

bool rows_mma_gemm_ok(int M, int N, int K) { return M >= 1 && M <= kTokens && N % kRows == 0 && K % kChunk == 0; }

Status rows_mma_gemm(const bf16* x, const bf16* w, bf16* y, int M, int N, int K, cudaStream_t stream,
                     const RowsEpilogue* epi) {
  RowsParams p{};
  if (epi) {
    SplitScratch scratch;
    ZEST_RETURN_IF_ERROR(split_scratch(stream, &scratch));
    p.epilogue = epi->kind;
    p.done = scratch.counters + kSplitCounters;
    p.x_res = epi->x_res;
    p.norm_w = epi->norm_w;
    p.xn = epi->xn;
    p.eps = epi->eps;
    p.bias = epi->bias;
    p.ids = epi->ids;
    p.route_w_out = epi->route_w;
    p.top_k = epi->top_k;
    p.sere_sim = epi->sere_sim;
    p.sere_s = epi->sere_s;
    p.sere_rho = epi->sere_rho;
    p.route_plan = epi->plan != nullptr;
    if (epi->plan) p.plan = *epi->plan;
    p.count_sum = epi->count_sum;
    p.head_done = scratch.counters + kSplitCounters + 1;
    p.q_norm = epi->q_norm;
    p.k_norm = epi->k_norm;
    p.pos = epi->pos;
    p.pos_stride = epi->pos_stride;
    p.rope = epi->rope;
    p.slot_mapping = epi->slot_mapping;
    p.k_cache = epi->k_cache;
    p.v_cache = epi->v_cache;
    p.q_heads = epi->q_heads;
    p.kv_heads = epi->kv_heads;
    p.head_dim = epi->head_dim;
    if (epi->kind == 3 && (epi->head_dim % kRows != 0 || N / epi->head_dim > kHeadCounters))
      return invalid_argument("rows_mma_gemm: the per-head epilogue needs head_dim % 16 == 0 and at most 1024 heads");
  }
  p.src = x;
  p.w = w;
  p.out = y;
  p.M = M;
  p.N = N;
  p.Kdim = K;
  p.prefetch = (decode_option(DecodeOption::kL2Prefetch) & 1) != 0;
  p.prefetch_next = (decode_option(DecodeOption::kL2Prefetch) & 16) != 0;
  p.ksplit = dense_ksplit(M, N, K);
  if (p.ksplit > 1) {
    SplitScratch scratch;
    ZEST_RETURN_IF_ERROR(split_scratch(stream, &scratch));
    p.partial = scratch.partial;
    p.counters = scratch.counters;
  }
  const int items = p.ksplit * (N / kRows);
  if (p.epilogue) return launch_rows<kDense, 8, 1, true>(p, items, stream);
  switch (decode_option(DecodeOption::kGemmVariant)) {
    case 1: return launch_rows<kDense, 4, 3>(p, items, stream);
    case 2: return launch_rows<kDense, 8, 2>(p, items, stream);
    case 3: return launch_rows<kDense, 2, 4>(p, items, stream);
    default: return launch_rows<kDense, 8, 1>(p, items, stream);
  }
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
  gu.prefetch_next = (decode_option(DecodeOption::kL2Prefetch) & 16) != 0;
  const int variant = decode_option(DecodeOption::kMoeOccupancy);
  const int gu_items = max_active * (I / kRows), dn_items = max_active * (H / kRows);
  const Status st = [&]() -> Status {
    switch (variant) {
      case 0: return launch_rows<kGateUp, 4, 1>(gu, gu_items, stream);
      case 2: return launch_rows<kGateUp, 2, 4>(gu, gu_items, stream);
      case 3: return launch_rows<kGateUp, 4, 2>(gu, gu_items, stream);
      default: return launch_rows<kGateUp, 2, 3>(gu, gu_items, stream);
    }
  }();
  ZEST_RETURN_IF_ERROR(st);
  RowsParams dn{};
  dn.src = h;
  dn.w = down;
  dn.slot_out = slot_out;
  dn.route_w = weights;
  dn.plan = plan;
  dn.N = H;
  dn.Kdim = I;
  dn.topk = K;
  dn.prefetch_next = gu.prefetch_next;
  switch (variant) {
    case 0: return launch_rows<kDown, 8, 1>(dn, dn_items, stream);
    case 2: return launch_rows<kDown, 4, 4>(dn, dn_items, stream);
    case 3: return launch_rows<kDown, 8, 2>(dn, dn_items, stream);
    default: return launch_rows<kDown, 4, 3>(dn, dn_items, stream);
  }
}

}  // namespace zest::cuda
