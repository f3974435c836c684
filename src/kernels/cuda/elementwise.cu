// Row-wise and element-wise kernels: embedding gather, RMSNorm variants (with fused residual add and MoE
// combine), SwiGLU activation, greedy argmax and a device-side random fill.
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"

namespace zest::cuda {

namespace {

constexpr int kRowThreads = 256;

__global__ void embedding_kernel(const int32_t* __restrict__ ids, const bf16* __restrict__ table,
                                 bf16* __restrict__ out, int hidden, int vocab) {
  pdl_wait();
  const int t = blockIdx.x;
  const int id = ids[t];
  uint4* dst = reinterpret_cast<uint4*>(out + static_cast<size_t>(t) * hidden);
  const int n = hidden / 8;
  if (id < 0 || id >= vocab) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = make_uint4(0, 0, 0, 0);
    return;
  }
  const uint4* src = reinterpret_cast<const uint4*>(table + static_cast<size_t>(id) * hidden);
  for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}

// Stores 8 values of y = w * bf16(v * inv) for one 8-element chunk.
__device__ __forceinline__ void norm_store8(const float* v, float inv, const bf16* w, bf16* y) {
  *reinterpret_cast<uint4*>(y) = rms_scale8(v, inv, *reinterpret_cast<const uint4*>(w));
}

__device__ __forceinline__ void load8(const bf16* p, float* v) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const bf16* b = reinterpret_cast<const bf16*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = __bfloat162float(b[i]);
}

__device__ __forceinline__ void store8(bf16* p, const float* v) {
  uint4 u;
  bf16* b = reinterpret_cast<bf16*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) b[i] = __float2bfloat16(v[i]);
  *reinterpret_cast<uint4*>(p) = u;
}

// Mode 0: y = norm(x). Mode 1: x = bf16(x + r), y = norm(x) when w != nullptr. Mode 2: x = bf16(x + bf16(sum_k
// slot_out)), y = norm(x) when w != nullptr; slot outputs fp32 or bf16 (Slot).
template <int kMode, class Slot = float>
__global__ void __launch_bounds__(kRowThreads) norm_kernel(bf16* __restrict__ x, const bf16* __restrict__ r,
                                                           const Slot* __restrict__ slot_out,
                                                           const int32_t* __restrict__ ids, int K,
                                                           const bf16* __restrict__ w, bf16* __restrict__ y,
                                                           int hidden, float eps) {
  __shared__ float red[32];
  step_timeline_phase(0);
  const int row = blockIdx.x;
  bf16* xr = x + static_cast<size_t>(row) * hidden;
  if (hidden <= kRowThreads * 8) {
    // One 8-element chunk per thread, kept in registers: the norm weight is loaded before the wait (a weight, not
    // written by the previous kernel), then every load of the row (x, r, the ids and all K slot rows, unconditionally:
    // empty slots are skipped at the sum) is issued at once. Same arithmetic and order as the loop below.
    const int c = threadIdx.x * 8;
    const bool own = c < hidden;
    uint4 wv = make_uint4(0, 0, 0, 0);
    if (own && w) wv = *reinterpret_cast<const uint4*>(w + c);
    pdl_wait();
    if constexpr (kMode == 2) {  // the combine's row (common.cuh; also run by the one-token experts' last CTA)
      combine_norm_row(xr, slot_out + static_cast<size_t>(row) * K * hidden, ids + row * K, K, wv,
                       w ? y + static_cast<size_t>(row) * hidden : nullptr, hidden, eps, red);
      step_timeline_phase(2);
      return;
    }
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (own) {
      load8(xr + c, v);
      if constexpr (kMode == 1) {
        float rv[8];
        load8(r + static_cast<size_t>(row) * hidden + c, rv);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = bf16_round(v[i] + rv[i]);
      }
      if constexpr (kMode != 0) store8(xr + c, v);
    }
    if (kMode == 1 && w == nullptr) {  // the residual only
      step_timeline_phase(2);
      return;
    }
    const float ss = sumsq8(v);
    const float tot = block_sum(ss, red);
    const float inv = rsqrtf(tot / hidden + eps);
    if (own) norm_store8(v, inv, reinterpret_cast<const bf16*>(&wv), y + static_cast<size_t>(row) * hidden + c);
    step_timeline_phase(2);
    return;
  }
  pdl_wait();
  float ss = 0.f;
  for (int c = threadIdx.x * 8; c < hidden; c += blockDim.x * 8) {
    float v[8];
    load8(xr + c, v);
    if constexpr (kMode == 1) {
      float rv[8];
      load8(r + static_cast<size_t>(row) * hidden + c, rv);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = bf16_round(v[i] + rv[i]);
      store8(xr + c, v);
    } else if constexpr (kMode == 2) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int k = 0; k < K; ++k) {
        if (ids[row * K + k] < 0) continue;
        float a[8];
        ldcg_slot8(slot_out + (static_cast<size_t>(row) * K + k) * hidden + c, a);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += a[i];
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = bf16_round(v[i] + bf16_round(acc[i]));
      store8(xr + c, v);
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
  }
  if (kMode != 0 && w == nullptr) return;  // the residual only
  const float tot = block_sum(ss, red);
  const float inv = rsqrtf(tot / hidden + eps);
  bf16* yr = y + static_cast<size_t>(row) * hidden;
  for (int c = threadIdx.x * 8; c < hidden; c += blockDim.x * 8) {
    float v[8];
    load8(xr + c, v);
    norm_store8(v, inv, w + c, yr + c);
  }
}

