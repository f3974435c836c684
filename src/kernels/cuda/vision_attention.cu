// Varlen non-causal attention of the vision tower (FlashAttention-2 style, mma.sync bf16): one CTA per
// (128-query tile, segment, head), 4 warps of 32 query rows (each K/V fragment feeds two m16 tiles), K/V
// tiles of 64 keys double-buffered with cp.async, fp32 online softmax in base 2, optional per-row
// log-sum-exp output.
#include <string>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vision_kernels.h"
#include "kernels/cuda/vision_mma.cuh"

namespace zest::cuda {

namespace {

using namespace vmma;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

constexpr int kBlockQ = 128;  // queries per CTA: 4 warps x 2 m16 tiles

// Row stride (elements) of a tile of dk8 8-wide chunks: an odd number of 16-byte units, so the 8 rows of
// an ldmatrix phase fall on distinct banks.
constexpr int tile_stride(int dk8) { return ((dk8 + 1) % 2 == 1 ? dk8 + 1 : dk8 + 2) * 8; }

template <int DK8>
constexpr size_t attention_smem_bytes() {
  return static_cast<size_t>(kBlockQ + 4 * kTile) * tile_stride(DK8) * sizeof(bf16);  // Q, K x2, V x2
}

// Head dimension DK8 * 8 (zero-padded from D): q k^T in k16 steps plus an m16n8k8 step for an odd chunk
// count, p v over DK8 output tiles of 8, so head_dim 72 runs without padding to 80.
template <int DK8>
__global__ void __launch_bounds__(kThreads, 2)
    attention_kernel(const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v, int stride,
                     const int32_t* __restrict__ cu_seqlens, int N, int heads, int D, float scale_log2,
                     bf16* __restrict__ out, float* __restrict__ lse) {
  constexpr int S = tile_stride(DK8), KS = DK8 / 2, TAIL = DK8 % 2, NT = kTile / 8, MT = 2;
  pdl_wait();
  const int seg = blockIdx.y, h = blockIdx.z;
  const int s0 = cu_seqlens[seg], s1 = cu_seqlens[seg + 1];
  const int q0 = s0 + blockIdx.x * kBlockQ;
  if (q0 >= s1) return;
  extern __shared__ uint4 smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + kBlockQ * S;
  bf16* sV = sK + 2 * kTile * S;
  zero_pad_columns<S, DK8 * 8>(sQ, kBlockQ + 4 * kTile, D);

  const bf16* qh = q + h * D;
  const bf16* kh = k + h * D;
  const bf16* vh = v + h * D;
  load_tile<S>(sQ, qh, stride, q0, s1, D, kBlockQ);
  load_tile<S>(sK, kh, stride, s0, s1, D);
  load_tile<S>(sV, vh, stride, s0, s1, D);
  cp_async_commit();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  uint32_t qa[MT][KS][4], qt[MT][2];
  float o[MT][DK8][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < DK8; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;

  const int n_kt = (s1 - s0 + kTile - 1) / kTile;
  for (int kt = 0; kt < n_kt; ++kt) {
    const int buf = kt & 1;
    if (kt + 1 < n_kt) {
      const int nb = buf ^ 1;
      load_tile<S>(sK + nb * kTile * S, kh, stride, s0 + (kt + 1) * kTile, s1, D);
      load_tile<S>(sV + nb * kTile * S, vh, stride, s0 + (kt + 1) * kTile, s1, D);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (kt == 0) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const bf16* qrow = sQ + (warp * 32 + mt * 16 + lane % 16) * S;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) ldsm_x4(qa[mt][kk], qrow + kk * 16 + (lane / 16) * 8);
        if (TAIL) ldsm_x2(qt[mt], qrow + KS * 16);
      }
    }
    const bf16* tK = sK + buf * kTile * S;
    const bf16* tV = sV + buf * kTile * S;

    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < NT; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
      for (int jp = 0; jp < NT / 2; ++jp) {
        uint32_t b[4];
        ldsm_x4(b, tK + ((jp * 2 + lane / 16) * 8 + lane % 8) * S + kk * 16 + ((lane / 8) % 2) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816(s[mt][2 * jp], qa[mt][kk], b[0], b[1]);
          mma16816(s[mt][2 * jp + 1], qa[mt][kk], b[2], b[3]);
        }
      }
    }
    if (TAIL) {
#pragma unroll
      for (int jq = 0; jq < NT / 4; ++jq) {
        uint32_t b[4];
        ldsm_x4(b, tK + ((jq * 4 + lane / 8) * 8 + lane % 8) * S + KS * 16);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int i = 0; i < 4; ++i) mma1688(s[mt][jq * 4 + i], qt[mt], b[i]);
      }
    }
    const int k0 = s0 + kt * kTile;
    const bool partial = k0 + kTile > s1;
    uint32_t pa[MT][kTile / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[mt][j][e] * scale_log2;
          if (partial && k0 + j * 8 + 2 * t + (e & 1) >= s1) x = -INFINITY;
          s[mt][j][e] = x;
          mx[e / 2] = fmaxf(mx[e / 2], x);
        }
      }
      online_softmax_step(s[mt], mx, m[mt], l[mt], o[mt], pa[mt]);
    }
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < DK8 / 2; ++np) {
        uint32_t b[4];
        ldsm_x4_trans(b, tV + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * S + (np * 2 + lane / 16) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816(o[mt][2 * np], pa[mt][kk], b[0], b[1]);
          mma16816(o[mt][2 * np + 1], pa[mt][kk], b[2], b[3]);
        }
      }
      if (DK8 % 2) {
        uint32_t b[2];
        ldsm_x2_trans(b, tV + (kk * 16 + lane % 16) * S + (DK8 - 1) * 8);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) mma16816(o[mt][DK8 - 1], pa[mt][kk], b[0], b[1]);
      }
    }
    __syncthreads();
  }

  const int row_stride_out = heads * D;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lr = l[mt][r];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const int row = q0 + warp * 32 + mt * 16 + g + r * 8;
      if (row >= s1) continue;
      const float inv = 1.f / lr;
      bf16* orow = out + static_cast<size_t>(row) * row_stride_out + h * D;
