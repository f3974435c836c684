// MoE prefill experts: tensor-core grouped GEMMs over the tiles of the device-side plan (MoePlan), gate/up with
// the SiLU*up epilogue, then down with the routing-weight epilogue; and moe_plan_prefill, the plan for many tokens.
//
// CTA = 128 sorted slots of one expert x 128 weight rows. The gate/up CTA takes 64 gate rows and the matching 64
// up rows of one expert, so a thread holds gate and up of the same columns and the SiLU*up epilogue runs in
// registers. The A rows of gate/up are tokens gathered through the plan's sorted slots (one cp.async per 16
// bytes of a row); those of down are the contiguous h rows of the sorted positions. The plan's tiles are
// kMoeTileM (64) slots: the CTA of an even tile (counted from its expert's first) covers it and the next. The
// grid runs the weight-row tiles fastest, so the CTAs of one expert's row tile (and then of its next row tiles)
// run together and share the A rows and the expert's weights in L2. Two kernel families, chosen by
// PrefillOption::kGroupedGemm (kernels.h):
// - wgmma (default): two warpgroups of 64 rows issue wgmma.m64n128k16 on 128-byte swizzled shared-memory
//   stages filled by cp.async (see the section below);
// - mma.sync: 8 warps (4 along the rows x 2 along the weight rows, 32 x 64 each), ldmatrix fragments, a
//   cp.async ring of k-chunks.
//
// The previous kernels (wmma 64x64 tiles, plain loads) stay behind moe_experts_prefill_wmma for comparison
// and serve widths that are multiples of 64 but not of the main kernels' tiles.
#include <mma.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vision_mma.cuh"

namespace zest::cuda {

namespace {

// ---- prefill experts: grouped GEMM over the plan's tiles ------------------------------------------------------

using namespace nvcuda;
constexpr int kGT = 64;       // tile rows (sorted slots), columns and k-chunk
constexpr int kGLd = kGT + 8;  // padded bf16 row
constexpr int kGWarps = 4;

// kGateUp: C = A x [Wg | Wu]^T over H, epilogue h = silu(g) * u at the sorted position.
// else:    C = h x Wd^T over I, epilogue slot_out[slot] = w[slot] * C.
template <bool kGateUp>
__global__ void __launch_bounds__(kGWarps * 32) moe_grouped_gemm_kernel(const bf16* __restrict__ a_src, MoePlan plan,
                                                                        const float* __restrict__ weights,
                                                                        const bf16* __restrict__ w_all,
                                                                        bf16* __restrict__ h, float* __restrict__ slot_out,
                                                                        int K, int H, int I) {
  pdl_wait();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* As = reinterpret_cast<bf16*>(smem_raw);       // [64][kGLd]
  bf16* B0 = As + kGT * kGLd;                          // [64][kGLd]
  bf16* B1 = B0 + kGT * kGLd;                          // [64][kGLd] (up rows, gate/up only)
  float* C = reinterpret_cast<float*>(B1 + kGT * kGLd);  // [64][kGT + 4] x (kGateUp ? 2 : 1)
  constexpr int kCLd = kGT + 4;
  __shared__ int rows_tok[kGT];
  const int tile = blockIdx.x;
  if (tile >= *plan.num_tiles) return;
  const int j = plan.tile_active[tile];
  const int start = plan.tile_start[tile];
  const int rows = min(kGT, plan.offsets[j + 1] - start);
  const int e = plan.active_experts[j];
  const int n0 = blockIdx.y * kGT;
  const int Kdim = kGateUp ? H : I;
  const int Nout = kGateUp ? I : H;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x < kGT) {
    const int r = threadIdx.x;
    rows_tok[r] = r < rows ? (kGateUp ? plan.sorted_slots[start + r] / K : start + r) : -1;
  }
  const bf16* W0 = kGateUp ? w_all + static_cast<size_t>(e) * 2 * I * H + static_cast<size_t>(n0) * H
                           : w_all + static_cast<size_t>(e) * H * I + static_cast<size_t>(n0) * I;
  const bf16* W1 = W0 + static_cast<size_t>(I) * H;
  __syncthreads();

  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc0[4], acc1[4];
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    wmma::fill_fragment(acc0[n], 0.f);
    wmma::fill_fragment(acc1[n], 0.f);
  }
  for (int k0 = 0; k0 < Kdim; k0 += kGT) {
    for (int v = threadIdx.x; v < kGT * kGT / 8; v += blockDim.x) {
      const int r = v / (kGT / 8), c = (v % (kGT / 8)) * 8;
      const int src = rows_tok[r];
      uint4 av = make_uint4(0, 0, 0, 0);
      if (src >= 0) av = *reinterpret_cast<const uint4*>(a_src + static_cast<size_t>(src) * Kdim + k0 + c);
      *reinterpret_cast<uint4*>(As + r * kGLd + c) = av;
      uint4 b0 = make_uint4(0, 0, 0, 0), b1 = make_uint4(0, 0, 0, 0);
      if (n0 + r < Nout) {
        b0 = ld_stream(W0 + static_cast<size_t>(r) * Kdim + k0 + c);
        if (kGateUp) b1 = ld_stream(W1 + static_cast<size_t>(r) * Kdim + k0 + c);
      }
      *reinterpret_cast<uint4*>(B0 + r * kGLd + c) = b0;
      if (kGateUp) *reinterpret_cast<uint4*>(B1 + r * kGLd + c) = b1;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kGT; kk += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> af;
      wmma::load_matrix_sync(af, As + warp * 16 * kGLd + kk, kGLd);
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> bfr;
        wmma::load_matrix_sync(bfr, B0 + n * 16 * kGLd + kk, kGLd);
        wmma::mma_sync(acc0[n], af, bfr, acc0[n]);
        if (kGateUp) {
          wmma::load_matrix_sync(bfr, B1 + n * 16 * kGLd + kk, kGLd);
          wmma::mma_sync(acc1[n], af, bfr, acc1[n]);
        }
      }
    }
    __syncthreads();
  }
  float* C0 = C;
  float* C1 = C + kGT * kCLd;
