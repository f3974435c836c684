// Prefill attention (causal, GQA, packed variable-length sequences), head_dim 128, bf16 tensor cores.
//
// Common to the kernels here: CTA = (query head, query tile, sequence); softmax online in fp32 and base 2
// (scale pre-multiplied by log2 e); K/V tiles double-buffered with cp.async; key tiles above the diagonal are
// not loaded, tiles all of whose keys lie after a warp's (warpgroup's) rows are skipped, and only tiles that
// cross the diagonal are masked; the longest query tiles are scheduled first (grid y runs from the last tile
// down) and the query heads of one kv head are adjacent in the grid so their K/V reads hit L2. The kernel is
// chosen by PrefillOption::kAttention (kernels.h):
// - wgmma (default; FlashAttention-3 style without warp specialisation): warpgroups of 64 query rows,
//   S = Q K^T from shared-memory operands, O += P V with P in registers (see the section below);
// - mma.sync (FlashAttention-2 style): W warps each owning MT m16 tiles of query rows; S and P are m16n8k16
//   accumulators/fragments; with one m-tile per warp the Q fragments stay in registers; K and V^T through
//   ldmatrix.
//
// The previous kernel (wmma, scores/probabilities/accumulator through shared memory, 64-query tiles) stays
// as prefill_attention_wmma for comparison.
#include <cuda.h>
#include <mma.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>
#include <type_traits>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vision_mma.cuh"

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


// ---- FlashAttention-2 style kernel -------------------------------------------------------------------------

constexpr int kFaLd = kD + 8;  // padded tile row (272 bytes: an odd number of 16-byte units)
template <int W, int MT, int BK>
constexpr size_t fa_smem() {
  return static_cast<size_t>(W * 16 * MT + 4 * BK) * kFaLd * sizeof(bf16);  // Q, K x2, V x2
}

// cp.async of `rows` rows [row0, row0 + rows) of one head (128 columns) into a tile; rows >= row_end zero-fill.
template <int kRows, int kThreads>
__device__ __forceinline__ void fa_load_tile(bf16* tile, const bf16* base, int stride, int row0, int row_end) {
  constexpr int kChunks = kD / 8;
#pragma unroll
  for (int i = threadIdx.x; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool valid = row0 + r < row_end;
    vmma::cp_async16(tile + r * kFaLd + c * 8, base + static_cast<size_t>(valid ? row0 + r : 0) * stride + c * 8,
                     valid);
  }
}

// W warps of MT m16 row tiles each, key tiles of BK; MT == 1 keeps the warp's Q fragments in registers, MT == 2
// reads them from shared memory at every k-step (registers go to the second accumulator tile instead).
template <int W, int MT, int BK>
__global__ void __launch_bounds__(W * 32, W * MT >= 8 ? 1 : 2)
    prefill_attention_fa_kernel(const bf16* __restrict__ q, int q_stride, const bf16* __restrict__ k,
                                const bf16* __restrict__ v, int kv_stride, const int32_t* __restrict__ cu_seqlens,
                                bf16* __restrict__ out, int Hq, int Hkv, float scale_log2) {
  using namespace vmma;
  constexpr int NT = BK / 8;  // n-tiles of 8 keys
  constexpr int KS = kD / 16;    // k-steps over the head dimension
  constexpr int DT = kD / 8;     // n-tiles of 8 output columns
  constexpr int kFaThreads = W * 32, kWarpRows = 16 * MT, kFaBQ = W * kWarpRows;
  constexpr bool kQRegs = MT == 1;
  pdl_wait();
  const int h = blockIdx.x, seq = blockIdx.z;
  const int qt = gridDim.y - 1 - blockIdx.y;  // longest tiles first
  const int start = cu_seqlens[seq], len = cu_seqlens[seq + 1] - start;
  const int q0 = qt * kFaBQ;
  if (q0 >= len) return;
  const int kvh = h / (Hq / Hkv);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sQ = reinterpret_cast<bf16*>(smem_raw);
  bf16* sK = sQ + kFaBQ * kFaLd;
  bf16* sV = sK + 2 * BK * kFaLd;

  const bf16* qh = q + static_cast<size_t>(start) * q_stride + h * kD;
  const bf16* kh = k + static_cast<size_t>(start) * kv_stride + kvh * kD;
  const bf16* vh = v + static_cast<size_t>(start) * kv_stride + kvh * kD;
  const int q_end = min(q0 + kFaBQ, len);        // rows past the sequence are zero-filled, never written
  const int n_kt = (q_end + BK - 1) / BK;  // key tiles up to the diagonal

  fa_load_tile<kFaBQ, kFaThreads>(sQ, qh, q_stride, q0, len);
  fa_load_tile<BK, kFaThreads>(sK, kh, kv_stride, 0, len);
  fa_load_tile<BK, kFaThreads>(sV, vh, kv_stride, 0, len);
  cp_async_commit();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int row0 = q0 + warp * kWarpRows;  // this warp's first query row (sequence-relative)
  const bf16* qrow = sQ + (warp * kWarpRows + (lane & 15)) * kFaLd + (lane >> 4) * 8;
  uint32_t qa[kQRegs ? KS : 1][4];
  float o[MT][DT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < DT; ++i) o[mt][i][0] = o[mt][i][1] = o[mt][i][2] = o[mt][i][3] = 0.f;
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;

  for (int kt = 0; kt < n_kt; ++kt) {
    const int buf = kt & 1;
    if (kt + 1 < n_kt) {
      fa_load_tile<BK, kFaThreads>(sK + (buf ^ 1) * BK * kFaLd, kh, kv_stride, (kt + 1) * BK, len);
      fa_load_tile<BK, kFaThreads>(sV + (buf ^ 1) * BK * kFaLd, vh, kv_stride, (kt + 1) * BK, len);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if (kQRegs && kt == 0) {
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) ldsm_x4(qa[kQRegs ? kk : 0], qrow + kk * 16);
    }
    const int k0 = kt * BK;
    // The warp has rows, and a key of this tile precedes its last row.
    if (row0 < len && k0 <= row0 + kWarpRows - 1) {
      const bf16* tK = sK + buf * BK * kFaLd;
      const bf16* tV = sV + buf * BK * kFaLd;
      float s[MT][NT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < NT; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        uint32_t qf[MT][4];
        if constexpr (!kQRegs) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) ldsm_x4(qf[mt], qrow + mt * 16 * kFaLd + kk * 16);
        }
#pragma unroll
        for (int jp = 0; jp < NT / 2; ++jp) {
          uint32_t b[4];
          ldsm_x4(b, tK + ((jp * 2 + (lane >> 4)) * 8 + (lane & 7)) * kFaLd + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            const uint32_t(&a)[4] = kQRegs ? qa[kQRegs ? kk : 0] : qf[mt];
            mma16816(s[mt][2 * jp], a, b[0], b[1]);
            mma16816(s[mt][2 * jp + 1], a, b[2], b[3]);
          }
        }
      }
      uint32_t pa[MT][BK / 16][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int mrow = row0 + mt * 16;                // first row of this m-tile
        const bool diag = k0 + BK - 1 > mrow;        // some key of this tile lies after the m-tile's first row
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float x = s[mt][j][e] * scale_log2;
            if (diag && k0 + j * 8 + 2 * t + (e & 1) > mrow + g + (e >> 1) * 8) x = -INFINITY;
            s[mt][j][e] = x;
            mx[e >> 1] = fmaxf(mx[e >> 1], x);
          }
        }
        online_softmax_step(s[mt], mx, m[mt], l[mt], o[mt], pa[mt]);  // m finite: key 0 precedes every row
      }
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < DT / 2; ++np) {
          uint32_t b[4];
          ldsm_x4_trans(b, tV + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kFaLd + (np * 2 + (lane >> 4)) * 8);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            mma16816(o[mt][2 * np], pa[mt][kk], b[0], b[1]);
            mma16816(o[mt][2 * np + 1], pa[mt][kk], b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();
  }

  const size_t out_stride = static_cast<size_t>(Hq) * kD;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float lr = l[mt][r];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const int row = row0 + mt * 16 + g + r * 8;
      if (row >= len) continue;
      const float inv = 1.f / lr;
      bf16* orow = out + static_cast<size_t>(start + row) * out_stride + h * kD;
#pragma unroll
      for (int i = 0; i < DT; ++i)
        *reinterpret_cast<uint32_t*>(orow + i * 8 + 2 * t) =
            vmma::pack_bf16(o[mt][i][2 * r] * inv, o[mt][i][2 * r + 1] * inv);
    }
}


