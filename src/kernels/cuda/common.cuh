// Helpers shared by the CUDA kernels of zest: error conversion, launches, bf16 vector math, warp reductions.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "core/status.h"
#include "kernels/cuda/kernels.h"

namespace zest::cuda {

// Converts a CUDA error into a Status naming the operation.
inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  return internal_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Launches `kernel` on `stream`, with the programmatic-dependent-launch attribute when it is enabled.
// Every kernel launched this way calls pdl_wait() before touching memory.
template <typename... KArgs, typename... Args>
Status launch(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
              Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = programmatic_launch() ? 1 : 0;
  return cuda_status(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(std::forward<Args>(args))...), name);
}

// Waits for the previous kernel in the stream (no-op without programmatic launch), then lets the next
// kernel start its prologue early.
__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16(v)); }

// Dot product of 8 bf16 pairs packed in two uint4 values, fp32.
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b) {
  const __nv_bfloat162* pa = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* pb = reinterpret_cast<const __nv_bfloat162*>(&b);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 fa = __bfloat1622float2(pa[i]);
    float2 fb = __bfloat1622float2(pb[i]);
    s = fmaf(fa.x, fb.x, s);
    s = fmaf(fa.y, fb.y, s);
  }
  return s;
}

// 16-byte streaming load of read-only data that is used once (weights).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// Asynchronous prefetch of [p, p + bytes) into L2 (p 16-byte aligned, bytes a multiple of 16; sm_90 bulk copy).
__device__ __forceinline__ void prefetch_l2_bulk(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// Spreads an L2 prefetch of a range over the threads of a grid: 64 KiB per instruction, thread `rank` of
// `ranks` issues pieces rank, rank + ranks, ... (the 16-byte-aligned interior of the range only).
__device__ __forceinline__ void prefetch_l2_range(const void* ptr, size_t bytes, int rank, int ranks) {
  if (!ptr || bytes == 0) return;
  const uintptr_t b0 = (reinterpret_cast<uintptr_t>(ptr) + 15) & ~static_cast<uintptr_t>(15);
  const uintptr_t b1 = (reinterpret_cast<uintptr_t>(ptr) + bytes) & ~static_cast<uintptr_t>(15);
  if (b1 <= b0) return;
  constexpr size_t kPiece = 64 * 1024;
  const size_t pieces = (b1 - b0 + kPiece - 1) / kPiece;
  for (size_t i = rank; i < pieces; i += ranks) {
    const uintptr_t a = b0 + i * kPiece;
    prefetch_l2_bulk(reinterpret_cast<const void*>(a), static_cast<uint32_t>(b1 - a < kPiece ? b1 - a : kPiece));
  }
}

// Host side: the L2Prefetch range when bit `bit` of DecodeOption::kL2Prefetch is on, else an empty one.
inline L2Prefetch prefetch_if(L2Prefetch p, int bit) {
  return (decode_option(DecodeOption::kL2Prefetch) & bit) ? p : L2Prefetch{};
}

// ---- row epilogues shared by standalone kernels and fused GEMM epilogues (same arithmetic, same bits) ----

constexpr int kRouterMaxTopK = 16;

// One token's router by one warp: p = softmax(fp32 logits + bias) over E (scratch p: E floats, shared memory),
// top-K by p (ties: lowest index) sorted descending, weights renormalised to sum 1 and rounded to bf16 precision.
// Logits are read with ld.cg (they may come from other CTAs of the same kernel). K <= kRouterMaxTopK.
__device__ __forceinline__ void warp_router_topk(const bf16* row, const float* bias, float* p, int E, int K,
                                                 int32_t* ids, float* weights, int lane) {
  float mx = -INFINITY;
#pragma unroll 4
  for (int e = lane; e < E; e += 32) {  // unrolled: the loads of 4 columns per lane are in flight together
    const unsigned short raw = __ldcg(reinterpret_cast<const unsigned short*>(row) + e);
    const float v = __bfloat162float(__ushort_as_bfloat16(raw)) + (bias ? bias[e] : 0.f);
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
  float sel_v[kRouterMaxTopK];
  int sel_i[kRouterMaxTopK];
  float total = 0.f;
#pragma unroll
  for (int k = 0; k < kRouterMaxTopK; ++k) {
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
    for (int k = 0; k < kRouterMaxTopK; ++k) {
      if (k >= K) break;
      ids[k] = sel_i[k];
      weights[k] = bf16_round(sel_v[k] / total);
    }
  }
}

// Residual add + RMSNorm of one row by one warp with the exact arithmetic of the 256-thread row kernel
// (elementwise.cu, norm_kernel<1>): x = bf16(x + r); y = w * bf16(x * rsqrt(mean(x^2) + eps)). The sum of squares
// is formed in that kernel's order: virtual thread t = 32 w + lane sums its 8-wide chunks c = 8 t + 2048 i, each
// warp w is reduced by the same xor tree, then the 8 warp sums. r is read with ld.cg (written by other CTAs).
// hidden % 8 == 0.
__device__ __forceinline__ void warp_add_rmsnorm_row(bf16* x, const bf16* r, const bf16* w, bf16* y, int hidden,
                                                     float eps, int lane) {
  constexpr int kVirtualWarps = 8;  // the row kernel's 256 threads
  float ssw[kVirtualWarps];
#pragma unroll
  for (int vw = 0; vw < kVirtualWarps; ++vw) {
    float ss = 0.f;
    for (int c = (vw * 32 + lane) * 8; c < hidden; c += kVirtualWarps * 32 * 8) {
      const uint4 xu = *reinterpret_cast<const uint4*>(x + c);
      const uint4 ru = __ldcg(reinterpret_cast<const uint4*>(r + c));
      const bf16* xb = reinterpret_cast<const bf16*>(&xu);
      const bf16* rb = reinterpret_cast<const bf16*>(&ru);
      uint4 ou;
      bf16* ob = reinterpret_cast<bf16*>(&ou);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float v = bf16_round(__bfloat162float(xb[i]) + __bfloat162float(rb[i]));
        ob[i] = __float2bfloat16(v);
        ss = fmaf(v, v, ss);
      }
      *reinterpret_cast<uint4*>(x + c) = ou;
    }
    ssw[vw] = warp_sum(ss);
  }
  float mine = 0.f;
#pragma unroll
  for (int vw = 0; vw < kVirtualWarps; ++vw)
    if (lane == vw) mine = ssw[vw];
  const float tot = warp_sum(mine);
  const float inv = rsqrtf(tot / hidden + eps);
  __syncwarp();
  for (int c = lane * 8; c < hidden; c += 32 * 8) {
    const uint4 xu = *reinterpret_cast<const uint4*>(x + c);
    const uint4 wu = *reinterpret_cast<const uint4*>(w + c);
    const bf16* xb = reinterpret_cast<const bf16*>(&xu);
    const bf16* wb = reinterpret_cast<const bf16*>(&wu);
    uint4 ou;
    bf16* ob = reinterpret_cast<bf16*>(&ou);
#pragma unroll
    for (int i = 0; i < 8; ++i)
      ob[i] = __float2bfloat16(bf16_round(__bfloat162float(xb[i]) * inv) * __bfloat162float(wb[i]));
    *reinterpret_cast<uint4*>(y + c) = ou;
  }
}

// One (token, head) of qk_norm_rope_kv by one warp (row: the token's qkv row; see kernels.h): a v head is copied into
// the cache; a q or k head gets per-head RMSNorm and rotate-half (M-)RoPE in place, a k head also goes into the
// cache (slot < 0: no cache write). kCg: read the row with ld.cg (written by other CTAs of the same kernel).
template <bool kCg>
__device__ __forceinline__ void warp_qk_norm_rope_head(bf16* row, int h, const bf16* q_norm, const bf16* k_norm,
                                                       const float (&p_axis)[3], const RopeParams& rope, int slot,
                                                       bf16* k_cache, bf16* v_cache, int Hq, int Hkv, int D, float eps,
                                                       int lane) {
  auto ld = [](const bf16* p) -> float {
    if constexpr (kCg) return __bfloat162float(__ushort_as_bfloat16(__ldcg(reinterpret_cast<const unsigned short*>(p))));
    return __bfloat162float(*p);
  };
  const int half = D / 2;
  bf16* x = row + static_cast<size_t>(h) * D;
  if (h >= Hq + Hkv) {  // v head: copy into the cache only
    if (slot >= 0) {
      bf16* dst = v_cache + (static_cast<size_t>(slot) * Hkv + (h - Hq - Hkv)) * D;
      for (int d = lane; d < D; d += 32) dst[d] = __float2bfloat16(ld(x + d));
    }
    return;
  }
  const bf16* w = h < Hq ? q_norm : k_norm;
  float ss = 0.f;
  for (int d = lane; d < D; d += 32) {
    const float v = ld(x + d);
    ss = fmaf(v, v, ss);
  }
  const float inv = rsqrtf(warp_sum(ss) / D + eps);
  for (int j = lane; j < half; j += 32) {
    const float a = bf16_round(bf16_round(ld(x + j) * inv) * __bfloat162float(w[j]));
    const float b = bf16_round(bf16_round(ld(x + j + half) * inv) * __bfloat162float(w[j + half]));
    int axis = 0;
    if (j % 3 == 1 && j < 3 * rope.section_h) axis = 1;
    else if (j % 3 == 2 && j < 3 * rope.section_w) axis = 2;
    const float inv_freq = 1.f / powf(rope.theta, static_cast<float>(2 * j) / static_cast<float>(D));
    const float ang = p_axis[axis] * inv_freq;
    const float c = bf16_round(cosf(ang)), s = bf16_round(sinf(ang));
    const bf16 o1 = __float2bfloat16(__fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)));  // no contraction: same bits
    const bf16 o2 = __float2bfloat16(__fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s)));  // in every caller
    x[j] = o1;
    x[j + half] = o2;
    if (h >= Hq && slot >= 0) {
      bf16* dst = k_cache + (static_cast<size_t>(slot) * Hkv + (h - Hq)) * D;
      dst[j] = o1;
      dst[j + half] = o2;
    }
  }
}