#pragma unroll
  for (int n = 0; n < 4; ++n) {
    wmma::store_matrix_sync(C0 + warp * 16 * kCLd + n * 16, acc0[n], kCLd, wmma::mem_row_major);
    if (kGateUp) wmma::store_matrix_sync(C1 + warp * 16 * kCLd + n * 16, acc1[n], kCLd, wmma::mem_row_major);
  }
  __syncwarp();
  for (int v = lane; v < 16 * kGT; v += 32) {
    const int r = warp * 16 + v / kGT, c = v % kGT;
    if (r >= rows || n0 + c >= Nout) continue;
    if constexpr (kGateUp) {
      const float g = bf16_round(C0[r * kCLd + c]);
      const float u = bf16_round(C1[r * kCLd + c]);
      const float s = bf16_round(g / (1.f + __expf(-g)));
      h[static_cast<size_t>(start + r) * I + n0 + c] = __float2bfloat16(s * u);
    } else {
      const int slot = plan.sorted_slots[start + r];
      slot_out[static_cast<size_t>(slot) * H + n0 + c] = bf16_round(bf16_round(C0[r * kCLd + c]) * weights[slot]);
    }
  }
}

size_t grouped_smem(bool gate_up) {
  return (3 * kGT * kGLd) * sizeof(bf16) + (gate_up ? 2 : 1) * kGT * (kGT + 4) * sizeof(float);
}


// ---- main grouped GEMM (mma.sync, cp.async ring) ------------------------------------------------------------

constexpr int kMBM = 128;     // sorted slots per CTA (two plan tiles)
constexpr int kMBN = 128;     // weight rows per CTA
constexpr int kMWarps = 8;
constexpr int kMThreads = kMWarps * 32;
static_assert(kMBM % kMoeTileM == 0, "a CTA covers whole plan tiles");
// k-chunk BK (32 or 64) and ring depth; smem rows padded by 8 elements (an odd number of 16-byte units, so
// ldmatrix rows fall on distinct banks).
template <int BK>
constexpr int m_ld() {
  return BK + 8;
}
template <int BK>
constexpr size_t m_stage_elems() {
  return static_cast<size_t>(kMBM + kMBN) * m_ld<BK>();
}
template <int BK, int ST>
constexpr size_t m_smem() {
  return ST * m_stage_elems<BK>() * sizeof(bf16);
}