// ---- wgmma kernels (variants 6 and 7) ------------------------------------------------------------------------
//
// CTA = WGS warpgroups x 64 query rows, key tiles of BN double-buffered with cp.async. Q, K and V tiles share one
// shared-memory form: two 64-column blocks of 128-byte rows, 128-byte swizzled (16-byte chunk c of row r at
// chunk c ^ (r % 8)), blocks 1024-byte aligned. S = Q K^T is wgmma m64nBNk16 with both operands K-major in
// shared memory; O += P V takes P from registers (the S accumulator converted in place) and V N-major
// (transposed B, leading byte offset = the distance of the two 64-column blocks).

template <int WGS, int BN>
constexpr size_t wg_smem() {
  return static_cast<size_t>(64 * WGS + 4 * BN) * kD * sizeof(bf16) + 1024;  // Q, K x2, V x2, alignment slack
}

// d (m64 x n64, fp32) += A (m64 x k16) * B (k16 x n64), both from shared memory (K-major descriptors).
__device__ __forceinline__ void wgmma_ss_n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b));
}
// d (m64 x n128, fp32) += A (m64 x k16) * B (k16 x n128), both from shared memory (K-major descriptors).
__device__ __forceinline__ void wgmma_ss_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b));
}
// d += A * B with A from registers (the mma.sync m16n8k16 A fragment per warp) and B N-major in shared memory.
__device__ __forceinline__ void wgmma_rs_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

template <int BN>
__device__ __forceinline__ void wgmma_s(float (&d)[BN / 2], uint64_t desc_a, uint64_t desc_b) {
  if constexpr (BN == 64)
    wgmma_ss_n64(d, desc_a, desc_b);
  else
    wgmma_ss_n128(d, desc_a, desc_b);
}

__device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (static_cast<uint64_t>(1) << 62);
}

// One key tile of the online softmax for a thread's two rows (the wgmma kernels' m64n128 layout): the tile's row maxima
// mx (this thread's; reduced over the quad here, then times mscale when kScale) update the running maxima m, and the
// running sums l and the output accumulator o are rescaled by exp2(m_old - m_new).
template <bool kScale>
__device__ __forceinline__ void wg_online_rescale(float (&mx)[2], float (&m)[2], float (&l)[2], float (&o)[64],
                                                  float mscale) {
  float alpha[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    if (kScale) mx[r] *= mscale;
    const float mn = fmaxf(m[r], mx[r]);  // finite: key 0 (tile 0) precedes every row
    alpha[r] = exp2f(m[r] - mn);
    m[r] = mn;
    l[r] *= alpha[r];
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    o[4 * i] *= alpha[0];
    o[4 * i + 1] *= alpha[0];
    o[4 * i + 2] *= alpha[1];
    o[4 * i + 3] *= alpha[1];
  }
}

// A thread's two attention output rows, `row` and `row + 8` (sequence-relative), from its part t of the m64n128
// accumulator o: divided by the row's softmax sum (the quad's partial sums l, summed over the quad) and stored as bf16
// at token start + row, head h of Hq; rows at or past len are not stored.
__device__ __forceinline__ void store_wg_rows(const float (&o)[64], const float (&l)[2], bf16* out, int start, int row,
                                              int len, int t, int h, int Hq) {
  const size_t out_stride = static_cast<size_t>(Hq) * kD;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float lr = l[r];
    lr += __shfl_xor_sync(0xffffffffu, lr, 1);
    lr += __shfl_xor_sync(0xffffffffu, lr, 2);
    const int rr = row + r * 8;
    if (rr >= len) continue;
    const float inv = 1.f / lr;
    bf16* orow = out + static_cast<size_t>(start + rr) * out_stride + h * kD;
#pragma unroll
    for (int i = 0; i < 16; ++i)
      *reinterpret_cast<uint32_t*>(orow + i * 8 + 2 * t) =
          vmma::pack_bf16(o[4 * i + 2 * r] * inv, o[4 * i + 2 * r + 1] * inv);
  }
}

// cp.async of ROWS rows [row0, row0 + ROWS) of one head into a swizzled tile (rows >= row_end zero-filled).
template <int ROWS, int THREADS>
__device__ __forceinline__ void wg_load_tile(unsigned char* tile, const bf16* base, int stride, int row0, int row_end) {
#pragma unroll
  for (int i = threadIdx.x; i < ROWS * 16; i += THREADS) {
    const int r = i >> 4, c = i & 15;
    const bool valid = row0 + r < row_end;
    unsigned char* dst = tile + (c >> 3) * (ROWS * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4);
    vmma::cp_async16(dst, base + static_cast<size_t>(valid ? row0 + r : 0) * stride + c * 8, valid);
  }
}

template <int WGS, int BN>
__global__ void __launch_bounds__(WGS * 128, WGS == 1 ? 2 : 1)
    prefill_attention_wgmma_kernel(const bf16* __restrict__ q, int q_stride, const bf16* __restrict__ k,
                                   const bf16* __restrict__ v, int kv_stride, const int32_t* __restrict__ cu_seqlens,
                                   bf16* __restrict__ out, int Hq, int Hkv, float scale_log2) {
  using namespace vmma;
  constexpr int kThreads = WGS * 128, kRows = WGS * 64;
  constexpr uint32_t kQBytes = kRows * kD * sizeof(bf16), kTileBytes = BN * kD * sizeof(bf16);
  constexpr uint32_t kQBlock = kRows * 128, kKvBlock = BN * 128;  // bytes of one 64-column block
  pdl_wait();
  const int h = blockIdx.x, seq = blockIdx.z;
  const int qt = gridDim.y - 1 - blockIdx.y;  // longest tiles first
  const int start = cu_seqlens[seq], len = cu_seqlens[seq + 1] - start;
  const int q0 = qt * kRows;
  if (q0 >= len) return;
  const int kvh = h / (Hq / Hkv);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  unsigned char* sQ = smem;
  unsigned char* sK = sQ + kQBytes;
  unsigned char* sV = sK + 2 * kTileBytes;
  const uint32_t aQ = static_cast<uint32_t>(__cvta_generic_to_shared(sQ));
  const uint32_t aK = aQ + kQBytes, aV = aK + 2 * kTileBytes;

  const bf16* qh = q + static_cast<size_t>(start) * q_stride + h * kD;
  const bf16* kh = k + static_cast<size_t>(start) * kv_stride + kvh * kD;
  const bf16* vh = v + static_cast<size_t>(start) * kv_stride + kvh * kD;
  const int q_end = min(q0 + kRows, len);
  const int n_kt = (q_end + BN - 1) / BN;

  wg_load_tile<kRows, kThreads>(sQ, qh, q_stride, q0, len);
  wg_load_tile<BN, kThreads>(sK, kh, kv_stride, 0, len);
  wg_load_tile<BN, kThreads>(sV, vh, kv_stride, 0, len);
  cp_async_commit();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2, wq = warp & 3;
  const int wg_row0 = q0 + wg * 64;   // this warpgroup's first query row
  const int row0 = wg_row0 + wq * 16;  // this warp's first query row
  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  for (int kt = 0; kt < n_kt; ++kt) {
    const int buf = kt & 1;
    if (kt + 1 < n_kt) {
      wg_load_tile<BN, kThreads>(sK + (buf ^ 1) * kTileBytes, kh, kv_stride, (kt + 1) * BN, len);
      wg_load_tile<BN, kThreads>(sV + (buf ^ 1) * kTileBytes, vh, kv_stride, (kt + 1) * BN, len);
    }
    cp_async_commit();
    cp_async_wait<1>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int k0 = kt * BN;
    // Warpgroup-uniform: the warpgroup has rows, and some key of this tile precedes its last row.
    if (wg_row0 < len && k0 <= wg_row0 + 63) {
      float s[BN / 2];
#pragma unroll
      for (int i = 0; i < BN / 2; ++i) s[i] = 0.f;
      const uint32_t qa = aQ + wg * 64 * 128, ka = aK + buf * kTileBytes;
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < kD / 16; ++kk)
        wgmma_s<BN>(s, wg_desc(qa + (kk >> 2) * kQBlock + (kk & 3) * 32, 16, 1024),
                    wg_desc(ka + (kk >> 2) * kKvBlock + (kk & 3) * 32, 16, 1024));
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");

      const bool diag = k0 + BN - 1 > row0;
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int i = 0; i < BN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[4 * i + e] * scale_log2;
          if (diag && k0 + 8 * i + 2 * t + (e & 1) > row0 + g + (e >> 1) * 8) x = -INFINITY;
          s[4 * i + e] = x;
          mx[e >> 1] = fmaxf(mx[e >> 1], x);
        }
      wg_online_rescale<false>(mx, m, l, o, 0.f);
      uint32_t pa[BN / 16][4];
#pragma unroll
      for (int i = 0; i < BN / 8; ++i) {
        const float p0 = exp2f(s[4 * i] - m[0]), p1 = exp2f(s[4 * i + 1] - m[0]);
        const float p2 = exp2f(s[4 * i + 2] - m[1]), p3 = exp2f(s[4 * i + 3] - m[1]);
        l[0] += p0 + p1;
        l[1] += p2 + p3;
        pa[i / 2][(i % 2) * 2] = pack_bf16(p0, p1);
        pa[i / 2][(i % 2) * 2 + 1] = pack_bf16(p2, p3);
      }
      const uint32_t va = aV + buf * kTileBytes;
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) wgmma_rs_tb(o, pa[kk], wg_desc(va + kk * 16 * 128, kKvBlock, 1024));
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    }
    __syncthreads();
  }

  store_wg_rows(o, l, out, start, row0 + g, len, t, h, Hq);
}