__global__ void silu_mul_kernel(const bf16* __restrict__ gu, bf16* __restrict__ h, int rows, int I) {
  pdl_wait();
  const size_t total = static_cast<size_t>(rows) * I;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t r = i / I, c = i % I;
    const float g = __bfloat162float(gu[r * 2 * I + c]);
    const float u = __bfloat162float(gu[r * 2 * I + I + c]);
    const float s = bf16_round(g / (1.f + __expf(-g)));
    h[i] = __float2bfloat16(s * u);
  }
}

// Greedy argmax of a row split over a cluster of kArgmaxSplit CTAs (one cluster per row): each CTA scans its share of
// the row with all of a thread's 16-byte loads of a round in flight (one round at the Qwen3 vocabulary: 18992
// elements per CTA, 512 threads), reduces to (max, lowest index) and stores it into rank 0's shared memory; after one
// cluster barrier rank 0 reduces the kArgmaxSplit partials. Ties go to the lowest index and NaN never wins, as a
// scan in index order with a strict > would. kVec: 8 elements per load (vocab % 8 == 0, 16-byte aligned rows).
constexpr int kArgmaxSplit = 8, kArgmaxThreads = 512, kArgmaxUnroll = 5;

__device__ __forceinline__ void argmax_fold(float& best, int& bi, float v, int i) {
  if (v > best || (v == best && i < bi)) {
    best = v;
    bi = i;
  }
}

template <bool kVec>
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const bf16* __restrict__ logits,
                                                                int32_t* __restrict__ out, int vocab) {
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int si[kArgmaxThreads / 32];
  __shared__ float cv[kArgmaxSplit];
  __shared__ int ci[kArgmaxSplit];
  const int rank = static_cast<int>(cluster_rank()), row_id = blockIdx.x / kArgmaxSplit;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const bf16* row = logits + static_cast<size_t>(row_id) * vocab;
  const int units = kVec ? vocab / 8 : vocab, per = (units + kArgmaxSplit - 1) / kArgmaxSplit;
  const int beg = rank * per, end = min(units, beg + per);
  pdl_wait();
  cluster_arrive_relaxed();  // rank 0 runs before anyone stores into its shared memory: the wait follows the loads
  float best = -INFINITY;
  int bi = 0x7fffffff;
  for (int u0 = beg + tid; u0 < end; u0 += kArgmaxThreads * kArgmaxUnroll) {
    if constexpr (kVec) {
      uint4 v[kArgmaxUnroll];
#pragma unroll
      for (int k = 0; k < kArgmaxUnroll; ++k) {
        const int u = u0 + k * kArgmaxThreads;
        v[k] = u < end ? __ldg(reinterpret_cast<const uint4*>(row) + u) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int k = 0; k < kArgmaxUnroll; ++k) {
        const int u = u0 + k * kArgmaxThreads;
        if (u >= end) break;
        float f[8];
        unpack8(v[k], f);
#pragma unroll
        for (int j = 0; j < 8; ++j) argmax_fold(best, bi, f[j], u * 8 + j);
      }
    } else {
      float v[kArgmaxUnroll];
#pragma unroll
      for (int k = 0; k < kArgmaxUnroll; ++k) {
        const int u = u0 + k * kArgmaxThreads;
        v[k] = u < end ? __bfloat162float(row[u]) : 0.f;
      }
#pragma unroll
      for (int k = 0; k < kArgmaxUnroll; ++k)
        if (u0 + k * kArgmaxThreads < end) argmax_fold(best, bi, v[k], u0 + k * kArgmaxThreads);
    }
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
    argmax_fold(best, bi, ov, oi);
  }
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = bi;
  }
  __syncthreads();
  if (warp == 0) {
    best = lane < kArgmaxThreads / 32 ? sv[lane] : -INFINITY;
    bi = lane < kArgmaxThreads / 32 ? si[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      argmax_fold(best, bi, ov, oi);
    }
  }
  cluster_wait();
  if (warp == 0) {
    if (lane == 0) {
      st_cluster_f32(cluster_map(&cv[rank], 0), best);
      st_cluster_s32(cluster_map(&ci[rank], 0), bi);
    }
  }
  cluster_arrive();
  cluster_wait();
  if (rank == 0 && warp == 0) {
    best = lane < kArgmaxSplit ? cv[lane] : -INFINITY;
    bi = lane < kArgmaxSplit ? ci[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      argmax_fold(best, bi, ov, oi);
    }
    if (lane == 0) out[row_id] = bi == 0x7fffffff ? 0 : bi;
  }
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_random_kernel(bf16* __restrict__ p, size_t n, uint64_t seed, float lo, float scale) {
  pdl_wait();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = splitmix64(seed * 0x100000001b3ull ^ i);
    const float u = static_cast<float>(h >> 40) * (1.f / 16777216.f);
    p[i] = __float2bfloat16(lo + u * scale);
  }
}