// kGateUp: C = x[token] x [Wg | Wu]^T over H for 64 intermediate columns; h = silu(g) * u at the sorted position.
// else:    C = h x Wd^T over I for 128 output columns; slot_out[slot] = w[slot] * C.
template <bool kGateUp, int BK, int ST>
__global__ void __launch_bounds__(kMThreads, 2)
    moe_grouped_mma_kernel(const bf16* __restrict__ a_src, MoePlan plan, const float* __restrict__ weights,
                           const bf16* __restrict__ w_all, bf16* __restrict__ h, float* __restrict__ slot_out, int K,
                           int H, int I) {
  using namespace vmma;
  constexpr int kMBK = BK, kMStages = ST, kMLd = m_ld<BK>();
  constexpr size_t kMStageElems = m_stage_elems<BK>();
  constexpr int kCh = BK / 8;               // 16-byte chunks per smem row
  constexpr int kRowsPass = kMThreads / kCh;  // rows one pass of the CTA copies
  constexpr int kPasses = kMBM / kRowsPass;
  pdl_wait();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);
  __shared__ int a_row[kMBM];
  const int Kdim = kGateUp ? H : I;
  const int nk = Kdim / kMBK;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int wm = warp & 3, wn = warp >> 2;
  const int num_tiles = *plan.num_tiles;
  for (int tile = blockIdx.y; tile < num_tiles; tile += gridDim.y) {
    const int j = plan.tile_active[tile];
    const int start = plan.tile_start[tile];
    const int beg = plan.offsets[j], end = plan.offsets[j + 1];
    if (((start - beg) / kMoeTileM) % (kMBM / kMoeTileM) != 0) continue;  // covered by an earlier tile's CTA
    const int rows = min(kMBM, end - start);
    const int e = plan.active_experts[j];
    __syncthreads();  // a_row and the ring of the previous tile are no longer read
    if (threadIdx.x < kMBM) {
      const int r = threadIdx.x;
      a_row[r] = r < rows ? (kGateUp ? plan.sorted_slots[start + r] / K : start + r) : -1;
    }
    __syncthreads();

    // Each thread copies 16 bytes (chunk lc) of kPasses A rows and kPasses B rows per stage.
    const int lr = threadIdx.x / kCh, lc = threadIdx.x % kCh;
    const bf16* a_ptr[kPasses];
    bool a_ok[kPasses];
    const bf16* b_ptr[kPasses];
#pragma unroll
    for (int u = 0; u < kPasses; ++u) {
      const int r = lr + u * kRowsPass;
      const int src = a_row[r];
      a_ok[u] = src >= 0;
      a_ptr[u] = a_src + static_cast<size_t>(src >= 0 ? src : 0) * Kdim + lc * 8;
      size_t wrow;
      if constexpr (kGateUp) {
        const int n0 = blockIdx.x * (kMBN / 2);
        wrow = static_cast<size_t>(e) * 2 * I + (r < 64 ? n0 + r : I + n0 + r - 64);
      } else {
        wrow = static_cast<size_t>(e) * H + blockIdx.x * kMBN + r;
      }
      b_ptr[u] = w_all + wrow * Kdim + lc * 8;
    }
    auto load_stage = [&](int stage, int kc) {
      bf16* sA = smem + stage * kMStageElems;
      bf16* sB = sA + kMBM * kMLd;
      const int k0 = kc * kMBK;
#pragma unroll
      for (int u = 0; u < kPasses; ++u) {
        const int r = lr + u * kRowsPass;
        cp_async16(sA + r * kMLd + lc * 8, a_ptr[u] + k0, a_ok[u]);
        cp_async16(sB + r * kMLd + lc * 8, b_ptr[u] + k0, true);
      }
    };

    float acc[2][8][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.f;

#pragma unroll
    for (int s = 0; s < kMStages - 1; ++s) {
      if (s < nk) load_stage(s, s);
      cp_async_commit();
    }
    // B row of n-tile nt (pairs 2p, 2p+1 are adjacent): gate/up: 32 gate rows then the same 32 up rows.
    auto brow = [&](int nt) {
      if constexpr (kGateUp) return nt < 4 ? 32 * wn + 8 * nt : 64 + 32 * wn + 8 * (nt - 4);
      else return 64 * wn + 8 * nt;
    };
    for (int kt = 0; kt < nk; ++kt) {
      cp_async_wait<kMStages - 2>();
      __syncthreads();
      if (kt + kMStages - 1 < nk) load_stage((kt + kMStages - 1) % kMStages, kt + kMStages - 1);
      cp_async_commit();
      const bf16* sA = smem + (kt % kMStages) * kMStageElems;
      const bf16* sB = sA + kMBM * kMLd;
      if (32 * wm >= rows) continue;  // this warp's rows are all past the expert's last slot
#pragma unroll
      for (int kk = 0; kk < kMBK / 16; ++kk) {
        uint32_t af[2][4];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
          ldsm_x4(af[mt], sA + (32 * wm + 16 * mt + (lane & 15)) * kMLd + kk * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          uint32_t b[4];
          ldsm_x4(b, sB + (brow(2 * p) + (lane >> 4) * 8 + (lane & 7)) * kMLd + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma16816(acc[mt][2 * p], af[mt], b[0], b[1]);
            mma16816(acc[mt][2 * p + 1], af[mt], b[2], b[3]);
          }
        }
      }
    }
    cp_async_wait<0>();

#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = 32 * wm + 16 * mt + g + hr * 8;
        if (r >= rows) continue;
        if constexpr (kGateUp) {
          bf16* hrow = h + static_cast<size_t>(start + r) * I + blockIdx.x * (kMBN / 2) + 32 * wn + 2 * t;
#pragma unroll
          for (int nt = 0; nt < 4; ++nt) {
            float hv[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const float gv = bf16_round(acc[mt][nt][hr * 2 + c]);
              const float uv = bf16_round(acc[mt][nt + 4][hr * 2 + c]);
              hv[c] = bf16_round(gv / (1.f + __expf(-gv))) * uv;
            }
            *reinterpret_cast<__nv_bfloat162*>(hrow + 8 * nt) = __floats2bfloat162_rn(hv[0], hv[1]);
          }
        } else {
          const int slot = plan.sorted_slots[start + r];
          const float wt = weights[slot];
          float* orow = slot_out + static_cast<size_t>(slot) * H + blockIdx.x * kMBN + 64 * wn + 2 * t;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt)
            *reinterpret_cast<float2*>(orow + 8 * nt) =
                make_float2(bf16_round(bf16_round(acc[mt][nt][hr * 2]) * wt),
                            bf16_round(bf16_round(acc[mt][nt][hr * 2 + 1]) * wt));
        }
      }
  }
}