template <int WGS, int BN>
Status launch_wgmma(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride, const int32_t* cu_seqlens,
                    int nseq, int max_seqlen, bf16* out, int Hq, int Hkv, float scale, cudaStream_t stream) {
  constexpr size_t smem = wg_smem<WGS, BN>();
  static const cudaError_t attr = cudaFuncSetAttribute(prefill_attention_wgmma_kernel<WGS, BN>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       static_cast<int>(smem));
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "prefill_attention (wgmma) smem attribute"));
  constexpr float kLog2e = 1.4426950408889634f;
  constexpr int rows = WGS * 64;
  const dim3 grid(Hq, (max_seqlen + rows - 1) / rows, nseq);
  return launch("prefill_attention", prefill_attention_wgmma_kernel<WGS, BN>, grid, dim3(WGS * 128), smem, stream, q,
                q_stride, k, v, kv_stride, cu_seqlens, out, Hq, Hkv, scale * kLog2e);
}

// Variant 8: the wgmma kernel with 2 warpgroups and 128-key tiles, pipelined inside each warpgroup: S of tile
// kt + 1 is issued before the softmax of tile kt, so the softmax overlaps a wgmma. K/V tiles are triple-buffered
// (tile kt + 2 is loaded while kt and kt + 1 are in use); 224 KiB of shared memory, one CTA per SM.
constexpr size_t kPipeTileBytes = static_cast<size_t>(128) * kD * sizeof(bf16);
constexpr size_t kPipeSmem = 7 * kPipeTileBytes + 1024;  // Q, K x3, V x3, alignment slack

// 2^x by ex2.approx.ftz (no denormal handling: a probability below 2^-126 becomes 0).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <bool kLean, bool kSwap, bool kFtz>
__global__ void __launch_bounds__(256, 1)
    prefill_attention_wgmma_pipe_kernel(const bf16* __restrict__ q, int q_stride, const bf16* __restrict__ k,
                                        const bf16* __restrict__ v, int kv_stride,
                                        const int32_t* __restrict__ cu_seqlens, bf16* __restrict__ out, int Hq, int Hkv,
                                        float scale_log2) {
  using namespace vmma;
  constexpr uint32_t kTile = kPipeTileBytes, kBlock = 128 * 128;  // bytes of a tile, of one 64-column block
  pdl_wait();
  const int h = blockIdx.x, seq = blockIdx.z;
  const int qt = gridDim.y - 1 - blockIdx.y;  // longest tiles first
  const int start = cu_seqlens[seq], len = cu_seqlens[seq + 1] - start;
  const int q0 = qt * 128;
  if (q0 >= len) return;
  const int kvh = h / (Hq / Hkv);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  unsigned char* sQ = smem;
  unsigned char* sK = sQ + kTile;       // 3 tiles
  unsigned char* sV = sK + 3 * kTile;   // 3 tiles
  const uint32_t aQ = static_cast<uint32_t>(__cvta_generic_to_shared(sQ));
  const uint32_t aK = aQ + kTile, aV = aK + 3 * kTile;

  const bf16* qh = q + static_cast<size_t>(start) * q_stride + h * kD;
  const bf16* kh = k + static_cast<size_t>(start) * kv_stride + kvh * kD;
  const bf16* vh = v + static_cast<size_t>(start) * kv_stride + kvh * kD;
  const int q_end = min(q0 + 128, len);
  const int n_kt = (q_end + 127) / 128;  // every tile up to the diagonal: each active warpgroup has keys in all

  wg_load_tile<128, 256>(sQ, qh, q_stride, q0, len);
  wg_load_tile<128, 256>(sK, kh, kv_stride, 0, len);
  wg_load_tile<128, 256>(sV, vh, kv_stride, 0, len);
  cp_async_commit();
  if (n_kt > 1) {
    wg_load_tile<128, 256>(sK + kTile, kh, kv_stride, 128, len);
    wg_load_tile<128, 256>(sV + kTile, vh, kv_stride, 128, len);
  }
  cp_async_commit();
  cp_async_wait<1>();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2, wq = warp & 3;
  const int row0 = q0 + wg * 64 + wq * 16;
  const uint32_t qa = aQ + wg * 64 * 128;
  // No branch while a wgmma is in flight (ptxas would serialise them): a warpgroup whose rows are all past the
  // sequence computes anyway and writes nothing, every key is masked by comparison, and the last tile is peeled.
  auto issue_s = [&](float (&acc)[64], int buf) {
    const uint32_t ka = aK + buf * kTile;
#pragma unroll
    for (int i = 0; i < 64; ++i) acc[i] = 0.f;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk)
      wgmma_ss_n128(acc, wg_desc(qa + (kk >> 2) * kBlock + (kk & 3) * 32, 16, 1024),
                    wg_desc(ka + (kk >> 2) * kBlock + (kk & 3) * 32, 16, 1024));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  };
  float o[64], sc[64], sn[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  // Softmax of tile kt (scores in sc), then O += P V of tile kt issued (committed, not waited for).
  // kLean: scores stay unscaled (the max is taken on them, scale > 0) and p = exp2(s * scale - m) is one FFMA
  // and EX2; the causal mask is applied to the last tile only (with 128-row query tiles and 128-key tiles it is
  // the only one that crosses the diagonal). Otherwise every tile is scaled, then masked by comparison.
  auto softmax_pv = [&](int kt, float (&sv)[64], auto last) {
    constexpr bool kMask = !kLean || decltype(last)::value;
    const int k0 = kt * 128;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = kLean ? sv[4 * i + e] : sv[4 * i + e] * scale_log2;
        if (kMask && k0 + 8 * i + 2 * t + (e & 1) > row0 + g + (e >> 1) * 8) x = -INFINITY;
        sv[4 * i + e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    wg_online_rescale<kLean>(mx, m, l, o, scale_log2);
    uint32_t pa[8][4];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      float p[4];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        p[e] = kLean ? (kFtz ? exp2_ftz(fmaf(sv[4 * i + e], scale_log2, -m[e >> 1]))
                             : exp2f(fmaf(sv[4 * i + e], scale_log2, -m[e >> 1])))
                     : exp2f(sv[4 * i + e] - m[e >> 1]);
      l[0] += p[0] + p[1];
      l[1] += p[2] + p[3];
      pa[i / 2][(i % 2) * 2] = pack_bf16(p[0], p[1]);
      pa[i / 2][(i % 2) * 2 + 1] = pack_bf16(p[2], p[3]);
    }
    const uint32_t va = aV + (kt % 3) * kTile;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) wgmma_rs_tb(o, pa[kk], wg_desc(va + kk * 16 * 128, kBlock, 1024));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  };

  issue_s(sc, 0);
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  // One key tile with scores in cur: S of tile kt + 1 into nxt (runs on the tensor cores during the softmax),
  // softmax and O += P V of tile kt, then both waited for.
  auto step = [&](int kt, float (&cur)[64], float (&nxt)[64]) {
    cp_async_wait<0>();  // tile kt + 1
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();  // every warpgroup is done with tile kt - 1: its buffer takes tile kt + 2
    if (kt + 2 < n_kt) {
      const int b = (kt + 2) % 3;
      wg_load_tile<128, 256>(sK + b * kTile, kh, kv_stride, (kt + 2) * 128, len);
      wg_load_tile<128, 256>(sV + b * kTile, vh, kv_stride, (kt + 2) * 128, len);
    }
    cp_async_commit();
    issue_s(nxt, (kt + 1) % 3);
    softmax_pv(kt, cur, std::false_type{});
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  };
  if constexpr (kSwap) {  // the two score arrays swap roles every tile (unrolled by two, no copy)
    int kt = 0;
    for (; kt + 2 < n_kt; kt += 2) {
      step(kt, sc, sn);
      step(kt + 1, sn, sc);
    }
    if (kt + 1 < n_kt) {
      step(kt, sc, sn);
      softmax_pv(n_kt - 1, sn, std::true_type{});
    } else {
      softmax_pv(n_kt - 1, sc, std::true_type{});
    }
  } else {
    for (int kt = 0; kt + 1 < n_kt; ++kt) {
      step(kt, sc, sn);
#pragma unroll
      for (int i = 0; i < 64; ++i) sc[i] = sn[i];
    }
    softmax_pv(n_kt - 1, sc, std::true_type{});
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");

  store_wg_rows(o, l, out, start, row0 + g, len, t, h, Hq);
}