// Number of multiprocessors of the current device (cached).
int sm_count();

// Tensor-core weight-streaming paths (rows_mma.cu) for few tokens, used by gemm and moe_experts_decode.
bool rows_mma_gemm_ok(int M, int N, int K);
// Row epilogue fused into the small-M GEMM (run by its last CTA, one warp per row; see gemm_add_rmsnorm and
// gemm_router_topk in kernels.h): kind 1 = residual add + RMSNorm, 2 = router softmax + top-k (N <= 256).
struct RowsEpilogue {
  int kind = 0;
  bf16* x_res = nullptr;
  const bf16* norm_w = nullptr;
  bf16* xn = nullptr;
  float eps = 0.f;
  const float* bias = nullptr;
  int32_t* ids = nullptr;
  float* route_w = nullptr;
  int top_k = 0;
  const float* sere_sim = nullptr;  // kind 2: then SERE (E <= 128), then the plan when plan != nullptr
  int sere_s = 0;
  float sere_rho = 0.f;
  const MoePlan* plan = nullptr;
  int64_t* count_sum = nullptr;
  // kind 3: qk_norm_rope_kv per head, run by the CTA that completes the head's row tiles (head_dim % 16 == 0)
  const bf16* q_norm = nullptr;
  const bf16* k_norm = nullptr;
  const int32_t* pos = nullptr;
  int pos_stride = 0;
  RopeParams rope;
  const int32_t* slot_mapping = nullptr;
  bf16* k_cache = nullptr;
  bf16* v_cache = nullptr;
  int q_heads = 0, kv_heads = 0, head_dim = 0;
};
Status rows_mma_gemm(const bf16* x, const bf16* w, bf16* y, int M, int N, int K, cudaStream_t stream,
                     const RowsEpilogue* epi = nullptr);
bool rows_mma_moe_ok(int H, int I);
Status rows_mma_moe(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up, const bf16* down,
                    bf16* h, float* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream);

}  // namespace zest::cuda