// Variant 2 of PrefillOption::kGroupedGemm: k-chunks of 64 in a 3-stage ring; otherwise 32 in a 4-stage ring.
bool mma_shapes_ok(int H, int I) { return H % kMBN == 0 && I % (kMBN / 2) == 0; }

template <bool kGateUp, int BK, int ST>
Status launch_grouped(const bf16* a, const MoePlan& plan, const float* weights, const bf16* w, bf16* h,
                      float* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream) {
  constexpr size_t smem = m_smem<BK, ST>();
  static const cudaError_t attr = cudaFuncSetAttribute(moe_grouped_mma_kernel<kGateUp, BK, ST>,
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "moe grouped GEMM smem attribute"));
  const int n_tiles = kGateUp ? I / (kMBN / 2) : H / kMBN;
  return launch(kGateUp ? "moe_prefill_gate_up" : "moe_prefill_down", moe_grouped_mma_kernel<kGateUp, BK, ST>,
                dim3(n_tiles, std::min(moe_max_tiles(N, K, E), 65535)), dim3(kMThreads), smem, stream, a, plan, weights,
                w, h, slot_out, K, H, I);
}


// ---- grouped GEMM on wgmma (variant 3) ---------------------------------------------------------------------
//
// CTA = 2 warpgroups over 128 sorted slots (64 each) x 128 weight rows, k-chunks of 64 (one 128-byte swizzled
// row per operand row) through a 3-stage cp.async ring; each warpgroup issues wgmma.m64n128k16 with both
// operands in shared memory (K-major, 128-byte swizzle: the 16-byte chunk c of row r is stored at chunk
// c ^ (r % 8), matrix descriptors with 1024-byte 8-row groups). The accumulator fragment of a warp has the
// mma.sync m16n8 layout per 8 columns, so the epilogues are those of the mma.sync kernels.

// ST stages; kOverlap keeps one wgmma group in flight while the next stage's wgmma is issued (prefetch distance
// ST - 2), otherwise each stage's wgmma is waited for before the next (prefetch distance ST - 1).
// BM sorted slots per CTA (BM / 64 warpgroups: 128, or 64 for one plan tile per CTA) and BN weight rows (128:
// m64n128k16; 256: m64n256k16, gate/up then covers 128 intermediate columns).
constexpr int kWBK = 64;
template <int BM, int BN>
constexpr size_t w_stage_bytes() {
  return static_cast<size_t>(BM + BN) * kWBK * sizeof(bf16);
}
template <int BM, int BN, int ST>
constexpr size_t w_smem() {
  return ST * w_stage_bytes<BM, BN>() + 1024;  // + alignment slack
}
template <int BM, int BN, int ST>
constexpr int w_ctas_per_sm() {
  return BM == 64 ? 3 : (ST <= 3 && BN == 128 ? 2 : 1);
}

