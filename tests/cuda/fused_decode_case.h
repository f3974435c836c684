// A decode-attention test case with q/k norm + RoPE + KV write fused in, shared by the attention and latency tests:
// random paged K/V caches behind a shuffled block table, the qkv rows of one decode step (token b is sequence b's
// current token), q/k norm weights, positions (1-D RoPE or M-RoPE) and slots, and the host reference (q/k RMSNorm +
// RoPE with the kernels' bf16 roundings, the current token's k/v written at its slot, attention in double).
#pragma once
#ifdef ZEST_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "cuda/cuda_test_util.h"

namespace zest::cuda::test {

// Host q/k RMSNorm + rotate-half RoPE of one head row (D = 128) with the kernels' bf16 roundings; eps is the f32
// 1e-6f the tests pass to the kernels.
inline void ref_norm_rope128(const float* x, const std::vector<float>& w, const double* p_axis, bool mrope,
                             double theta, float* out) {
  const int D = 128, half = 64;
  const float eps = 1e-6f;
  double ss = 0;
  for (int d = 0; d < D; ++d) ss += static_cast<double>(x[d]) * x[d];
  const float inv = static_cast<float>(1.0 / std::sqrt(ss / D + eps));
  std::vector<float> n(D);
  for (int d = 0; d < D; ++d) n[d] = round_bf16(round_bf16(x[d] * inv) * w[d]);
  for (int j = 0; j < half; ++j) {
    int axis = 0;
    if (mrope && j % 3 == 1 && j < 60) axis = 1;
    if (mrope && j % 3 == 2 && j < 60) axis = 2;
    const double ang = p_axis[axis] / std::pow(theta, 2.0 * j / D);
    const float cs = round_bf16(static_cast<float>(std::cos(ang))), sn = round_bf16(static_cast<float>(std::sin(ang)));
    out[j] = round_bf16(n[j] * cs - n[j + half] * sn);
    out[j + half] = round_bf16(n[j + half] * cs + n[j] * sn);
  }
}

// Reference attention of one query over keys/values given as f32 rows (for each position) of one head, in double.
inline void ref_attend(const float* q, const std::vector<const float*>& k, const std::vector<const float*>& v, int D,
                       float scale, float* out) {
  std::vector<double> s(k.size());
  double mx = -INFINITY;
  for (size_t j = 0; j < k.size(); ++j) {
    double d = 0;
    for (int i = 0; i < D; ++i) d += static_cast<double>(q[i]) * k[j][i];
    s[j] = d * scale;
    mx = std::max(mx, s[j]);
  }
  double sum = 0;
  for (auto& x : s) sum += (x = std::exp(x - mx));
  for (int i = 0; i < D; ++i) {
    double o = 0;
    for (size_t j = 0; j < k.size(); ++j) o += s[j] * v[j][i];
    out[i] = static_cast<float>(o / sum);
  }
}

// The inputs of one decode step of B sequences (context lengths `lens`, the current token included) with Hq = 8 * Hkv
// query heads of D = 128: block table bt [B, max_blocks] (each sequence a random set of physical blocks), caches kc/vc
// [blocks * kKvBlock, Hkv, D], qkv rows [B, q_stride], norm weights qn/kn [D], positions pos [3, B] (axis t is
// lens[b] - 1), slots [B] (where each current token's k/v goes), the RoPE parameters and the attention shape p.
struct FusedDecodeCase {
  int B = 0, Hq = 0, Hkv = 0, D = 128;
  bool mrope = false;
  std::vector<int> lens;
  int max_ctx = 0, max_blocks = 0;
  std::vector<int32_t> bt;
  HostBF16 kc, vc;
  int q_stride = 0;
  HostBF16 qkv, qn, kn;
  std::vector<int32_t> pos, slots;
  RopeParams rope;
  int pos_stride = 0;
  DecodeAttention p;

