// Fused per-head q/k RMSNorm + (M-)RoPE + paged KV-cache write, one warp per (token, head).
#include "kernels/cuda/common.cuh"

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
  return launch("qk_norm_rope_kv", qk_norm_rope_kv_kernel, dim3(T, (heads + kRopeWarps - 1) / kRopeWarps),
                dim3(kRopeWarps * 32), 0, stream, qkv, q_norm,
                k_norm, pos, pos_stride, rope, slot_mapping, k_cache, v_cache, Hq, Hkv, D, eps);
}

}  // namespace zest::cuda