template <bool kLean, bool kSwap = false, bool kFtz = false>
Status launch_wgmma_pipe(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride,
                         const int32_t* cu_seqlens, int nseq, int max_seqlen, bf16* out, int Hq, int Hkv, float scale,
                         cudaStream_t stream) {
  static const cudaError_t attr = cudaFuncSetAttribute(
      prefill_attention_wgmma_pipe_kernel<kLean, kSwap, kFtz>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kPipeSmem));
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "prefill_attention (wgmma, pipelined) smem attribute"));
  constexpr float kLog2e = 1.4426950408889634f;
  const dim3 grid(Hq, (max_seqlen + 127) / 128, nseq);
  return launch("prefill_attention", prefill_attention_wgmma_pipe_kernel<kLean, kSwap, kFtz>, grid, dim3(256), kPipeSmem, stream, q,
                q_stride, k, v, kv_stride, cu_seqlens, out, Hq, Hkv, scale * kLog2e);
}

// ---- Warp-specialised wgmma kernel (variants 12 and 13; FlashAttention-3 style) ---------------------------
//
// CTA = 3 warpgroups for one (query head, 128-row query tile): warpgroup 0 is the producer (one warp issues TMA
// loads of the Q tile and of the K and V tiles into a ring of STAGES mbarrier-guarded stages, its registers cut
// to 40 by setmaxnreg), warpgroups 1 and 2 are consumers of 64 query rows each (registers raised to 232). Key
// tiles of 128 run from the diagonal tile (the only one masked) down to tile 0. Per key tile a consumer issues
// S = Q K^T of this tile and O += P V of the previous one, then the softmax of S runs while the PV GEMM is in
// flight (P stays in registers as the A operand, O is rescaled once the GEMM is done). The two consumers take
// turns at issuing their GEMMs (named barriers 1 and 2), so one warpgroup's softmax overlaps the other's GEMMs.
// K and V live in the qkv buffer with a row stride: the tensor maps are 3-D (64 columns, 128-byte column
// blocks of the heads, token rows), one box = 64 columns x 128 rows, 128-byte swizzled: the shared-memory form
// of the other wgmma kernels. The Q tile and the diagonal K/V tile of a sequence's last query tile, which
// reach past the sequence end, are loaded by the producer warp with cp.async (zero-filled rows) instead, so TMA
// never reads a row outside the sequences (the host does not know the total token count).

constexpr int kWsThreads = 384;
constexpr int kWsMinSeqlen = 256;  // the default takes the persistent kernel above this max_seqlen
constexpr uint32_t kWsTile = 128 * kD * sizeof(bf16);  // bytes of one 128-row tile (two 64-column blocks)
constexpr uint32_t kWsBlock = 128 * 128;               // bytes of one 64-column block of a tile
template <int STAGES>
constexpr size_t ws_smem() {
  return static_cast<size_t>(1 + 2 * STAGES) * kWsTile + 1024 + 256;  // Q, K/V rings, alignment, barriers
}

// Two TMA boxes (the 64-column blocks) of one 128-row tile: rows [row, row + 128) of head `head`.
__device__ __forceinline__ void tma_tile(uint32_t dst, const CUtensorMap* map, uint32_t bar, int head, int row) {
#pragma unroll
  for (int b = 0; b < 2; ++b)
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(
            dst + b * kWsBlock),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(0), "r"(2 * head + b), "r"(row)
        : "memory");
}
// cp.async of a 128-row tile (or its first `rows` rows) by one warp (rows >= row_end zero-filled), into the
// swizzled form (dst may point at row 64 of a tile: the swizzle depends on the row modulo 8 only).
__device__ __forceinline__ void warp_load_tile(uint32_t dst, const bf16* base, int stride, int row0, int row_end,
                                               int lane, int rows = 128) {
  for (int i = lane; i < rows * 16; i += 32) {
    const int r = i >> 4, c = i & 15;
    const bool valid = row0 + r < row_end;
    const uint32_t d = dst + (c >> 3) * kWsBlock + r * 128 + (((c & 7) ^ (r & 7)) << 4);
    const bf16* src = base + static_cast<size_t>(valid ? row0 + r : 0) * stride + c * 8;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0)
                 : "memory");
  }
}
// d (m64 x n128, fp32) = (accumulate ? d : 0) + A * B, both from shared memory (K-major descriptors).
__device__ __forceinline__ void wgmma_ss_n128_acc(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// The consumer warpgroups' steps, shared by prefill_attention_ws_kernel and its persistent variant.
// Turn-taking at issuing GEMMs (ping-pong): consumer cw waits on barrier 1 + cw, then lets the other go.
template <bool kPingPong>
__device__ __forceinline__ void ws_sched_sync(int cw) {
  if constexpr (kPingPong) named_bar_sync(1 + cw, 256);
}
template <bool kPingPong>
__device__ __forceinline__ void ws_sched_arrive(int cw) {
  if constexpr (kPingPong) named_bar_arrive(2 - cw, 256);
}
// One arrival per warp on a ring slot's empty barrier.
__device__ __forceinline__ void ws_release(uint32_t bar, int lane) {
  __syncwarp();
  if (lane == 0) mbar_arrive(bar);
}
// acc = Q K^T of a consumer's 64 query rows (shared address qa) against the 128-key tile at ka.
__device__ __forceinline__ void ws_issue_s(float (&acc)[64], uint32_t qa, uint32_t ka) {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk)
    wgmma_ss_n128_acc(acc, wg_desc(qa + (kk >> 2) * kWsBlock + (kk & 3) * 32, 16, 1024),
                      wg_desc(ka + (kk >> 2) * kWsBlock + (kk & 3) * 32, 16, 1024), kk > 0);
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// o += P V with P (bf16, packed by ws_pack_p) in registers and the 128-row V tile at va.
__device__ __forceinline__ void ws_issue_pv(float (&o)[64], const uint32_t (&pa)[8][4], uint32_t va) {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) wgmma_rs_tb(o, pa[kk], wg_desc(va + kk * 16 * 128, kWsBlock, 1024));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// The first (diagonal) key tile's softmax of a consumer warp: scores sv of query rows row0 + g (+ 8) against keys
// kdiag + 8 i + 2 t (+ 1) masked causally, the running maxima m and sums l started from this tile, sv replaced by
// exp2(sv * scale_log2 - m) (kFast: exp2 with flush to zero).
template <bool kFast>
__device__ __forceinline__ void ws_first_tile_softmax(float (&sv)[64], float (&m)[2], float (&l)[2], int kdiag,
                                                      int row0, int g, int t, float scale_log2) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float x = sv[4 * i + e];
      if (kdiag + 8 * i + 2 * t + (e & 1) > row0 + g + (e >> 1) * 8) x = -INFINITY;
      sv[4 * i + e] = x;
      mx[e >> 1] = fmaxf(mx[e >> 1], x);
    }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    m[r] = mx[r] * scale_log2;
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    sv[i] = kFast ? exp2_ftz(fmaf(sv[i], scale_log2, -m[(i >> 1) & 1]))
                  : exp2f(fmaf(sv[i], scale_log2, -m[(i >> 1) & 1]));
    l[(i >> 1) & 1] += sv[i];
  }
}
// The online softmax over a later key tile (no mask): the row maxima of sv (scores) folded into m (log2 units),
// alpha = the factor for the previous output and sums, l rescaled and the tile's numerators added; sv becomes them.
template <bool kFast>
__device__ __forceinline__ void ws_tile_softmax(float (&sv)[64], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                                float scale_log2) {
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int j = 0; j < 64; ++j) mx[(j >> 1) & 1] = fmaxf(mx[(j >> 1) & 1], sv[j]);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float mn = fmaxf(m[r], mx[r] * scale_log2);
    alpha[r] = exp2f(m[r] - mn);
    m[r] = mn;
    l[r] *= alpha[r];
  }