#pragma unroll
      for (int i = 0; i < DK8; ++i) {
        if (i * 8 < D)
          *reinterpret_cast<uint32_t*>(orow + i * 8 + 2 * t) =
              pack_bf16(o[mt][i][2 * r] * inv, o[mt][i][2 * r + 1] * inv);
      }
      if (lse && t == 0) lse[static_cast<size_t>(h) * N + row] = (m[mt][r] + log2f(lr)) * kLn2;
    }
  }
}

template <int DK8>
Status launch_attention(const bf16* q, const bf16* k, const bf16* v, int stride, const int32_t* cu, int nseg,
                        int max_seqlen, int N, int heads, int D, float scale, bf16* out, float* lse,
                        cudaStream_t stream) {
  constexpr size_t smem = attention_smem_bytes<DK8>();
  const cudaError_t attr = once_per_device<cudaError_t>([&] {  // function attributes are per GPU
    return cudaFuncSetAttribute(attention_kernel<DK8>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  });
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "vision_attention smem attribute"));
  const dim3 grid((max_seqlen + kBlockQ - 1) / kBlockQ, nseg, heads);
  return launch("vision_attention", attention_kernel<DK8>, grid, dim3(kThreads), smem, stream, q, k, v, stride, cu, N,
                heads, D, scale * kLog2e, out, lse);
}

}  // namespace

Status vision_attention(const bf16* q, const bf16* k, const bf16* v, int stride, const int32_t* cu_seqlens, int nseg,
                        int max_seqlen, int N, int heads, int head_dim, float scale, bf16* out, float* lse,
                        cudaStream_t stream) {
  if (nseg <= 0 || max_seqlen <= 0 || N <= 0 || heads <= 0)
    return invalid_argument("vision_attention: nseg, max_seqlen, N and heads must be positive");
  if (head_dim <= 0 || head_dim % 8 != 0 || head_dim > 128)
    return invalid_argument("vision_attention: head_dim " + std::to_string(head_dim) +
                            " must be a multiple of 8 in [8, 128]");
  if (stride % 8 != 0 || stride < heads * head_dim)
    return invalid_argument("vision_attention: row stride " + std::to_string(stride) +
                            " must be a multiple of 8 and >= heads * head_dim");
  if ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(v) |
       reinterpret_cast<uintptr_t>(out)) %
          16 !=
      0)
    return invalid_argument("vision_attention: q, k, v and out must be 16-byte aligned");
  const int dk8 = head_dim / 8;
  auto run = [&](auto tag) {
    return launch_attention<decltype(tag)::value>(q, k, v, stride, cu_seqlens, nseg, max_seqlen, N, heads, head_dim,
                                                  scale, out, lse, stream);
  };
  if (dk8 <= 2) return run(std::integral_constant<int, 2>{});
  if (dk8 <= 4) return run(std::integral_constant<int, 4>{});
  if (dk8 <= 8) return run(std::integral_constant<int, 8>{});
  if (dk8 <= 9) return run(std::integral_constant<int, 9>{});
  if (dk8 <= 10) return run(std::integral_constant<int, 10>{});
  return run(std::integral_constant<int, 16>{});
}

}  // namespace zest::cuda