__device__ __forceinline__ uint64_t wgmma_desc(const void* smem) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint64_t d = (a >> 4) & 0x3FFF;
  d |= static_cast<uint64_t>(1) << 16;             // leading byte offset (unused with 128-byte swizzle)
  d |= static_cast<uint64_t>(1024 >> 4) << 32;     // stride byte offset: next 8-row group
  d |= static_cast<uint64_t>(1) << 62;             // 128-byte swizzle
  return d;
}

__device__ __forceinline__ void wgmma_m64n128k16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 1, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b));
}

__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b));
}

template <int BN>
__device__ __forceinline__ void wgmma_n(float (&d)[BN / 2], uint64_t desc_a, uint64_t desc_b) {
  if constexpr (BN == 128)
    wgmma_m64n128k16(d, desc_a, desc_b);
  else
    wgmma_m64n256k16(d, desc_a, desc_b);
}

template <bool kGateUp, int BM, int BN, int kWStages, bool kOverlap>
__global__ void __launch_bounds__(BM * 2, w_ctas_per_sm<BM, BN, kWStages>())
    moe_grouped_wgmma_kernel(const bf16* __restrict__ a_src, MoePlan plan, const float* __restrict__ weights,
                             const bf16* __restrict__ w_all, bf16* __restrict__ h, float* __restrict__ slot_out, int K,
                             int H, int I) {
  using namespace vmma;
  pdl_wait();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // Stages start on a 1024-byte boundary (the swizzle pattern repeats every 8 rows of 128 bytes).
  unsigned char* smem = smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  constexpr int kThreads = BM * 2, kRowsPass = kThreads / 8;  // rows one pass of 16-byte copies covers
  __shared__ int a_row[BM];
  const int Kdim = kGateUp ? H : I;
  const int nk = Kdim / kWBK;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2, wq = warp & 3;  // warpgroup, warp inside it
  const int num_tiles = *plan.num_tiles;
  for (int tile = blockIdx.y; tile < num_tiles; tile += gridDim.y) {
    const int j = plan.tile_active[tile];
    const int start = plan.tile_start[tile];
    const int beg = plan.offsets[j], end = plan.offsets[j + 1];
    if (((start - beg) / kMoeTileM) % (BM / kMoeTileM) != 0) continue;  // covered by an earlier tile's CTA
    const int rows = min(BM, end - start);
    const int e = plan.active_experts[j];
    __syncthreads();
    if (threadIdx.x < BM) {
      const int r = threadIdx.x;
      a_row[r] = r < rows ? (kGateUp ? plan.sorted_slots[start + r] / K : start + r) : -1;
    }
    __syncthreads();

    // Thread copies chunk lc of rows lr + kRowsPass * u of A (u < 4) and B (u < BN / kRowsPass); its swizzled
    // chunk is lc ^ (lr % 8).
    const int lr = threadIdx.x >> 3, lc = threadIdx.x & 7;
    const int sw = (lc ^ (lr & 7)) * 8;
    const bf16* a_ptr[4];
    bool a_ok[4];
    const bf16* b_ptr[BN / kRowsPass];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int src = a_row[lr + u * kRowsPass];
      a_ok[u] = src >= 0;
      a_ptr[u] = a_src + static_cast<size_t>(src >= 0 ? src : 0) * Kdim + lc * 8;
    }
#pragma unroll
    for (int u = 0; u < BN / kRowsPass; ++u) {
      const int r = lr + u * kRowsPass;
      size_t wrow;
      if constexpr (kGateUp) {
        const int n0 = blockIdx.x * (BN / 2);
        wrow = static_cast<size_t>(e) * 2 * I + (r < BN / 2 ? n0 + r : I + n0 + r - BN / 2);
      } else {
        wrow = static_cast<size_t>(e) * H + blockIdx.x * BN + r;
      }
      b_ptr[u] = w_all + wrow * Kdim + lc * 8;
    }
    constexpr size_t kWStageBytes = w_stage_bytes<BM, BN>();
    auto load_stage = [&](int stage, int kc) {
      bf16* sA = reinterpret_cast<bf16*>(smem + stage * kWStageBytes);
      bf16* sB = sA + BM * kWBK;
      const int k0 = kc * kWBK;
#pragma unroll
      for (int u = 0; u < 4; ++u) cp_async16(sA + (lr + u * kRowsPass) * kWBK + sw, a_ptr[u] + k0, a_ok[u]);
#pragma unroll
      for (int u = 0; u < BN / kRowsPass; ++u)
        cp_async16(sB + (lr + u * kRowsPass) * kWBK + sw, b_ptr[u] + k0, true);
    };

    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
    constexpr int kDist = kOverlap ? kWStages - 2 : kWStages - 1;  // stages loaded ahead
#pragma unroll
    for (int s = 0; s < kDist; ++s) {
      if (s < nk) load_stage(s, s);
      cp_async_commit();
    }
    for (int kt = 0; kt < nk; ++kt) {
      cp_async_wait<kDist - 1>();
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async writes -> wgmma reads
      // Also: every warpgroup's wgmma of stage kt - kDist (kt - 1 without overlap) has completed, so that stage
      // can be refilled.
      __syncthreads();
      if (kt + kDist < nk) load_stage((kt + kDist) % kWStages, kt + kDist);
      cp_async_commit();
      const unsigned char* st = smem + (kt % kWStages) * kWStageBytes;
      const unsigned char* sA = st + wg * 64 * kWBK * sizeof(bf16);
      const unsigned char* sB = st + BM * kWBK * sizeof(bf16);
      if (64 * wg >= rows) continue;  // the warpgroup's rows are all past the expert's last slot
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < kWBK / 16; ++kk) wgmma_n<BN>(acc, wgmma_desc(sA + kk * 32), wgmma_desc(sB + kk * 32));
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      if constexpr (kOverlap)
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
      else
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    cp_async_wait<0>();

    // acc[4 * i + 2 * hr + c]: row 16 * wq + g + 8 * hr of this warpgroup, column 8 * i + 2 * t + c.
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int r = wg * 64 + 16 * wq + g + hr * 8;
      if (r >= rows) continue;
      if constexpr (kGateUp) {
        bf16* hrow = h + static_cast<size_t>(start + r) * I + blockIdx.x * (BN / 2) + 2 * t;
#pragma unroll
        for (int i = 0; i < BN / 16; ++i) {
          float hv[2];
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const float gv = bf16_round(acc[4 * i + 2 * hr + c]);
            const float uv = bf16_round(acc[4 * (i + BN / 16) + 2 * hr + c]);
            hv[c] = bf16_round(gv / (1.f + __expf(-gv))) * uv;
          }
          *reinterpret_cast<__nv_bfloat162*>(hrow + 8 * i) = __floats2bfloat162_rn(hv[0], hv[1]);
        }
      } else {
        const int slot = plan.sorted_slots[start + r];
        const float wt = weights[slot];
        float* orow = slot_out + static_cast<size_t>(slot) * H + blockIdx.x * BN + 2 * t;
#pragma unroll
        for (int i = 0; i < BN / 8; ++i)
          *reinterpret_cast<float2*>(orow + 8 * i) = make_float2(bf16_round(bf16_round(acc[4 * i + 2 * hr]) * wt),
                                                                 bf16_round(bf16_round(acc[4 * i + 2 * hr + 1]) * wt));
      }
    }
  }
}