Status check_rows(const char* op, int rows, int hidden) {
  if (rows <= 0 || hidden <= 0 || hidden % 8 != 0)
    return invalid_argument(std::string(op) + ": rows must be positive and hidden a positive multiple of 8 (rows=" +
                            std::to_string(rows) + ", hidden=" + std::to_string(hidden) + ")");
  return Status::ok();
}

}  // namespace

Status embedding(const int32_t* ids, const bf16* table, bf16* out, int n, int hidden, int vocab, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_rows("embedding", n, hidden));
  return launch("embedding", embedding_kernel, dim3(n), dim3(256), 0, stream, ids, table, out, hidden, vocab);
}

Status rmsnorm(const bf16* x, const bf16* w, bf16* y, int rows, int hidden, float eps, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_rows("rmsnorm", rows, hidden));
  return launch("rmsnorm", norm_kernel<0>, dim3(rows), dim3(kRowThreads), 0, stream, const_cast<bf16*>(x),
                nullptr, nullptr, nullptr, 0, w, y, hidden, eps);
}

Status add_rmsnorm(bf16* x, const bf16* r, const bf16* w, bf16* y, int rows, int hidden, float eps,
                   cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_rows("add_rmsnorm", rows, hidden));
  return launch("add_rmsnorm", norm_kernel<1>, dim3(rows), dim3(kRowThreads), 0, stream, x, r, nullptr, nullptr, 0, w,
                y, hidden, eps);
}

Status moe_combine_add_rmsnorm(bf16* x, const float* slot_out, const int32_t* ids, int K, const bf16* w, bf16* y,
                               int rows, int hidden, float eps, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_rows("moe_combine_add_rmsnorm", rows, hidden));
  if (K <= 0) return invalid_argument("moe_combine_add_rmsnorm: K must be positive");
  return launch("moe_combine_add_rmsnorm", norm_kernel<2>, dim3(rows), dim3(kRowThreads), 0, stream, x, nullptr,
                slot_out, ids, K, w, y, hidden, eps);
}

Status moe_combine_add_rmsnorm(bf16* x, const bf16* slot_out, const int32_t* ids, int K, const bf16* w, bf16* y,
                               int rows, int hidden, float eps, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_rows("moe_combine_add_rmsnorm", rows, hidden));
  if (K <= 0) return invalid_argument("moe_combine_add_rmsnorm: K must be positive");
  return launch("moe_combine_add_rmsnorm", norm_kernel<2, bf16>, dim3(rows), dim3(kRowThreads), 0, stream, x, nullptr,
                slot_out, ids, K, w, y, hidden, eps);
}

Status silu_mul(const bf16* gu, bf16* h, int rows, int I, cudaStream_t stream) {
  if (rows <= 0 || I <= 0) return invalid_argument("silu_mul: rows and I must be positive");
  const size_t total = static_cast<size_t>(rows) * I;
  const int blocks = static_cast<int>(std::min<size_t>((total + 255) / 256, 65535));
  return launch("silu_mul", silu_mul_kernel, dim3(blocks), dim3(256), 0, stream, gu, h, rows, I);
}

Status argmax_rows(const bf16* logits, int32_t* out, int rows, int vocab, cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0) return invalid_argument("argmax_rows: rows and vocab must be positive");
  const bool vec = vocab % 8 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  return launch_cluster("argmax", vec ? argmax_kernel<true> : argmax_kernel<false>, dim3(rows * kArgmaxSplit),
                        dim3(kArgmaxThreads), 0, stream, kArgmaxSplit, logits, out, vocab);
}

Status fill_random_bf16(bf16* p, size_t n, uint64_t seed, float lo, float hi, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  const int blocks = static_cast<int>(std::min<size_t>((n + 255) / 256, 132 * 64));
  return launch("fill_random", fill_random_kernel, dim3(blocks), dim3(256), 0, stream, p, n, seed, lo, hi - lo);
}

}  // namespace zest::cuda
