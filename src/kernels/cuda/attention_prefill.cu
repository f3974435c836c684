// Prefill attention (causal, GQA, packed variable-length sequences) with bf16 tensor cores (wmma) and an
// fp32 online softmax. CTA = (64-query tile, query head, sequence); each of its 4 warps owns 16 query rows.
// Correctness first: scores, probabilities and the output accumulator go through shared memory.
#include <mma.h>

#include "kernels/cuda/common.cuh"

namespace zest::cuda {

namespace {

using namespace nvcuda;

constexpr int kD = 128;
constexpr int kBQ = 64;   // query rows per CTA
constexpr int kBK = 64;   // keys per tile
constexpr int kPW = 4;    // warps
constexpr int kLdK = kD + 8;  // padded row of K/V tiles (bf16)

struct PrefillSmem {
  bf16 q[kBQ][kD];
  bf16 k[kBK][kLdK];
  bf16 v[kBK][kLdK];
  float s[kPW][16][kBK];
  bf16 p[kPW][16][kBK];
  float o[kPW][16][kD];
  float m[kPW][16], l[kPW][16];
};

__global__ void __launch_bounds__(kPW * 32) prefill_attention_kernel(const bf16* __restrict__ q, int q_stride,
                                                                    const bf16* __restrict__ k,
                                                                    const bf16* __restrict__ v, int kv_stride,
                                                                    const int32_t* __restrict__ cu_seqlens,
                                                                    bf16* __restrict__ out, int Hq, int Hkv,
                                                                    float scale) {
  pdl_wait();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  PrefillSmem& sm = *reinterpret_cast<PrefillSmem*>(smem_raw);
  const int qt = blockIdx.x, h = blockIdx.y, seq = blockIdx.z;
  const int start = cu_seqlens[seq], len = cu_seqlens[seq + 1] - start;
  const int q0 = qt * kBQ;
  if (q0 >= len) return;
  const int kvh = h / (Hq / Hkv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // Q tile (zero rows past the sequence end).
  for (int i = threadIdx.x; i < kBQ * kD / 8; i += blockDim.x) {
    const int r = i / (kD / 8), c = (i % (kD / 8)) * 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (q0 + r < len)
      val = *reinterpret_cast<const uint4*>(q + static_cast<size_t>(start + q0 + r) * q_stride + h * kD + c);
    *reinterpret_cast<uint4*>(&sm.q[r][c]) = val;
  }
  for (int i = lane; i < 16 * kD; i += 32) sm.o[warp][i / kD][i % kD] = 0.f;
  if (lane < 16) {
    sm.m[warp][lane] = -INFINITY;
    sm.l[warp][lane] = 0.f;
  }

  const int q_last = min(q0 + kBQ, len) - 1;  // last query row of this tile
  for (int k0 = 0; k0 <= q_last; k0 += kBK) {
    __syncthreads();
    for (int i = threadIdx.x; i < kBK * kD / 8; i += blockDim.x) {
      const int r = i / (kD / 8), c = (i % (kD / 8)) * 8;
      uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = make_uint4(0, 0, 0, 0);
      if (k0 + r < len) {
        const size_t off = static_cast<size_t>(start + k0 + r) * kv_stride + kvh * kD + c;
        kv4 = *reinterpret_cast<const uint4*>(k + off);
        vv4 = *reinterpret_cast<const uint4*>(v + off);
      }
      *reinterpret_cast<uint4*>(&sm.k[r][c]) = kv4;
      *reinterpret_cast<uint4*>(&sm.v[r][c]) = vv4;
    }
    __syncthreads();

    // S = Q_w K^T (16 x 64).
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> sf[kBK / 16];
#pragma unroll
    for (int n = 0; n < kBK / 16; ++n) wmma::fill_fragment(sf[n], 0.f);
#pragma unroll
    for (int kk = 0; kk < kD; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> af;
      wmma::load_matrix_sync(af, &sm.q[warp * 16][kk], kD);
#pragma unroll
      for (int n = 0; n < kBK / 16; ++n) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> bfr;
        wmma::load_matrix_sync(bfr, &sm.k[n * 16][kk], kLdK);
        wmma::mma_sync(sf[n], af, bfr, sf[n]);
      }
    }
#pragma unroll
    for (int n = 0; n < kBK / 16; ++n) wmma::store_matrix_sync(&sm.s[warp][0][n * 16], sf[n], kBK, wmma::mem_row_major);
    __syncwarp();

    // Online softmax: lanes 2r, 2r+1 own row r (32 columns each).
    {
      const int r = lane >> 1, hf = lane & 1;
      const int qi = q0 + warp * 16 + r;
      float mx = -INFINITY;
      float sv[32];
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const int kj = k0 + hf * 32 + j;
        const bool ok = kj <= qi && kj < len;
        sv[j] = ok ? sm.s[warp][r][hf * 32 + j] * scale : -INFINITY;
        mx = fmaxf(mx, sv[j]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float m_old = sm.m[warp][r];
      const float m_new = fmaxf(m_old, mx);
      float ps = 0.f;
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const float pv = m_new == -INFINITY ? 0.f : __expf(sv[j] - m_new);
        const bf16 pb = __float2bfloat16(pv);
        sm.p[warp][r][hf * 32 + j] = pb;
        ps += __bfloat162float(pb);
      }
      ps += __shfl_xor_sync(0xffffffffu, ps, 1);
      const float alpha = m_new == -INFINITY ? 1.f : __expf(m_old - m_new);
#pragma unroll 8
      for (int d = hf * 64; d < hf * 64 + 64; ++d) sm.o[warp][r][d] *= alpha;
      __syncwarp();
      if (hf == 0) {
        sm.m[warp][r] = m_new;
        sm.l[warp][r] = sm.l[warp][r] * alpha + ps;
      }
    }
    __syncwarp();

    // O += P V (16 x 128), accumulator kept in shared memory.
#pragma unroll
    for (int n = 0; n < kD / 16; ++n) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> of;
      wmma::load_matrix_sync(of, &sm.o[warp][0][n * 16], kD, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kBK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> pf;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> vf;
        wmma::load_matrix_sync(pf, &sm.p[warp][0][kk], kBK);
        wmma::load_matrix_sync(vf, &sm.v[kk][n * 16], kLdK);
        wmma::mma_sync(of, pf, vf, of);
      }
      wmma::store_matrix_sync(&sm.o[warp][0][n * 16], of, kD, wmma::mem_row_major);
    }
    __syncwarp();
  }