template <bool kGateUp, int BM, int BN, int ST, bool kOverlap>
Status launch_grouped_wgmma(const bf16* a, const MoePlan& plan, const float* weights, const bf16* w, bf16* h,
                            float* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream) {
  if (BN == 256 && (I % 128 != 0 || H % 256 != 0))  // the 256-row tiles do not divide the widths: 128-row tiles
    return launch_grouped_wgmma<kGateUp, BM, 128, 3, false>(a, plan, weights, w, h, slot_out, N, K, E, H, I, stream);
  constexpr size_t kWSmem = w_smem<BM, BN, ST>();
  auto* kernel = moe_grouped_wgmma_kernel<kGateUp, BM, BN, ST, kOverlap>;
  static const cudaError_t attr =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kWSmem));
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "moe grouped GEMM (wgmma) smem attribute"));
  const int n_tiles = kGateUp ? I / (BN / 2) : H / BN;
  return launch(kGateUp ? "moe_prefill_gate_up" : "moe_prefill_down", kernel,
                dim3(n_tiles, std::min(moe_max_tiles(N, K, E), 65535)), dim3(BM * 2), kWSmem, stream, a, plan,
                weights, w, h, slot_out, K, H, I);
}


// ---- plan for many tokens -------------------------------------------------------------------------------------
//
// One CTA of 32 warps; warp w owns the contiguous slot range [w * per, (w + 1) * per). Pass 1 counts each warp's
// slots per expert (shared-memory atomics); a scan over (warp, expert) gives every warp the first position of its
// slots of each expert; pass 2 places each warp's slots in slot order (ranks inside a 32-slot group from
// __match_any_sync). The ids are read twice in all, instead of once per expert.
constexpr int kPlanWarps = 32;
constexpr int kPlanMaxExperts = 256;