#pragma unroll
  for (int j = 0; j < 64; ++j) {
    const float x = fmaf(sv[j], scale_log2, -m[(j >> 1) & 1]);
    sv[j] = kFast ? exp2_ftz(x) : exp2f(x);
    l[(j >> 1) & 1] += sv[j];
  }
}
// The softmax numerators sv (fp32 accumulator layout) as bf16 A fragments.
__device__ __forceinline__ void ws_pack_p(uint32_t (&pa)[8][4], const float (&sv)[64]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    pa[i / 2][(i % 2) * 2] = vmma::pack_bf16(sv[4 * i], sv[4 * i + 1]);
    pa[i / 2][(i % 2) * 2 + 1] = vmma::pack_bf16(sv[4 * i + 2], sv[4 * i + 3]);
  }
}

template <int STAGES, bool kPingPong>
__global__ void __launch_bounds__(kWsThreads, 1)
    prefill_attention_ws_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                                const __grid_constant__ CUtensorMap tm_v, const bf16* __restrict__ q, int q_stride,
                                const bf16* __restrict__ k, const bf16* __restrict__ v, int kv_stride,
                                const int32_t* __restrict__ cu_seqlens, bf16* __restrict__ out, int Hq, int Hkv,
                                float scale_log2) {
  using namespace vmma;
  pdl_wait();
  const int h = blockIdx.x, seq = blockIdx.z;
  const int qt = gridDim.y - 1 - blockIdx.y;  // longest tiles first
  const int start = cu_seqlens[seq], len = cu_seqlens[seq + 1] - start;
  const int q0 = qt * 128;
  if (q0 >= len) return;
  const int kvh = h / (Hq / Hkv);
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t aQ = raw + ((1024 - (raw & 1023)) & 1023);
  const uint32_t aK = aQ + kWsTile, aV = aK + STAGES * kWsTile, aBar = aV + STAGES * kWsTile;
  const uint32_t q_full = aBar;
  auto k_full = [&](int s) { return aBar + 8 * (1 + s); };
  auto v_full = [&](int s) { return aBar + 8 * (1 + STAGES + s); };
  auto k_empty = [&](int s) { return aBar + 8 * (1 + 2 * STAGES + s); };
  auto v_empty = [&](int s) { return aBar + 8 * (1 + 3 * STAGES + s); };
  const int n_kt = qt + 1;                // key tiles 0 .. qt; tile qt is the diagonal one
  const bool partial = q0 + 128 > len;    // the Q tile and the diagonal K/V tile reach past the sequence end
  if (threadIdx.x == 0) {
    mbar_init_count(q_full, 1);
    for (int s = 0; s < STAGES; ++s) {
      mbar_init_count(k_full(s), 1);
      mbar_init_count(v_full(s), 1);
      mbar_init_count(k_empty(s), 8);  // one arrival per consumer warp
      mbar_init_count(v_empty(s), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int wg = threadIdx.x >> 7, lane = threadIdx.x & 31;

  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
    if (threadIdx.x >= 32) return;
    // Tile i (i = 0 .. n_kt - 1) is key tile n_kt - 1 - i, in stage i % STAGES.
    const int krow = start + (n_kt - 1) * 128;
    if (partial) {
      warp_load_tile(aQ, q + static_cast<size_t>(start) * q_stride + h * kD, q_stride, q0, len, lane);
      warp_load_tile(aK, k + static_cast<size_t>(start) * kv_stride + kvh * kD, kv_stride, (n_kt - 1) * 128, len,
                     lane);
      asm volatile("cp.async.wait_all;\n" ::: "memory");
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      __syncwarp();
      if (lane == 0) {
        mbar_arrive(q_full);
        mbar_arrive(k_full(0));
      }
    } else if (lane == 0) {
      mbar_arrive_expect_tx(q_full, kWsTile);
      tma_tile(aQ, &tm_q, q_full, h, start + q0);
      mbar_arrive_expect_tx(k_full(0), kWsTile);
      tma_tile(aK, &tm_k, k_full(0), kvh, krow);
    }
    // K of tile i, then V of tile i - 1 (K leads: the S GEMM of a tile comes before the PV GEMM of the last).
    for (int i = 1; i <= n_kt; ++i) {
      if (i < n_kt && lane == 0) {
        const int s = i % STAGES;
        if (i >= STAGES) mbar_wait(k_empty(s), ((i / STAGES) - 1) & 1);
        mbar_arrive_expect_tx(k_full(s), kWsTile);
        tma_tile(aK + s * kWsTile, &tm_k, k_full(s), kvh, start + (n_kt - 1 - i) * 128);
      }
      const int j = i - 1, s = j % STAGES;
      if (j == 0 && partial) {
        warp_load_tile(aV, v + static_cast<size_t>(start) * kv_stride + kvh * kD, kv_stride, (n_kt - 1) * 128, len,
                       lane);
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncwarp();
        if (lane == 0) mbar_arrive(v_full(0));
      } else if (lane == 0) {
        if (j >= STAGES) mbar_wait(v_empty(s), ((j / STAGES) - 1) & 1);
        mbar_arrive_expect_tx(v_full(s), kWsTile);
        tma_tile(aV + s * kWsTile, &tm_v, v_full(s), kvh, start + (n_kt - 1 - j) * 128);
      }
    }
    return;
  }

  // Consumers.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
  const int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  const int row0 = q0 + cw * 64 + warp * 16;  // this warp's first query row (sequence-relative)
  const uint32_t qa = aQ + cw * 64 * 128;
  // Turn-taking of the two consumers at issuing GEMMs: consumer c waits on barrier 1 + c, then lets the other go.
  auto sched_sync = [&]() { ws_sched_sync<kPingPong>(cw); };
  auto sched_arrive = [&]() { ws_sched_arrive<kPingPong>(cw); };
  if (cw == 1) {
    if constexpr (kPingPong) named_bar_arrive(1, 256);  // consumer 0 goes first
  }
  auto release = [&](uint32_t bar) { ws_release(bar, lane); };
  auto issue_s = [&](float (&acc)[64], int s) { ws_issue_s(acc, qa, aK + s * kWsTile); };
  float o[64], sv[64];
  uint32_t pa[8][4];
  auto issue_pv = [&](int s) { ws_issue_pv(o, pa, aV + s * kWsTile); };
  auto pack_p = [&]() { ws_pack_p(pa, sv); };
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  float m[2], l[2] = {0.f, 0.f};

  mbar_wait(q_full, 0);
  // Tile 0: the diagonal key tile (keys q0 .. q0 + 127), masked. Every row has its own key here, so the row
  // maxima are finite from the start.
  mbar_wait(k_full(0), 0);
  sched_sync();
  issue_s(sv, 0);
  sched_arrive();
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  release(k_empty(0));
  ws_first_tile_softmax<false>(sv, m, l, q0, row0, g, t, scale_log2);
  pack_p();
  for (int i = 1; i < n_kt; ++i) {
    const int s = i % STAGES, ps = (i - 1) % STAGES;
    mbar_wait(k_full(s), (i / STAGES) & 1);
    sched_sync();
    issue_s(sv, s);
    mbar_wait(v_full(ps), ((i - 1) / STAGES) & 1);
    issue_pv(ps);
    sched_arrive();
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // S done, PV in flight
    release(k_empty(s));
    float alpha[2];
    ws_tile_softmax<false>(sv, m, l, alpha, scale_log2);
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");  // PV of tile i - 1 done
    release(v_empty(ps));
#pragma unroll
    for (int j = 0; j < 64; ++j) o[j] *= alpha[(j >> 1) & 1];
    pack_p();
  }
  {
    const int ps = (n_kt - 1) % STAGES;
    mbar_wait(v_full(ps), ((n_kt - 1) / STAGES) & 1);
    sched_sync();
    issue_pv(ps);
    if (cw == 0) sched_arrive();  // consumer 1's last turn hands over to nobody
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  }

  // Epilogue: O / l as bf16 into this consumer's 64 rows of the Q tile (its own S GEMMs are done; the other
  // consumer reads only its own rows), same swizzled form, then 16-byte coalesced stores.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    l[r] = 1.f / l[r];
  }
#pragma unroll
  for (int i = 0; i < 16; ++i)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int rr = warp * 16 + g + 8 * r;  // row within this consumer's 64
      const uint32_t addr = qa + (i >> 3) * kWsBlock + rr * 128 + (((i & 7) ^ (rr & 7)) << 4) + 4 * t;
      const uint32_t val = pack_bf16(o[4 * i + 2 * r] * l[r], o[4 * i + 2 * r + 1] * l[r]);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(val) : "memory");
    }
  named_bar_sync(3 + cw, 128);
  const int ct = threadIdx.x & 127;
  const size_t out_stride = static_cast<size_t>(Hq) * kD;