  // Normalise and write this warp's 16 rows.
  for (int i = lane; i < 16 * kD / 8; i += 32) {
    const int r = i / (kD / 8), c = (i % (kD / 8)) * 8;
    const int qi = q0 + warp * 16 + r;
    if (qi >= len) continue;
    const float L = sm.l[warp][r];
    const float inv = L > 0.f ? 1.f / L : 0.f;
    uint4 o;
    bf16* ob = reinterpret_cast<bf16*>(&o);
#pragma unroll
    for (int j = 0; j < 8; ++j) ob[j] = __float2bfloat16(sm.o[warp][r][c + j] * inv);
    *reinterpret_cast<uint4*>(out + static_cast<size_t>(start + qi) * Hq * kD + h * kD + c) = o;
  }
}

}  // namespace

Status prefill_attention(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride,
                         const int32_t* cu_seqlens, int nseq, int max_seqlen, bf16* out, int Hq, int Hkv, int D,
                         float scale, cudaStream_t stream) {
  if (D != kD)
    return prefill_attention_generic(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, D, scale,
                                     stream);
  if (nseq <= 0 || max_seqlen <= 0 || Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0)
    return invalid_argument("prefill_attention: need nseq, max_seqlen, heads > 0 and Hq divisible by Hkv");
  if (q_stride % 8 != 0 || kv_stride % 8 != 0)
    return invalid_argument("prefill_attention: row strides must be multiples of 8 elements");
  const size_t smem = sizeof(PrefillSmem);
  static bool configured = false;
  if (!configured) {
    ZEST_RETURN_IF_ERROR(cuda_status(
        cudaFuncSetAttribute(prefill_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "prefill_attention smem"));
    configured = true;
  }
  const dim3 grid((max_seqlen + kBQ - 1) / kBQ, Hq, nseq);
  return launch("prefill_attention", prefill_attention_kernel, grid, dim3(kPW * 32), smem, stream, q, q_stride, k, v,
                kv_stride, cu_seqlens, out, Hq, Hkv, scale);
}

}  // namespace zest::cuda