__global__ void __launch_bounds__(kPlanWarps * 32) moe_plan_prefill_kernel(const int32_t* __restrict__ ids, int NK,
                                                                           int E, MoePlan plan,
                                                                           int64_t* active_count_sum) {
  pdl_wait();
  extern __shared__ int cnt[];  // [kPlanWarps][E]: counts, then each warp's next position per expert
  __shared__ int total[kPlanMaxExperts];
  __shared__ int first[kPlanMaxExperts];  // sorted position of each expert's first slot
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int i = threadIdx.x; i < kPlanWarps * E; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  const int per = ((NK + kPlanWarps - 1) / kPlanWarps + 31) / 32 * 32;
  const int beg = min(NK, warp * per), end = min(NK, beg + per);
  for (int i = beg + lane; i < end; i += 32) {
    const int id = __ldg(ids + i);
    if (id >= 0 && id < E) atomicAdd(&cnt[warp * E + id], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {  // exclusive prefix over warps
    int sum = 0;
    for (int w = 0; w < kPlanWarps; ++w) {
      const int c = cnt[w * E + e];
      cnt[w * E + e] = sum;
      sum += c;
    }
    total[e] = sum;
  }
  __syncthreads();
  if (warp == 0) moe_plan_scan_warp(total, E, plan, first, active_count_sum);
  __syncthreads();
  int* next = cnt + warp * E;
  for (int e = lane; e < E; e += 32) next[e] += first[e];
  __syncwarp();
  for (int i0 = beg; i0 < end; i0 += 32) {
    const int i = i0 + lane;
    int id = i < end ? __ldg(ids + i) : -1;
    if (id >= E) id = -1;
    const unsigned same = __match_any_sync(0xffffffffu, id);
    const int rank = __popc(same & ((1u << lane) - 1));
    if (id >= 0) plan.sorted_slots[next[id] + rank] = i;
    __syncwarp();
    if (id >= 0 && rank == 0) next[id] += __popc(same);
    __syncwarp();
  }
}

Status check_grouped(int N, int K, int E, int H, int I) {
  if (N <= 0 || K <= 0 || E <= 0 || E > 1024 || K > E || H <= 0 || I <= 0 || H % 8 != 0 || I % 8 != 0)
    return invalid_argument("moe_experts_prefill: need N, K > 0, K <= E <= 1024 and H, I positive multiples of 8 (N=" +
                            std::to_string(N) + " K=" + std::to_string(K) + " E=" + std::to_string(E) +
                            " H=" + std::to_string(H) + " I=" + std::to_string(I) + ")");
  return Status::ok();
}

Status set_smem(const void* kernel, size_t smem) {
  if (smem <= 48 * 1024) return Status::ok();
  return cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                     "cudaFuncSetAttribute");
}

}  // namespace

Status moe_plan_prefill(const int32_t* ids, int N, int K, int E, MoePlan& plan, int64_t* active_count_sum,
                        cudaStream_t stream) {
  if (E > kPlanMaxExperts) return moe_plan(ids, N, K, E, plan, active_count_sum, stream);
  if (N <= 0 || K <= 0 || E <= 0 || K > E)
    return invalid_argument("moe_plan_prefill: need N, K, E > 0 and K <= E (N=" + std::to_string(N) +
                            " K=" + std::to_string(K) + " E=" + std::to_string(E) + ")");
  if (N > plan.max_tokens || K != plan.top_k || E != plan.experts)
    return invalid_argument("moe_plan_prefill: the plan was bound for other sizes (max_tokens " +
                            std::to_string(plan.max_tokens) + ", top_k " + std::to_string(plan.top_k) + ", experts " +
                            std::to_string(plan.experts) + ")");
  const size_t smem = static_cast<size_t>(kPlanWarps) * E * sizeof(int);
  return launch("moe_plan_prefill", moe_plan_prefill_kernel, dim3(1), dim3(kPlanWarps * 32), smem, stream, ids, N * K,
                E, plan, active_count_sum);
}