#pragma unroll
  for (int it = 0; it < 8; ++it) {
    const int c = ct + 128 * it, rr = c >> 4, ch = c & 15;
    const int row = q0 + cw * 64 + rr;
    uint4 val;
    const uint32_t addr = qa + (ch >> 3) * kWsBlock + rr * 128 + (((ch & 7) ^ (rr & 7)) << 4);
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                 : "r"(addr));
    if (row < len)
      *reinterpret_cast<uint4*>(out + static_cast<size_t>(start + row) * out_stride + h * kD + ch * 8) = val;
  }
}

// Tensor map of `heads` heads of 128 columns at base + row * stride: dims (64 columns, 2 * heads column
// blocks, rows), boxes of 64 columns x box_rows rows, 128-byte swizzle.
Status head_tensor_map(CUtensorMap* map, const bf16* base, int heads, int stride, uint64_t rows, int box_rows = 128) {
  const EncodeTiledFn encode = encode_tiled_fn();
  if (encode == nullptr) return unsupported("prefill_attention: cuTensorMapEncodeTiled is not available");
  const cuuint64_t dims[3] = {64, static_cast<cuuint64_t>(2 * heads), rows};
  const cuuint64_t strides[2] = {128, static_cast<cuuint64_t>(stride) * sizeof(bf16)};
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t estr[3] = {1, 1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<bf16*>(base), dims, strides, box,
                            estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return internal_error("prefill_attention: cuTensorMapEncodeTiled failed (" + std::to_string(static_cast<int>(r)) +
                          ")");
  return Status::ok();
}

template <int STAGES, bool kPingPong>
Status launch_ws(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride, const int32_t* cu_seqlens,
                 int nseq, int max_seqlen, bf16* out, int Hq, int Hkv, float scale, cudaStream_t stream) {
  constexpr size_t smem = ws_smem<STAGES>();
  static const cudaError_t attr = cudaFuncSetAttribute(prefill_attention_ws_kernel<STAGES, kPingPong>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "prefill_attention (warp-specialised) smem attribute"));
  // Rows bound: every sequence ends at or before nseq * max_seqlen; TMA only reads whole tiles inside sequences.
  const uint64_t rows = static_cast<uint64_t>(nseq) * static_cast<uint64_t>(max_seqlen);
  CUtensorMap tq, tk, tv;
  ZEST_RETURN_IF_ERROR(head_tensor_map(&tq, q, Hq, q_stride, rows));
  ZEST_RETURN_IF_ERROR(head_tensor_map(&tk, k, Hkv, kv_stride, rows));
  ZEST_RETURN_IF_ERROR(head_tensor_map(&tv, v, Hkv, kv_stride, rows));
  constexpr float kLog2e = 1.4426950408889634f;
  const dim3 grid(Hq, (max_seqlen + 127) / 128, nseq);
  return launch("prefill_attention", prefill_attention_ws_kernel<STAGES, kPingPong>, grid, dim3(kWsThreads), smem,
                stream, tq, tk, tv, q, q_stride, k, v, kv_stride, cu_seqlens, out, Hq, Hkv, scale * kLog2e);
}

