// Fused per-head q/k RMSNorm + (M-)RoPE + paged KV-cache write: a half-warp per (token, head) row for head_dim 128
// (16-byte operands), else one warp per (token, head).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vision_mma.cuh"

namespace zest::cuda {

namespace {

constexpr int kRopeWarps = 8;

__global__ void __launch_bounds__(kRopeWarps * 32) qk_norm_rope_kv_kernel(
    bf16* __restrict__ qkv, const bf16* __restrict__ q_norm, const bf16* __restrict__ k_norm,
    const int32_t* __restrict__ pos, int pos_stride, RopeParams rope, const int32_t* __restrict__ slot_mapping,
    bf16* __restrict__ k_cache, bf16* __restrict__ v_cache, int Hq, int Hkv, int D, float eps) {
  pdl_wait();
  const int t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = blockIdx.y * kRopeWarps + (threadIdx.x >> 5);
  const int heads = Hq + 2 * Hkv;
  bf16* row = qkv + static_cast<size_t>(t) * heads * D;
  const int slot = slot_mapping ? slot_mapping[t] : -1;
  const int half = D / 2;
  float p_axis[3];
  p_axis[0] = static_cast<float>(pos[t]);
  p_axis[1] = static_cast<float>(pos[pos_stride + t]);
  p_axis[2] = static_cast<float>(pos[2 * pos_stride + t]);
  for (int h = warp; h < heads; h += kRopeWarps * gridDim.y) {
    bf16* x = row + static_cast<size_t>(h) * D;
    if (h >= Hq + Hkv) {  // v head: copy into the cache only
      if (slot >= 0) {
        bf16* dst = v_cache + (static_cast<size_t>(slot) * Hkv + (h - Hq - Hkv)) * D;
        for (int d = lane; d < D; d += 32) dst[d] = x[d];
      }
      continue;
    }
    const bf16* w = h < Hq ? q_norm : k_norm;
    float ss = 0.f;
    for (int d = lane; d < D; d += 32) {
      const float v = __bfloat162float(x[d]);
      ss += v * v;
    }
    const float inv = rsqrtf(warp_sum(ss) / D + eps);
    for (int j = lane; j < half; j += 32) {
      const float a = bf16_round(bf16_round(__bfloat162float(x[j]) * inv) * __bfloat162float(w[j]));
      const float b = bf16_round(bf16_round(__bfloat162float(x[j + half]) * inv) * __bfloat162float(w[j + half]));
      int axis = 0;
      if (j % 3 == 1 && j < 3 * rope.section_h) axis = 1;
      else if (j % 3 == 2 && j < 3 * rope.section_w) axis = 2;
      const float inv_freq = 1.f / powf(rope.theta, static_cast<float>(2 * j) / static_cast<float>(D));
      const float ang = p_axis[axis] * inv_freq;
      const float c = bf16_round(cosf(ang)), s = bf16_round(sinf(ang));
      const bf16 o1 = __float2bfloat16(a * c - b * s);
      const bf16 o2 = __float2bfloat16(b * c + a * s);
      x[j] = o1;
      x[j + half] = o2;
      if (h >= Hq && slot >= 0) {
        bf16* dst = k_cache + (static_cast<size_t>(slot) * Hkv + (h - Hq)) * D;
        dst[j] = o1;
        dst[j + half] = o2;
      }
    }
  }
}


// Streaming form for head_dim 128: a half-warp per (token, head) row, each lane one 16-byte chunk of 8
// elements (lanes 0-7 the first half of the head, lanes 8-15 the second: the rotate-half partner of a lane is
// lane ^ 8). A CTA covers TPC tokens and a range of heads; the bf16-rounded cos/sin of its tokens are computed
// once into shared memory (64 frequencies per token) and shared by every head. Both half-warps of a warp run
// the same code for every row (v heads too, their norm discarded), so the shuffles use the full mask; rows
// past the CTA's range load nothing and store nothing. The bf16 roundings and float expressions are those of
// the per-warp kernel above (only the order of the sum of squares differs).
constexpr int kStreamThreads = 256;

template <int TPC, int UNROLL>
__global__ void __launch_bounds__(kStreamThreads, 4) qk_norm_rope_kv_stream_kernel(
    bf16* __restrict__ qkv, const bf16* __restrict__ q_norm, const bf16* __restrict__ k_norm,
    const int32_t* __restrict__ pos, int pos_stride, RopeParams rope, const int32_t* __restrict__ slot_mapping,
    bf16* __restrict__ k_cache, bf16* __restrict__ v_cache, int T, int Hq, int Hkv, int heads_per_cta, float eps) {
  constexpr int D = 128, kHalf = 64;
  __shared__ float s_cos[TPC][kHalf], s_sin[TPC][kHalf];
  __shared__ int s_slot[TPC];
  pdl_wait();
  const int heads = Hq + 2 * Hkv;
  const int t0 = blockIdx.x * TPC;
  const int h0 = blockIdx.y * heads_per_cta, h1 = min(heads, h0 + heads_per_cta);
  const int nh = h1 - h0, ntok = min(TPC, T - t0);
  const int rows = ntok * nh;
  const int l = threadIdx.x & 15, hw = threadIdx.x >> 4;  // lane in the half-warp, half-warp index
  constexpr int kHalfWarps = kStreamThreads / 16;
  // Norm weights of this lane's chunk.
  const uint4 qw4 = *reinterpret_cast<const uint4*>(q_norm + l * 8);
  const uint4 kw4 = *reinterpret_cast<const uint4*>(k_norm + l * 8);

  auto row_ptr = [&](int r) {
    const int tt = r / nh, h = h0 + (r - tt * nh);
    return qkv + (static_cast<size_t>(t0 + tt) * heads + h) * D + l * 8;
  };
  // First rows' loads go out before the cos/sin table is built.
  uint4 x[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int r = hw + u * kHalfWarps;
    x[u] = r < rows ? *reinterpret_cast<const uint4*>(row_ptr(r)) : make_uint4(0, 0, 0, 0);
  }
  for (int i = threadIdx.x; i < ntok * kHalf; i += kStreamThreads) {
    const int tt = i / kHalf, j = i % kHalf, t = t0 + tt;
    int axis = 0;
    if (j % 3 == 1 && j < 3 * rope.section_h) axis = 1;
    else if (j % 3 == 2 && j < 3 * rope.section_w) axis = 2;
    const float p = static_cast<float>(pos[axis * pos_stride + t]);
    const float inv_freq = 1.f / powf(rope.theta, static_cast<float>(2 * j) / static_cast<float>(D));
    const float ang = p * inv_freq;
    s_cos[tt][j] = bf16_round(cosf(ang));
    s_sin[tt][j] = bf16_round(sinf(ang));
  }
  if (threadIdx.x < ntok) s_slot[threadIdx.x] = slot_mapping ? slot_mapping[t0 + threadIdx.x] : -1;
  __syncthreads();

  const bool first = l < 8;
  for (int base = 0; base < rows; base += UNROLL * kHalfWarps) {
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int r = base + hw + u * kHalfWarps;
      const bool valid = r < rows;
      const int tt = valid ? r / nh : 0, h = h0 + (valid ? r - tt * nh : 0), t = t0 + tt;
      const uint4 xv = x[u];
      // Next round's load for this slot goes out before the math.
      const int rn = r + UNROLL * kHalfWarps;
      if (rn < rows) x[u] = *reinterpret_cast<const uint4*>(row_ptr(rn));
      const int slot = valid ? s_slot[tt] : -1;
      const bf16* xb = reinterpret_cast<const bf16*>(&xv);
      float f[8];
      float ss = 0.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        f[e] = __bfloat162float(xb[e]);
        ss += f[e] * f[e];
      }
#pragma unroll
      for (int o = 1; o < 16; o <<= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      const float inv = rsqrtf(ss / D + eps);
      const uint4 w4 = h < Hq ? qw4 : kw4;
      const bf16* wb = reinterpret_cast<const bf16*>(&w4);
      uint32_t nw[4];
#pragma unroll
      for (int e = 0; e < 8; e += 2)
        nw[e / 2] = vmma::pack_bf16(bf16_round(bf16_round(f[e] * inv) * __bfloat162float(wb[e])),
                               bf16_round(bf16_round(f[e + 1] * inv) * __bfloat162float(wb[e + 1])));
      uint32_t pw[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) pw[e] = __shfl_xor_sync(0xffffffffu, nw[e], 8);
      if (!valid) continue;
      if (h >= Hq + Hkv) {  // v head: copy into the cache only
        if (slot >= 0)
          *reinterpret_cast<uint4*>(v_cache + (static_cast<size_t>(slot) * Hkv + (h - Hq - Hkv)) * D + l * 8) = xv;
        continue;
      }
      const bf16* nb = reinterpret_cast<const bf16*>(nw);
      const bf16* pb = reinterpret_cast<const bf16*>(pw);
      uint4 o4;
      bf16* ob = reinterpret_cast<bf16*>(&o4);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const int j = (l & 7) * 8 + e;
        const float c = s_cos[tt][j], s = s_sin[tt][j];
        const float a = first ? __bfloat162float(nb[e]) : __bfloat162float(pb[e]);
        const float b = first ? __bfloat162float(pb[e]) : __bfloat162float(nb[e]);
        ob[e] = first ? __float2bfloat16(a * c - b * s) : __float2bfloat16(b * c + a * s);
      }
      bf16* dst = qkv + (static_cast<size_t>(t) * heads + h) * D + l * 8;
      *reinterpret_cast<uint4*>(dst) = o4;
      if (h >= Hq && slot >= 0)
        *reinterpret_cast<uint4*>(k_cache + (static_cast<size_t>(slot) * Hkv + (h - Hq)) * D + l * 8) = o4;
    }
  }
}

}  // namespace