  // Offset in kc/vc of token t of sequence b, kv head h.
  size_t kv_offset(int b, int t, int h) const {
    return ((static_cast<size_t>(bt[b * max_blocks + t / kKvBlock]) * kKvBlock + t % kKvBlock) * Hkv + h) * D;
  }
};

// Random cache contents (k in [-1.5, 1.5], v in [-1, 1]; the current token's slot holds stale values), qkv rows in
// [-2, 2], norm weights in [0.5, 1.5], M-RoPE axes h/w in [0, 3000]; theta 5e6 with M-RoPE sections of 20, else 1e6.
// nan_tail: rows past each sequence's context in its last page hold NaN (never attended).
inline FusedDecodeCase make_fused_decode_case(const std::vector<int>& lens, int Hkv, bool mrope, bool nan_tail,
                                              std::mt19937& rng) {
  FusedDecodeCase c;
  c.B = static_cast<int>(lens.size());
  c.Hkv = Hkv;
  c.Hq = 8 * Hkv;
  c.mrope = mrope;
  c.lens = lens;
  const int B = c.B, D = c.D;
  c.max_ctx = *std::max_element(lens.begin(), lens.end());
  c.max_blocks = (c.max_ctx + kKvBlock - 1) / kKvBlock + 1;
  const int num_blocks = B * c.max_blocks;
  c.bt.resize(num_blocks);
  std::iota(c.bt.begin(), c.bt.end(), 0);
  std::shuffle(c.bt.begin(), c.bt.end(), rng);
  const size_t cache_elems = static_cast<size_t>(num_blocks) * kKvBlock * Hkv * D;
  c.kc = random_bf16(cache_elems, rng, -1.5f, 1.5f);
  c.vc = random_bf16(cache_elems, rng);
  if (nan_tail) {
    const uint16_t nan_bits = 0x7fc0;
    for (int b = 0; b < B; ++b)
      for (int t = lens[b]; t < (lens[b] + kKvBlock - 1) / kKvBlock * kKvBlock; ++t) {
        const size_t off = c.kv_offset(b, t, 0);
        for (size_t i = 0; i < static_cast<size_t>(Hkv) * D; ++i) {
          c.kc.bits[off + i] = c.vc.bits[off + i] = nan_bits;
          c.kc.f[off + i] = c.vc.f[off + i] = NAN;
        }
      }
  }
  c.q_stride = (c.Hq + 2 * Hkv) * D;
  c.qkv = random_bf16(static_cast<size_t>(B) * c.q_stride, rng, -2.f, 2.f);
  c.qn = random_bf16(D, rng, 0.5f, 1.5f);
  c.kn = random_bf16(D, rng, 0.5f, 1.5f);
  c.pos.resize(3 * B);
  c.slots.resize(B);
  std::uniform_int_distribution<int> pd(0, 3000);
  for (int b = 0; b < B; ++b) {
    c.pos[b] = lens[b] - 1;
    c.pos[B + b] = pd(rng);
    c.pos[2 * B + b] = pd(rng);
    const int p = lens[b] - 1;
    c.slots[b] = c.bt[b * c.max_blocks + p / kKvBlock] * kKvBlock + p % kKvBlock;
  }
  c.rope.theta = mrope ? 5e6f : 1e6f;
  if (mrope) c.rope.section_h = c.rope.section_w = 20;
  c.pos_stride = mrope ? B : 0;
  c.p.batch = B;
  c.p.q_heads = c.Hq;
  c.p.kv_heads = Hkv;
  c.p.max_context = c.max_ctx;
  c.p.max_blocks = c.max_blocks;
  c.p.scale = 1.f / std::sqrt(static_cast<float>(D));
  return c;
}

// Host reference of a FusedDecodeCase: out [B, Hq, D] and the caches kref/vref after the step (copies of kc/vc with
// each current token's normed and rotated k and its v written at its slot).
struct FusedDecodeRef {
  std::vector<float> out, kref, vref;
};

inline FusedDecodeRef fused_decode_reference(const FusedDecodeCase& c) {
  const int B = c.B, Hq = c.Hq, Hkv = c.Hkv, D = c.D;
  FusedDecodeRef r;
  r.kref = c.kc.f;
  r.vref = c.vc.f;
  r.out.resize(static_cast<size_t>(B) * Hq * D);
  std::vector<float> qh(D);
  for (int b = 0; b < B; ++b) {
    const double pa[3] = {static_cast<double>(c.pos[b]), static_cast<double>(c.pos[c.mrope ? B + b : b]),
                          static_cast<double>(c.pos[c.mrope ? 2 * B + b : b])};
    const float* row = &c.qkv.f[static_cast<size_t>(b) * c.q_stride];
    for (int h = 0; h < Hkv; ++h) {
      const size_t dst = (static_cast<size_t>(c.slots[b]) * Hkv + h) * D;
      ref_norm_rope128(row + (Hq + h) * D, c.kn.f, pa, c.mrope, c.rope.theta, &r.kref[dst]);
      for (int d = 0; d < D; ++d) r.vref[dst + d] = row[(Hq + Hkv + h) * D + d];
    }
    for (int h = 0; h < Hq; ++h) {
      ref_norm_rope128(row + h * D, c.qn.f, pa, c.mrope, c.rope.theta, qh.data());
      std::vector<const float*> ks, vs;
      for (int t = 0; t < c.lens[b]; ++t) {
        const size_t off = c.kv_offset(b, t, h / 8);
        ks.push_back(&r.kref[off]);
        vs.push_back(&r.vref[off]);
      }
      ref_attend(qh.data(), ks, vs, D, c.p.scale, &r.out[(static_cast<size_t>(b) * Hq + h) * D]);
    }
  }
  return r;
}

}  // namespace zest::cuda::test
#endif  // ZEST_HAVE_CUDA