// Persistent form of the warp-specialised kernel (variants 15 and 16): one CTA per SM walks the (query tile, head,
// sequence) items, longest query tiles first, in a snake order (round r of gridDim.x items runs forward when r is
// even, backward when odd, so every CTA gets a similar total length). The K/V ring runs on across items, and the
// output goes through its own shared tile, so the producer loads the next item's Q as soon as the last S GEMM of
// the current one is done and its K/V tiles as soon as stages free up: the next item's loads overlap the current
// item's last PV GEMM and epilogue. STAGES = 2 (Q, O and two K/V stages: 192 KiB). Producer warpgroup at 56
// registers, consumers at 224.
template <bool kPingPong, bool kPack, bool kFast>
__global__ void __launch_bounds__(kWsThreads, 1)
    prefill_attention_wsp_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                                 const __grid_constant__ CUtensorMap tm_v, const bf16* __restrict__ q, int q_stride,
                                 const bf16* __restrict__ k, const bf16* __restrict__ v, int kv_stride,
                                 const int32_t* __restrict__ cu_seqlens, bf16* __restrict__ out, int Hq, int Hkv,
                                 int q_tiles, int nseq, float scale_log2) {
  using namespace vmma;
  constexpr int STAGES = 2;
  pdl_wait();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  const uint32_t aQ = raw + ((1024 - (raw & 1023)) & 1023);
  const uint32_t aO = aQ + kWsTile, aK = aO + kWsTile, aV = aK + STAGES * kWsTile, aBar = aV + STAGES * kWsTile;
  const uint32_t q_full = aBar, q_empty = aBar + 8;
  auto k_full = [&](int s) { return aBar + 8 * (2 + s); };
  auto v_full = [&](int s) { return aBar + 8 * (2 + STAGES + s); };
  auto k_empty = [&](int s) { return aBar + 8 * (2 + 2 * STAGES + s); };
  auto v_empty = [&](int s) { return aBar + 8 * (2 + 3 * STAGES + s); };
  if (threadIdx.x == 0) {
    mbar_init_count(q_full, 1);
    mbar_init_count(q_empty, 8);  // one arrival per consumer warp
    for (int s = 0; s < STAGES; ++s) {
      mbar_init_count(k_full(s), 1);
      mbar_init_count(v_full(s), 1);
      mbar_init_count(k_empty(s), 8);
      mbar_init_count(v_empty(s), 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int wg = threadIdx.x >> 7, lane = threadIdx.x & 31;
  const int G = gridDim.x, b = blockIdx.x;
  // Item of round r for this CTA: false when the round has none; else its head, query tile and sequence.
  // kPack: an item is two query heads of one kv head x 64 query rows (consumer c takes head h + c), so every K/V
  // tile serves both heads; otherwise one head x 128 rows (consumer c takes rows 64c .. 64c + 63).
  constexpr int kRows = kPack ? 64 : 128, kHeadsPer = kPack ? 2 : 1;
  const int head_items = Hq / kHeadsPer;
  const int total = head_items * q_tiles * nseq;
  auto item = [&](int r, int& h, int& qt, int& seq) {
    const int w = r * G + ((r & 1) ? G - 1 - b : b);
    if (w >= total) return false;
    const int per_tile = head_items * nseq;
    qt = q_tiles - 1 - w / per_tile;  // longest query tiles first
    seq = (w % per_tile) / head_items;
    h = (w % head_items) * kHeadsPer;
    return true;
  };
  const int rounds = (total + G - 1) / G;

  if (wg == 0) {  // producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
    // Warp 0 waits for free stages and issues the TMA loads (lane 0); tiles that reach past a sequence end are
    // copied by all four producer warps with cp.async (named barrier 5 brackets each such copy): rows past the
    // end are not read; a V tile's are zeroed (P is 0 there, and 0 * V must stay 0), a Q or K tile's keep stale
    // data (K: those keys are masked; Q: those rows are never written out).
    const int pt = threadIdx.x, pw = pt >> 5;
    uint32_t kit = 0, vit = 0, qi = 0;  // K tiles, V tiles and items loaded so far
    for (int r = 0; r < rounds; ++r) {
      int h, qt, seq;
      if (!item(r, h, qt, seq)) continue;
      const int start = cu_seqlens[seq], len = cu_seqlens[seq + 1] - start, q0 = qt * kRows;
      if (q0 >= len) continue;
      const int kvh = h / (Hq / Hkv), n_kt = q0 / 128 + 1;
      const bool q_partial = q0 + kRows > len, kv_partial = n_kt * 128 > len;
      const bf16* kb = k + static_cast<size_t>(start) * kv_stride + kvh * kD;
      const bf16* vb = v + static_cast<size_t>(start) * kv_stride + kvh * kD;
      const bf16* qb = q + static_cast<size_t>(start) * q_stride + h * kD;
      // cp.async of `rows` rows from row0 into dst by the 128 producer threads, then bar arrives once.
      auto copy_rows = [&](uint32_t dst, const bf16* base, int stride, int row0, int rows, bool zero_rest) {
        for (int i = pt; i < rows * 16; i += 128) {
          const int rr = i >> 4, c = i & 15;
          const uint32_t d = dst + (c >> 3) * kWsBlock + rr * 128 + (((c & 7) ^ (rr & 7)) << 4);
          if (row0 + rr < len) {
            const bf16* src = base + static_cast<size_t>(row0 + rr) * stride + c * 8;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
          } else if (zero_rest) {
            asm volatile("st.shared.v4.b32 [%0], {%1, %1, %1, %1};\n" ::"r"(d), "r"(0) : "memory");
          }
        }
      };
      auto copy_done = [&](uint32_t bar) {
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        named_bar_sync(5, 128);
        if (pt == 0) mbar_arrive(bar);
      };
      // One K or V tile: TMA when whole, else the shared copy.
      auto load = [&](uint32_t dst, uint32_t bar, const CUtensorMap* map, const bf16* base, int row0, bool cp,
                      bool zero_rest) {
        if (cp) {
          named_bar_sync(5, 128);  // warp 0 has seen the stage free
          copy_rows(dst, base, kv_stride, row0, 128, zero_rest);
          copy_done(bar);
        } else if (pt == 0) {
          mbar_arrive_expect_tx(bar, kWsTile);
          tma_tile(dst, map, bar, kvh, start + row0);
        }
      };
      // The Q tile; kPack: 64 rows of heads h and h + 1 into rows 0-63 and 64-127 of the tile.
      auto load_q = [&]() {
        if (q_partial) {
          named_bar_sync(5, 128);
          if constexpr (kPack) {
            copy_rows(aQ, qb, q_stride, q0, 64, false);
            copy_rows(aQ + 64 * 128, qb + kD, q_stride, q0, 64, false);
          } else {
            copy_rows(aQ, qb, q_stride, q0, 128, false);
          }
          copy_done(q_full);
        } else if (pt == 0) {
          mbar_arrive_expect_tx(q_full, kWsTile);
          if constexpr (kPack) {
            tma_tile(aQ, &tm_q, q_full, h, start + q0);
            tma_tile(aQ + 64 * 128, &tm_q, q_full, h + 1, start + q0);
          } else {
            tma_tile(aQ, &tm_q, q_full, h, start + q0);
          }
        }
      };
      auto load_k = [&](int i) {
        const int s = kit % STAGES;
        if (pw == 0 && kit >= STAGES) mbar_wait(k_empty(s), ((kit / STAGES) - 1) & 1);
        load(aK + s * kWsTile, k_full(s), &tm_k, kb, (n_kt - 1 - i) * 128, kv_partial && i == 0, false);
        ++kit;
      };
      auto load_v = [&](int i) {
        const int s = vit % STAGES;
        if (pw == 0 && vit >= STAGES) mbar_wait(v_empty(s), ((vit / STAGES) - 1) & 1);
        load(aV + s * kWsTile, v_full(s), &tm_v, vb, (n_kt - 1 - i) * 128, kv_partial && i == 0, true);
        ++vit;
      };
      if (pw == 0 && qi > 0) mbar_wait(q_empty, (qi - 1) & 1);
      load_q();
      ++qi;
      load_k(0);
      for (int i = 1; i <= n_kt; ++i) {
        if (i < n_kt) load_k(i);
        load_v(i - 1);
      }
    }
    return;
  }

  // Consumers.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
  const int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, g = lane >> 2, t = lane & 3;
  const uint32_t qa = aQ + cw * 64 * 128, oa = aO + cw * 64 * 128;
  auto sched_sync = [&]() { ws_sched_sync<kPingPong>(cw); };
  auto sched_arrive = [&]() { ws_sched_arrive<kPingPong>(cw); };
  auto release = [&](uint32_t bar) { ws_release(bar, lane); };
  auto issue_s = [&](float (&acc)[64], int s) { ws_issue_s(acc, qa, aK + s * kWsTile); };
  float o[64], sv[64];
  uint32_t pa[8][4];
  auto issue_pv = [&](int s) { ws_issue_pv(o, pa, aV + s * kWsTile); };
  auto pack_p = [&]() { ws_pack_p(pa, sv); };
  const size_t out_stride = static_cast<size_t>(Hq) * kD;
  uint32_t kit = 0, vit = 0, qi = 0;
  for (int r = 0; r < rounds; ++r) {
    int h, qt, seq;
    if (!item(r, h, qt, seq)) continue;
    const int start = cu_seqlens[seq], len = cu_seqlens[seq + 1] - start, q0 = qt * kRows;
    if (q0 >= len) continue;
    const int n_kt = q0 / 128 + 1, kdiag = (n_kt - 1) * 128;
    const int rbase = kPack ? q0 : q0 + cw * 64;  // this consumer's first query row
    const int row0 = rbase + warp * 16;
    const int oh = kPack ? h + cw : h;            // this consumer's query head
    if (cw == 1) {
      if constexpr (kPingPong) named_bar_arrive(1, 256);  // consumer 0 goes first
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    float m[2], l[2] = {0.f, 0.f};
    mbar_wait(q_full, qi & 1);
    ++qi;
    {
      const int s = kit % STAGES;
      mbar_wait(k_full(s), (kit / STAGES) & 1);
      sched_sync();
      issue_s(sv, s);
      sched_arrive();
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      release(k_empty(s));
      ++kit;
      if (n_kt == 1) release(q_empty);
      ws_first_tile_softmax<kFast>(sv, m, l, kdiag, row0, g, t, scale_log2);
      pack_p();
    }
    for (int i = 1; i < n_kt; ++i) {
      const int s = kit % STAGES, ps = vit % STAGES;
      mbar_wait(k_full(s), (kit / STAGES) & 1);
      sched_sync();
      issue_s(sv, s);
      mbar_wait(v_full(ps), (vit / STAGES) & 1);
      issue_pv(ps);
      sched_arrive();
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // S done, PV in flight
      release(k_empty(s));
      ++kit;
      if (i == n_kt - 1) release(q_empty);  // last S GEMM of the item: Q may be replaced
      float alpha[2];
      ws_tile_softmax<kFast>(sv, m, l, alpha, scale_log2);
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");  // PV of tile i - 1 done
      release(v_empty(ps));
      ++vit;
      // kFast: the rescale is skipped when no row of the warp changed its maximum.
      if (!kFast || __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int j = 0; j < 64; ++j) o[j] *= alpha[(j >> 1) & 1];
      }
      pack_p();
    }
    {
      const int ps = vit % STAGES;
      mbar_wait(v_full(ps), (vit / STAGES) & 1);
      sched_sync();
      issue_pv(ps);
      if (cw == 0) sched_arrive();  // consumer 1's last turn of the item hands over to nobody
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      release(v_empty(ps));
      ++vit;
    }
    // Epilogue through this consumer's 64 rows of the O tile (the previous item's reads of them are done once
    // every warp of the warpgroup passed the first barrier).
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 1);
      l[rr] += __shfl_xor_sync(0xffffffffu, l[rr], 2);
      l[rr] = 1.f / l[rr];
    }
    named_bar_sync(3 + cw, 128);
#pragma unroll
    for (int i = 0; i < 16; ++i)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const int row = warp * 16 + g + 8 * rr;
        const uint32_t addr = oa + (i >> 3) * kWsBlock + row * 128 + (((i & 7) ^ (row & 7)) << 4) + 4 * t;
        const uint32_t val = pack_bf16(o[4 * i + 2 * rr] * l[rr], o[4 * i + 2 * rr + 1] * l[rr]);
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(val) : "memory");
      }
    named_bar_sync(3 + cw, 128);
    const int ct = threadIdx.x & 127;
#pragma unroll
    for (int it = 0; it < 8; ++it) {
      const int c = ct + 128 * it, rr = c >> 4, ch = c & 15;
      const int row = rbase + rr;
      uint4 val;
      const uint32_t addr = oa + (ch >> 3) * kWsBlock + rr * 128 + (((ch & 7) ^ (rr & 7)) << 4);
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                   : "r"(addr));
      if (row < len)
        *reinterpret_cast<uint4*>(out + static_cast<size_t>(start + row) * out_stride + oh * kD + ch * 8) = val;
    }
  }
}