Status qk_norm_rope_kv(bf16* qkv, const bf16* q_norm, const bf16* k_norm, const int32_t* pos, int pos_stride,
                       RopeParams rope, const int32_t* slot_mapping, bf16* k_cache, bf16* v_cache, int T, int Hq,
                       int Hkv, int D, float eps, cudaStream_t stream) {
  if (T <= 0 || Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0 || D <= 0 || D % 2 != 0)
    return invalid_argument("qk_norm_rope_kv: need T, Hq, Hkv > 0, Hq divisible by Hkv and an even head_dim (T=" +
                            std::to_string(T) + " Hq=" + std::to_string(Hq) + " Hkv=" + std::to_string(Hkv) +
                            " D=" + std::to_string(D) + ")");
  if (pos_stride < 0) return invalid_argument("qk_norm_rope_kv: pos_stride must be >= 0");
  if (slot_mapping && (!k_cache || !v_cache)) return invalid_argument("qk_norm_rope_kv: slot_mapping needs both caches");
  const int heads = Hq + 2 * Hkv;
  const bool aligned = ((reinterpret_cast<uintptr_t>(qkv) | reinterpret_cast<uintptr_t>(q_norm) |
                          reinterpret_cast<uintptr_t>(k_norm) | reinterpret_cast<uintptr_t>(k_cache) |
                          reinterpret_cast<uintptr_t>(v_cache)) & 15) == 0;
  if (D == 128 && aligned) {
    // Decode-sized batches: one token per CTA, its rows split over CTAs of 16 rows (one round of loads);
    // prefill: 4 tokens per CTA, all heads, two rows per half-warp in flight.
    if (T < 256) {
      const int split = (heads + 15) / 16;
      return launch("qk_norm_rope_kv", qk_norm_rope_kv_stream_kernel<1, 1>, dim3(T, split), dim3(kStreamThreads), 0,
                    stream, qkv, q_norm, k_norm, pos, pos_stride, rope, slot_mapping, k_cache, v_cache, T, Hq, Hkv,
                    (heads + split - 1) / split, eps);
    }
    return launch("qk_norm_rope_kv", qk_norm_rope_kv_stream_kernel<4, 2>, dim3((T + 3) / 4, 1), dim3(kStreamThreads),
                  0, stream, qkv, q_norm, k_norm, pos, pos_stride, rope, slot_mapping, k_cache, v_cache, T, Hq, Hkv,
                  heads, eps);
  }
  return launch("qk_norm_rope_kv", qk_norm_rope_kv_kernel, dim3(T, (heads + kRopeWarps - 1) / kRopeWarps),
                dim3(kRopeWarps * 32), 0, stream, qkv, q_norm,
                k_norm, pos, pos_stride, rope, slot_mapping, k_cache, v_cache, Hq, Hkv, D, eps);
}

}  // namespace zest::cuda