Status moe_prefill_gate_up(const bf16* x, const MoePlan& plan, const bf16* gate_up, bf16* h, int N, int K, int E,
                           int H, int I, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_grouped(N, K, E, H, I));
  if (!mma_shapes_ok(H, I))
    return invalid_argument("moe_prefill_gate_up: needs H % 128 == 0 and I % 64 == 0 (H=" + std::to_string(H) +
                            " I=" + std::to_string(I) + ")");
  auto run = [&](auto fn) { return fn(x, plan, nullptr, gate_up, h, nullptr, N, K, E, H, I, stream); };
  switch (prefill_option(PrefillOption::kGroupedGemm)) {
    case 1: return run(launch_grouped<true, 32, 4>);
    case 2: return run(launch_grouped<true, 64, 3>);
    case 4: return run(launch_grouped_wgmma<true, 128, 128, 4, true>);
    case 5: return run(launch_grouped_wgmma<true, 128, 128, 3, true>);
    case 6: return run(launch_grouped_wgmma<true, 128, 256, 3, false>);
    case 7: return run(launch_grouped_wgmma<true, 128, 256, 4, true>);
    case 8: return run(launch_grouped_wgmma<true, 64, 128, 3, false>);
    case 9: return run(launch_grouped_wgmma<true, 64, 128, 4, true>);
    case 10: return run(launch_grouped_wgmma<true, 64, 128, 3, true>);
    default: return run(launch_grouped_wgmma<true, 128, 128, 3, false>);  // 0 and 3: the fastest on H200
  }
}

Status moe_prefill_down(const bf16* h, const MoePlan& plan, const float* weights, const bf16* down, float* slot_out,
                        int N, int K, int E, int H, int I, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_grouped(N, K, E, H, I));
  if (!mma_shapes_ok(H, I))
    return invalid_argument("moe_prefill_down: needs H % 128 == 0 and I % 64 == 0 (H=" + std::to_string(H) +
                            " I=" + std::to_string(I) + ")");
  auto run = [&](auto fn) { return fn(h, plan, weights, down, nullptr, slot_out, N, K, E, H, I, stream); };
  switch (prefill_option(PrefillOption::kGroupedGemm)) {
    case 1: return run(launch_grouped<false, 32, 4>);
    case 2: return run(launch_grouped<false, 64, 3>);
    case 4: return run(launch_grouped_wgmma<false, 128, 128, 4, true>);
    case 5: return run(launch_grouped_wgmma<false, 128, 128, 3, true>);
    case 6: return run(launch_grouped_wgmma<false, 128, 256, 3, false>);
    case 7: return run(launch_grouped_wgmma<false, 128, 256, 4, true>);
    case 8: return run(launch_grouped_wgmma<false, 64, 128, 3, false>);
    case 9: return run(launch_grouped_wgmma<false, 64, 128, 4, true>);
    case 10: return run(launch_grouped_wgmma<false, 64, 128, 3, true>);
    default: return run(launch_grouped_wgmma<false, 128, 128, 3, false>);  // 0 and 3: the fastest on H200
  }
}

Status moe_experts_prefill(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up,
                           const bf16* down, bf16* h, float* slot_out, int N, int K, int E, int H, int I,
                           cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_grouped(N, K, E, H, I));
  if (mma_shapes_ok(H, I)) {
    ZEST_RETURN_IF_ERROR(moe_prefill_gate_up(x, plan, gate_up, h, N, K, E, H, I, stream));
    return moe_prefill_down(h, plan, weights, down, slot_out, N, K, E, H, I, stream);
  }
  return moe_experts_prefill_wmma(x, plan, weights, gate_up, down, h, slot_out, N, K, E, H, I, stream);
}

Status moe_experts_prefill_wmma(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up,
                                const bf16* down, bf16* h, float* slot_out, int N, int K, int E, int H, int I,
                                cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_grouped(N, K, E, H, I));
  if (H % kGT != 0 || I % kGT != 0)
    return moe_experts_decode(x, plan, weights, gate_up, down, h, slot_out, N, K, E, H, I, stream);
  static bool configured = false;
  if (!configured) {
    ZEST_RETURN_IF_ERROR(set_smem(reinterpret_cast<const void*>(moe_grouped_gemm_kernel<true>), grouped_smem(true)));
    ZEST_RETURN_IF_ERROR(set_smem(reinterpret_cast<const void*>(moe_grouped_gemm_kernel<false>), grouped_smem(false)));
    configured = true;
  }
  const int tiles = moe_max_tiles(N, K, E);
  ZEST_RETURN_IF_ERROR(launch("moe_gate_up_prefill", moe_grouped_gemm_kernel<true>, dim3(tiles, I / kGT),
                              dim3(kGWarps * 32), grouped_smem(true), stream, x, plan, weights, gate_up, h, slot_out, K,
                              H, I));
  return launch("moe_down_prefill", moe_grouped_gemm_kernel<false>, dim3(tiles, H / kGT), dim3(kGWarps * 32),
                grouped_smem(false), stream, static_cast<const bf16*>(h), plan, weights, down, h, slot_out, K, H, I);
}

}  // namespace zest::cuda