template <bool kPingPong, bool kPack = false, bool kFast = false>
Status launch_wsp(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride, const int32_t* cu_seqlens,
                  int nseq, int max_seqlen, bf16* out, int Hq, int Hkv, float scale, cudaStream_t stream) {
  constexpr size_t smem = static_cast<size_t>(6) * kWsTile + 1024 + 256;  // Q, O, 2 x K/V, alignment, barriers
  static const cudaError_t attr = cudaFuncSetAttribute(prefill_attention_wsp_kernel<kPingPong, kPack, kFast>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "prefill_attention (persistent) smem attribute"));
  int dev = 0, sms = 0;
  ZEST_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&dev), "cudaGetDevice"));
  ZEST_RETURN_IF_ERROR(
      cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "multiprocessor count"));
  const uint64_t rows = static_cast<uint64_t>(nseq) * static_cast<uint64_t>(max_seqlen);
  CUtensorMap tq, tk, tv;
  constexpr int kRows = kPack ? 64 : 128;
  ZEST_RETURN_IF_ERROR(head_tensor_map(&tq, q, Hq, q_stride, rows, kRows));
  ZEST_RETURN_IF_ERROR(head_tensor_map(&tk, k, Hkv, kv_stride, rows));
  ZEST_RETURN_IF_ERROR(head_tensor_map(&tv, v, Hkv, kv_stride, rows));
  constexpr float kLog2e = 1.4426950408889634f;
  const int q_tiles = (max_seqlen + kRows - 1) / kRows;
  const int64_t items = static_cast<int64_t>(Hq / (kPack ? 2 : 1)) * q_tiles * nseq;
  const int grid = static_cast<int>(std::min<int64_t>(items, sms));
  return launch("prefill_attention", prefill_attention_wsp_kernel<kPingPong, kPack, kFast>, dim3(grid), dim3(kWsThreads), smem,
                stream, tq, tk, tv, q, q_stride, k, v, kv_stride, cu_seqlens, out, Hq, Hkv, q_tiles, nseq,
                scale * kLog2e);
}

Status check_prefill(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride, int nseq,
                     int max_seqlen, const bf16* out, int Hq, int Hkv, int D) {
  if (D != kD) return invalid_argument("prefill_attention: this kernel needs head_dim 128, got " + std::to_string(D));
  if (nseq <= 0 || max_seqlen <= 0 || Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0)
    return invalid_argument("prefill_attention: need nseq, max_seqlen, heads > 0 and Hq divisible by Hkv");
  if (q_stride % 8 != 0 || kv_stride % 8 != 0)
    return invalid_argument("prefill_attention: row strides must be multiples of 8 elements");
  if ((reinterpret_cast<uintptr_t>(q) | reinterpret_cast<uintptr_t>(k) | reinterpret_cast<uintptr_t>(v) |
       reinterpret_cast<uintptr_t>(out)) % 16 != 0)
    return invalid_argument("prefill_attention: q, k, v and out must be 16-byte aligned");
  return Status::ok();
}

template <int W, int MT, int BK>
Status launch_fa(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride, const int32_t* cu_seqlens,
                 int nseq, int max_seqlen, bf16* out, int Hq, int Hkv, float scale, cudaStream_t stream) {
  constexpr size_t smem = fa_smem<W, MT, BK>();
  constexpr int rows = W * 16 * MT;
  static const cudaError_t attr = cudaFuncSetAttribute(prefill_attention_fa_kernel<W, MT, BK>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "prefill_attention smem attribute"));
  constexpr float kLog2e = 1.4426950408889634f;
  const dim3 grid(Hq, (max_seqlen + rows - 1) / rows, nseq);
  return launch("prefill_attention", prefill_attention_fa_kernel<W, MT, BK>, grid, dim3(W * 32), smem, stream, q, q_stride,
                k, v, kv_stride, cu_seqlens, out, Hq, Hkv, scale * kLog2e);
}

int g_prefill_options[static_cast<int>(PrefillOption::kCount)] = {};
// Start values from the environment (A/B runs of whole programs): ZEST_PREFILL_ATTENTION, ZEST_PREFILL_ROPE,
// ZEST_PREFILL_SLOTS, ZEST_PREFILL_GEMM (the expert grouped GEMM).
[[maybe_unused]] const bool g_prefill_env = [] {
  const std::pair<const char*, PrefillOption> vars[] = {{"ZEST_PREFILL_ATTENTION", PrefillOption::kAttention},
                                                        {"ZEST_PREFILL_ROPE", PrefillOption::kRope},
                                                        {"ZEST_PREFILL_SLOTS", PrefillOption::kSlots},
                                                        {"ZEST_PREFILL_GEMM", PrefillOption::kGroupedGemm}};
  for (const auto& [name, opt] : vars)
    if (const char* e = std::getenv(name)) g_prefill_options[static_cast<int>(opt)] = std::atoi(e);
  return true;
}();

}  // namespace

void set_prefill_option(PrefillOption opt, int value) { g_prefill_options[static_cast<int>(opt)] = value; }
int prefill_option(PrefillOption opt) { return g_prefill_options[static_cast<int>(opt)]; }

Status prefill_attention(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride,
                         const int32_t* cu_seqlens, int nseq, int max_seqlen, bf16* out, int Hq, int Hkv, int D,
                         float scale, cudaStream_t stream) {
  if (D != kD)
    return prefill_attention_generic(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, D, scale,
                                     stream);
  ZEST_RETURN_IF_ERROR(check_prefill(q, q_stride, k, v, kv_stride, nseq, max_seqlen, out, Hq, Hkv, D));
  auto run = [&](auto w, auto mt, auto bk) {
    return launch_fa<decltype(w)::value, decltype(mt)::value, decltype(bk)::value>(q, q_stride, k, v, kv_stride, cu_seqlens, nseq,
                                                              max_seqlen, out, Hq, Hkv, scale, stream);
  };
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  using I4 = std::integral_constant<int, 4>;
  using I8 = std::integral_constant<int, 8>;
  using K32 = std::integral_constant<int, 32>;
  using K64 = std::integral_constant<int, 64>;
  int variant = prefill_option(PrefillOption::kAttention);
  // Default: the persistent warp-specialised kernel with ex2.approx exponentials and the skipped O rescale, variant
  // 18 (H200, T = 8192: 698 TFLOP/s against 646 for variant 15 and 430 for variant 9 in the same run; variant 15 at
  // T = 2048: 471 against 323 for variant 9), variant 9 for short sequences, where the fixed cost of a CTA dominates
  // (T = 64: 13 us against 16 us for variant 12).
  // Many short sequences (mixed batches of decode tokens and a chunk) keep variant 9: the persistent kernel's
  // items would be mostly one-tile copies.
  if (variant == 0)
    variant = max_seqlen > kWsMinSeqlen && static_cast<int64_t>(nseq) * 128 <= max_seqlen ? 18 : 9;
  switch (variant) {
    case 1: return run(I8{}, I1{}, K64{});
    case 2: return run(I4{}, I1{}, K64{});
    case 3: return run(I8{}, I2{}, K32{});
    case 4: return run(I4{}, I2{}, K32{});
    case 5: return run(I8{}, I1{}, K32{});
    case 6:
      return launch_wgmma<2, 128>(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, scale,
                                  stream);
    case 8:
      return launch_wgmma_pipe<false>(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, scale,
                                      stream);
    case 10:
      return launch_wgmma_pipe<true, true>(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv,
                                           scale, stream);
    case 11:
      return launch_wgmma_pipe<true, false, true>(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq,
                                                  Hkv, scale, stream);
    case 12:
      return launch_ws<2, true>(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, scale,
                                stream);
    case 13:
      return launch_ws<3, true>(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, scale,
                                stream);
    case 14:
      return launch_ws<2, false>(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, scale,
                                 stream);
    case 15:
      return launch_wsp<true>(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, scale,
                              stream);
    case 16:
      return launch_wsp<false>(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, scale,
                               stream);
    case 17:  // two query heads per item: needs an even number of query heads per kv head
      if ((Hq / Hkv) % 2 != 0)
        return launch_wsp<true>(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, scale,
                                stream);
      return launch_wsp<true, true>(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, scale,
                                    stream);
    case 18:
      return launch_wsp<true, false, true>(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv,
                                           scale, stream);
    case 7:
      return launch_wgmma<1, 64>(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, scale,
                                 stream);
    default:  // 9: 433 TFLOP/s at T = 8192 on H200 (variant 8: 382, 6: 352, mma.sync variant 4: 274)
      return launch_wgmma_pipe<true>(q, q_stride, k, v, kv_stride, cu_seqlens, nseq, max_seqlen, out, Hq, Hkv, scale,
                                     stream);
  }
}

Status prefill_attention_wmma(const bf16* q, int q_stride, const bf16* k, const bf16* v, int kv_stride,
                              const int32_t* cu_seqlens, int nseq, int max_seqlen, bf16* out, int Hq, int Hkv, int D,
                              float scale, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_prefill(q, q_stride, k, v, kv_stride, nseq, max_seqlen, out, Hq, Hkv, D));
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
