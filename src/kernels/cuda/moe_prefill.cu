// MoE prefill experts: tensor-core grouped GEMMs over the tiles of the device-side plan (MoePlan), gate/up with
// the SiLU*up epilogue, then down with the routing-weight epilogue; and moe_plan_prefill, the plan for many tokens.
//
// moe_prefill_gate_up / moe_prefill_down run the warp-specialised persistent kernels (see their section below):
// work tiles of 128 sorted slots of one expert x 256 weight rows, a TMA/cp.async producer warpgroup and two wgmma
// consumer warpgroups synchronised by mbarriers. Sizes or operands those do not take (I % 128, H % 256, E > 256,
// operands not 16-byte aligned) run the wgmma kernel: CTA = 128 sorted slots x 128 weight rows, cp.async stages
// filled by all threads. The gate/up CTA takes gate rows and the matching up rows of one expert, so a thread holds
// gate and up of the same columns and the SiLU*up epilogue runs in registers. The A rows of gate/up are tokens
// gathered through the plan's sorted slots; those of down are the contiguous h rows of the sorted positions.
//
// moe_experts_prefill_wmma (wmma 64x64 tiles, plain loads) serves widths that are multiples of 64 but not of the
// main kernels' tiles.
#include <cuda.h>
#include <mma.h>

#include <algorithm>
#include <string>
#include <type_traits>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vision_mma.cuh"

namespace zest::cuda {

namespace {

// The SwiGLU value of gate/up's epilogue from the fp32 accumulators of a gate and an up column: g and u rounded to
// bf16 first, silu(g) rounded to bf16, times u (the caller rounds the product when it stores it).
__device__ __forceinline__ float swiglu_acc(float g_acc, float u_acc) {
  const float gv = bf16_round(g_acc), uv = bf16_round(u_acc);
  return bf16_round(gv / (1.f + __expf(-gv))) * uv;
}

// ---- wmma grouped GEMM (moe_experts_prefill_wmma) --------------------------------------------------------------
//
// CTA = one 64-slot plan tile x 64 weight rows, plain loads into shared memory.

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

// The widths moe_prefill_gate_up and moe_prefill_down take.
bool mma_shapes_ok(int H, int I) { return H % 128 == 0 && I % 64 == 0; }

// ---- grouped GEMM on wgmma ---------------------------------------------------------------------------------
//
// CTA = 2 warpgroups over 128 sorted slots (64 each) x 128 weight rows, k-chunks of 64 (one 128-byte swizzled
// row per operand row) through a 3-stage cp.async ring, each stage's wgmma waited for before the next; each
// warpgroup issues wgmma.m64n128k16 with both operands in shared memory (K-major, 128-byte swizzle: the 16-byte
// chunk c of row r is stored at chunk c ^ (r % 8), matrix descriptors with 1024-byte 8-row groups). The
// accumulator fragment of a warp has the mma.sync m16n8 layout per 8 columns.
constexpr int kWBK = 64;
constexpr int kWBM = 128;     // sorted slots per CTA (two plan tiles)
constexpr int kWBN = 128;     // weight rows per CTA
constexpr int kWStages = 3;
constexpr size_t kWStageBytes = static_cast<size_t>(kWBM + kWBN) * kWBK * sizeof(bf16);
constexpr size_t kWSmem = kWStages * kWStageBytes + 1024;  // + alignment slack
static_assert(kWBM % kMoeTileM == 0, "a CTA covers whole plan tiles");

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

template <bool kGateUp>
__global__ void __launch_bounds__(kWBM * 2, 2)
    moe_grouped_wgmma_kernel(const bf16* __restrict__ a_src, MoePlan plan, const float* __restrict__ weights,
                             const bf16* __restrict__ w_all, bf16* __restrict__ h, float* __restrict__ slot_out, int K,
                             int H, int I) {
  using namespace vmma;
  pdl_wait();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  // Stages start on a 1024-byte boundary (the swizzle pattern repeats every 8 rows of 128 bytes).
  unsigned char* smem = smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  constexpr int kThreads = kWBM * 2, kRowsPass = kThreads / 8;  // rows one pass of 16-byte copies covers
  __shared__ int a_row[kWBM];
  const int Kdim = kGateUp ? H : I;
  const int nk = Kdim / kWBK;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int wg = warp >> 2, wq = warp & 3;  // warpgroup, warp inside it
  const int num_tiles = *plan.num_tiles;
  for (int tile = blockIdx.y; tile < num_tiles; tile += gridDim.y) {
    const int j = plan.tile_active[tile];
    const int start = plan.tile_start[tile];
    const int beg = plan.offsets[j], end = plan.offsets[j + 1];
    if (((start - beg) / kMoeTileM) % (kWBM / kMoeTileM) != 0) continue;  // covered by an earlier tile's CTA
    const int rows = min(kWBM, end - start);
    const int e = plan.active_experts[j];
    __syncthreads();
    if (threadIdx.x < kWBM) {
      const int r = threadIdx.x;
      a_row[r] = r < rows ? (kGateUp ? plan.sorted_slots[start + r] / K : start + r) : -1;
    }
    __syncthreads();

    // Thread copies chunk lc of rows lr + kRowsPass * u of A (u < 4) and B (u < kWBN / kRowsPass); its swizzled
    // chunk is lc ^ (lr % 8).
    const int lr = threadIdx.x >> 3, lc = threadIdx.x & 7;
    const int sw = (lc ^ (lr & 7)) * 8;
    const bf16* a_ptr[4];
    bool a_ok[4];
    const bf16* b_ptr[kWBN / kRowsPass];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int src = a_row[lr + u * kRowsPass];
      a_ok[u] = src >= 0;
      a_ptr[u] = a_src + static_cast<size_t>(src >= 0 ? src : 0) * Kdim + lc * 8;
    }
#pragma unroll
    for (int u = 0; u < kWBN / kRowsPass; ++u) {
      const int r = lr + u * kRowsPass;
      size_t wrow;
      if constexpr (kGateUp) {
        const int n0 = blockIdx.x * (kWBN / 2);
        wrow = static_cast<size_t>(e) * 2 * I + (r < kWBN / 2 ? n0 + r : I + n0 + r - kWBN / 2);
      } else {
        wrow = static_cast<size_t>(e) * H + blockIdx.x * kWBN + r;
      }
      b_ptr[u] = w_all + wrow * Kdim + lc * 8;
    }
    auto load_stage = [&](int stage, int kc) {
      bf16* sA = reinterpret_cast<bf16*>(smem + stage * kWStageBytes);
      bf16* sB = sA + kWBM * kWBK;
      const int k0 = kc * kWBK;
#pragma unroll
      for (int u = 0; u < 4; ++u) cp_async16(sA + (lr + u * kRowsPass) * kWBK + sw, a_ptr[u] + k0, a_ok[u]);
#pragma unroll
      for (int u = 0; u < kWBN / kRowsPass; ++u)
        cp_async16(sB + (lr + u * kRowsPass) * kWBK + sw, b_ptr[u] + k0, true);
    };

    float acc[kWBN / 2];
#pragma unroll
    for (int i = 0; i < kWBN / 2; ++i) acc[i] = 0.f;
    constexpr int kDist = kWStages - 1;  // stages loaded ahead
#pragma unroll
    for (int s = 0; s < kDist; ++s) {
      if (s < nk) load_stage(s, s);
      cp_async_commit();
    }
    for (int kt = 0; kt < nk; ++kt) {
      cp_async_wait<kDist - 1>();
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async writes -> wgmma reads
      // Also: every warpgroup's wgmma of stage kt - 1 has completed, so that stage can be refilled.
      __syncthreads();
      if (kt + kDist < nk) load_stage((kt + kDist) % kWStages, kt + kDist);
      cp_async_commit();
      const unsigned char* st = smem + (kt % kWStages) * kWStageBytes;
      const unsigned char* sA = st + wg * 64 * kWBK * sizeof(bf16);
      const unsigned char* sB = st + kWBM * kWBK * sizeof(bf16);
      if (64 * wg >= rows) continue;  // the warpgroup's rows are all past the expert's last slot
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < kWBK / 16; ++kk) wgmma_m64n128k16(acc, wgmma_desc(sA + kk * 32), wgmma_desc(sB + kk * 32));
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
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
        bf16* hrow = h + static_cast<size_t>(start + r) * I + blockIdx.x * (kWBN / 2) + 2 * t;
#pragma unroll
        for (int i = 0; i < kWBN / 16; ++i) {
          float hv[2];
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            hv[c] = swiglu_acc(acc[4 * i + 2 * hr + c], acc[4 * (i + kWBN / 16) + 2 * hr + c]);
          }
          *reinterpret_cast<__nv_bfloat162*>(hrow + 8 * i) = __floats2bfloat162_rn(hv[0], hv[1]);
        }
      } else {
        const int slot = plan.sorted_slots[start + r];
        const float wt = weights[slot];
        float* orow = slot_out + static_cast<size_t>(slot) * H + blockIdx.x * kWBN + 2 * t;
#pragma unroll
        for (int i = 0; i < kWBN / 8; ++i)
          *reinterpret_cast<float2*>(orow + 8 * i) = make_float2(bf16_round(bf16_round(acc[4 * i + 2 * hr]) * wt),
                                                                 bf16_round(bf16_round(acc[4 * i + 2 * hr + 1]) * wt));
      }
    }
  }
}

template <bool kGateUp>
Status launch_grouped_wgmma(const bf16* a, const MoePlan& plan, const float* weights, const bf16* w, bf16* h,
                            float* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream) {
  auto* kernel = moe_grouped_wgmma_kernel<kGateUp>;
  const cudaError_t attr = once_per_device<cudaError_t>([&] {  // function attributes are per GPU
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kWSmem));
  });
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "moe grouped GEMM (wgmma) smem attribute"));
  const int n_tiles = kGateUp ? I / (kWBN / 2) : H / kWBN;
  return launch(kGateUp ? "moe_prefill_gate_up" : "moe_prefill_down", kernel,
                dim3(n_tiles, std::min(moe_max_tiles(N, K, E), 65535)), dim3(kWBM * 2), kWSmem, stream, a, plan,
                weights, w, h, slot_out, K, H, I);
}

// ---- warp-specialised persistent grouped GEMM ----------------------------------------------------------------
//
// CTA = one producer warpgroup + two consumer warpgroups (384 threads, one CTA per SM, persistent over a flat list
// of work tiles). A work tile is 128 sorted slots of one expert (the consumers take 64 rows each) x 256 weight rows
// (gate/up covers 128 intermediate columns, gate rows then the matching up rows; down 256 output columns). Each CTA
// builds the list itself: per active expert ceil(slots / 128) row tiles (a prefix sum in shared memory), times the
// weight-row tiles, weight-row tiles fastest; CTA b takes tiles b, b + grid, ... so the CTAs running together share
// an expert's A rows and weights in L2.
//
// Producer: the weight tiles (and down's contiguous h rows) by TMA (cp.async.bulk.tensor, 128-byte swizzle, tensor
// maps built on the host), gate/up's token rows gathered through the plan by cp.async (eight 16-byte chunks per row
// across 8 lanes, swizzled by hand to the same layout), into a 4-stage ring of k-chunks of 64. Stage s has two
// mbarriers: full[s] (TMA bytes + one cp.async arrival per producer thread) and empty[s] (one arrival per consumer
// warp once its wgmma reading the stage has completed). setmaxnreg moves registers from the producer (56) to the
// consumers (224). Consumers: wgmma.m64n256k16 from shared memory with one wgmma group left in flight, stage kt - 1
// released after the wait; the epilogue stores straight from registers while the producer already fills the ring
// with the next tile's k-chunks. Both consumer warpgroups take every tile, 64 rows each.
constexpr int kXBM = 128;          // sorted slots per work tile
constexpr int kXBN = 256;          // weight rows per work tile
constexpr int kXStages = 4;        // ring depth
constexpr int kXBK = 64;           // k-chunk (one 128-byte row per operand row)
constexpr int kXThreads = 384;     // producer warpgroup + 2 consumer warpgroups
constexpr int kXMaxExperts = 256;  // active-expert prefix table in shared memory
constexpr int kXRowBytes = kXBK * 2;
constexpr size_t kXStageBytes = static_cast<size_t>(kXBM + kXBN) * kXRowBytes;
constexpr size_t kXSmem = kXStages * kXStageBytes + 1024;  // + alignment slack

// Arrives on `bar` once every cp.async this thread issued before has landed (counts as one of its arrivals).
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(vmma::smem_addr(bar)) : "memory");
}

// Two adjacent fp32 slot outputs (values already rounded to bf16).
__device__ __forceinline__ void store_slot2(float* p, float a, float b) {
  *reinterpret_cast<float2*>(p) = make_float2(a, b);
}

// Two words of an accumulator row's bf16 pairs (lo: pairs of 8-column group 2m, hi: of group 2m + 1; the quad's lane
// t holds columns 2t, 2t + 1 of each group) swapped between lanes t and t ^ 1, so that the lane holds 4 consecutive
// bf16 of one group (group 2m + (t & 1), columns 4 * (t >> 1) .. + 3): an 8-byte store, the quad's 32 bytes
// contiguous. Every lane of the warp must call it.
__device__ __forceinline__ uint2 pair_swap(uint32_t lo, uint32_t hi) {
  const bool odd = threadIdx.x & 1;
  const uint32_t got = __shfl_xor_sync(0xffffffffu, odd ? lo : hi, 1);
  const uint32_t keep = odd ? hi : lo;
  return odd ? make_uint2(got, keep) : make_uint2(keep, got);
}

// pair_swap, then the lane's 8 bytes into 8-column group 2m + (t & 1) of a bf16 row (row: the lane's base, already
// offset by 4 * (t >> 1)); live = false only swaps (the shuffle needs every lane).
__device__ __forceinline__ void store_swapped(bf16* row, int m, uint32_t lo, uint32_t hi, bool live) {
  const uint2 o = pair_swap(lo, hi);
  if (!live) return;
  *reinterpret_cast<uint2*>(row + 8 * (2 * m + (threadIdx.x & 1))) = o;
}

// Slot: down's slot outputs as fp32 or as bf16 (the same values: every output is bf16(bf16(C) * w)).
template <bool kGateUp, class Slot = float>
__global__ void __launch_bounds__(kXThreads, 1)
    moe_grouped_ws_kernel(const __grid_constant__ CUtensorMap tm_w, const __grid_constant__ CUtensorMap tm_a,
                          const bf16* __restrict__ a_src, MoePlan plan, const float* __restrict__ weights,
                          bf16* __restrict__ h, Slot* __restrict__ slot_out, int K, int H, int I) {
  using namespace vmma;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  __shared__ __align__(8) uint64_t full_bar[kXStages];
  __shared__ __align__(8) uint64_t empty_bar[kXStages];
  __shared__ int mstart[kXMaxExperts + 1];  // first row tile of each active expert
  __shared__ int s_active;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kXStages; ++s) {
      mbar_init_count(&full_bar[s], kGateUp ? 128 + 1 : 1);
      mbar_init_count(&empty_bar[s], 8);  // the consumer warps that read the stage
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  pdl_wait();
  if (warp == 0) {
    const int na = *plan.num_active;
    int base = 0;
    for (int j0 = 0; j0 < na; j0 += 32) {
      const int j = j0 + lane;
      const int m = j < na ? (plan.offsets[j + 1] - plan.offsets[j] + kXBM - 1) / kXBM : 0;
      int s = m;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int v = __shfl_up_sync(0xffffffffu, s, o);
        if (lane >= o) s += v;
      }
      if (j < na) mstart[j] = base + s - m;
      base += __shfl_sync(0xffffffffu, s, 31);
    }
    if (lane == 0) {
      mstart[na] = base;
      s_active = na;
    }
  }
  __syncthreads();
  const int na = s_active;
  const int total_m = mstart[na];
  const int n_tiles = kGateUp ? I / (kXBN / 2) : H / kXBN;
  const int units = total_m * n_tiles;
  const int Kdim = kGateUp ? H : I;
  const int nk = Kdim / kXBK;
  // Row tile q -> active expert j (-1 past the list), first sorted position m0, rows.
  auto decode_rows = [&](int q, int& j, int& m0, int& rows) {
    if (q >= total_m) {
      j = -1;
      m0 = 0;
      rows = 0;
      return;
    }
    int lo = 0, hi = na - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (mstart[mid] <= q)
        lo = mid;
      else
        hi = mid - 1;
    }
    j = lo;
    m0 = plan.offsets[j] + (q - mstart[j]) * kXBM;
    rows = min(kXBM, plan.offsets[j + 1] - m0);
  };
  // Work unit u -> row tile (j, m0, rows) and weight-row tile nt.
  auto decode = [&](int u, int& j, int& m0, int& rows, int& nt) {
    const int pq = u / n_tiles;
    nt = u - pq * n_tiles;
    decode_rows(pq, j, m0, rows);
  };

  if (warp < 4) {
    // ---- producer warpgroup ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
    // Without the gathered cp.async rows (down, dense) the loads are all TMA issued by one thread: warp 0 alone runs
    // the ring. Warps that only waited on the empty barriers were gated by nothing, so one could fall two phases
    // behind and wait on a parity that does not come again: its CTA never ended (a hang seen in the CUDA suite).
    if constexpr (!kGateUp) {
      if (warp != 0) return;
    }
    const int p = threadIdx.x;
    const int lr = p >> 3, lc = p & 7;  // rows lr + 16 u (u < 8), 16-byte chunk lc
    const int sw = ((lc ^ (lr & 7)) * 16);
    int stage = 0;
    unsigned phase = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      int j, m0, rows, nt;
      decode(u, j, m0, rows, nt);
      const int e = plan.active_experts[j];
      int wr0, wr1;  // first rows of the two halves of the weight tile
      if constexpr (kGateUp) {
        wr0 = e * 2 * I + nt * (kXBN / 2);
        wr1 = wr0 + I;
      } else {
        wr0 = e * H + nt * kXBN;
        wr1 = wr0 + kXBN / 2;
      }
      int tok[8];
      if constexpr (kGateUp) {
#pragma unroll
        for (int v = 0; v < 8; ++v) {
          const int r = lr + 16 * v;
          tok[v] = r < rows ? plan.sorted_slots[m0 + r] / K : -1;
        }
      }
      for (int kc = 0; kc < nk; ++kc) {
        mbar_wait(&empty_bar[stage], phase ^ 1);
        unsigned char* sA = smem + stage * kXStageBytes;
        unsigned char* sB = sA + kXBM * kXRowBytes;
        if (p == 0) {
          mbar_arrive_expect_tx(&full_bar[stage], kXBN * kXRowBytes + (kGateUp ? 0 : kXBM * kXRowBytes));
          tensor_load_2d(sB, &tm_w, kc * kXBK, wr0, &full_bar[stage]);
          tensor_load_2d(sB + (kXBN / 2) * kXRowBytes, &tm_w, kc * kXBK, wr1, &full_bar[stage]);
          if constexpr (!kGateUp) tensor_load_2d(sA, &tm_a, kc * kXBK, m0, &full_bar[stage]);
        }
        if constexpr (kGateUp) {
#pragma unroll
          for (int v = 0; v < 8; ++v) {
            const int r = lr + 16 * v;
            const bf16* src = a_src + static_cast<size_t>(tok[v] >= 0 ? tok[v] : 0) * H + kc * kXBK + lc * 8;
            cp_async16(sA + r * kXRowBytes + sw, src, tok[v] >= 0);
          }
          cp_async_mbar_arrive(&full_bar[stage]);
        }
        if (++stage == kXStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    if constexpr (kGateUp) cp_async_wait<0>();
  } else {
    // ---- consumer warpgroups ----
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
    const int wg = (warp >> 2) - 1, wq = warp & 3, g = lane >> 2, t = lane & 3;
    auto release = [&](int s) {
      if (lane != 0) return;
      mbar_arrive(&empty_bar[s]);
    };
    // Both warpgroups take every work tile, 64 rows each (row block wg).
    int i = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x, ++i) {
      int j, m0, rows, nt;
      decode(u, j, m0, rows, nt);
      const bool act = 64 * wg < rows;  // the row block has rows of the expert
      float acc[kXBN / 2];
#pragma unroll
      for (int c = 0; c < kXBN / 2; ++c) acc[c] = 0.f;
      int prev = -1;
      for (int kc = 0; kc < nk; ++kc) {
        const int pos = i * nk + kc;  // position in the ring's sequence of k-chunks
        const int stage = pos % kXStages;
        mbar_wait(&full_bar[stage], (pos / kXStages) & 1);
        if (act) {
          if constexpr (kGateUp) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async -> wgmma
          const unsigned char* sA = smem + stage * kXStageBytes + wg * 64 * kXRowBytes;
          const unsigned char* sB = smem + stage * kXStageBytes + kXBM * kXRowBytes;
          asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
          for (int kk = 0; kk < kXBK / 16; ++kk)
            wgmma_m64n256k16(acc, wgmma_desc(sA + kk * 32), wgmma_desc(sB + kk * 32));
          asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
          asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        }
        if (prev >= 0) release(prev);  // its wgmma group has completed
        prev = stage;
      }
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      if (prev >= 0) release(prev);
      // The epilogue, written as a one-pass loop over the warpgroup's row block: the form the kernel was measured in
      // (the same SASS).
#pragma unroll
      for (int rb = 0; rb < 1; ++rb) {
      if (!act) continue;

      // acc[4 * c8 + 2 * hr + c]: row 16 * wq + g + 8 * hr of row block wg, column 8 * c8 + 2 * t + c.
      if constexpr (!kGateUp && std::is_same_v<Slot, bf16>) {
        // bf16 slots: each lane packs its pairs, neighbouring lanes swap one word of each two (pair_swap), and every
        // lane stores 4 consecutive columns (8 bytes; 4-byte stores of pairs ran slower than the fp32 slots' 8-byte
        // ones, and a 4 x 4 quad transpose for 16-byte stores cost more in the epilogue than it saved). The shuffles
        // need the whole warp, so rows past the tile's end only skip the stores.
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = wg * 64 + 16 * wq + g + hr * 8;
          const bool live = r < rows;
          const int slot = live ? plan.sorted_slots[m0 + r] : 0;
          const float wt = live ? weights[slot] : 0.f;
          Slot* orow = slot_out + static_cast<size_t>(slot) * H + nt * kXBN + 4 * (t >> 1);
#pragma unroll
          for (int m = 0; m < kXBN / 16; ++m) {
            uint32_t pk[2];
#pragma unroll
            for (int k = 0; k < 2; ++k) {
              const int c8 = 2 * m + k;
              const __nv_bfloat162 v = __floats2bfloat162_rn(bf16_round(bf16_round(acc[4 * c8 + 2 * hr]) * wt),
                                                             bf16_round(bf16_round(acc[4 * c8 + 2 * hr + 1]) * wt));
              pk[k] = *reinterpret_cast<const uint32_t*>(&v);
            }
            store_swapped(orow, m, pk[0], pk[1], live);
          }
        }
      } else {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = wg * 64 + 16 * wq + g + hr * 8;
          if (r >= rows) continue;
          if constexpr (kGateUp) {
            bf16* hrow = h + static_cast<size_t>(m0 + r) * I + nt * (kXBN / 2) + 2 * t;
#pragma unroll
            for (int c8 = 0; c8 < kXBN / 16; ++c8) {
              float hv[2];
#pragma unroll
              for (int c = 0; c < 2; ++c) {
                hv[c] = swiglu_acc(acc[4 * c8 + 2 * hr + c], acc[4 * (c8 + kXBN / 16) + 2 * hr + c]);
              }
              *reinterpret_cast<__nv_bfloat162*>(hrow + 8 * c8) = __floats2bfloat162_rn(hv[0], hv[1]);
            }
          } else {
            const int slot = plan.sorted_slots[m0 + r];
            const float wt = weights[slot];
            float* orow = slot_out + static_cast<size_t>(slot) * H + nt * kXBN + 2 * t;
#pragma unroll
            for (int c8 = 0; c8 < kXBN / 8; ++c8)
              store_slot2(orow + 8 * c8, bf16_round(bf16_round(acc[4 * c8 + 2 * hr]) * wt),
                          bf16_round(bf16_round(acc[4 * c8 + 2 * hr + 1]) * wt));
          }
        }
      }
      }  // rb
    }
  }
}

// Tensor map over a row-major bf16 matrix [rows, cols]: boxes of 64 columns (128 bytes, 128-byte swizzle) x
// box_rows rows; reads past the last row give zeros.
Status make_tensor_map(CUtensorMap* map, const bf16* base, uint64_t rows, uint64_t cols, uint32_t box_rows) {
  const EncodeTiledFn fn = encode_tiled_fn();
  if (fn == nullptr) return internal_error("moe grouped GEMM: cuTensorMapEncodeTiled is not available");
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * sizeof(bf16)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kXBK), box_rows};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = fn(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<bf16*>(base), dims, strides, box, elem,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return internal_error("moe grouped GEMM: cuTensorMapEncodeTiled failed (" + std::to_string(r) + ")");
  return Status::ok();
}

// Whether the warp-specialised kernel takes these sizes and operands (else the fp32-slot callers run the wgmma kernel).
template <bool kGateUp>
bool ws_ok(const void* a, const void* w, int E, int H, int I) {
  const bool widths = kGateUp ? (I % (kXBN / 2) == 0 && H % kXBK == 0) : (H % kXBN == 0 && I % kXBK == 0);
  return widths && E <= kXMaxExperts && reinterpret_cast<uintptr_t>(a) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0 && encode_tiled_fn() != nullptr;
}

// Slot = float: sizes or operands the warp-specialised kernel does not take run the wgmma kernel. Slot = bf16 (down's
// slot outputs as bf16): no fallback, those are an error.
template <bool kGateUp, class Slot = float>
Status launch_grouped_ws(const bf16* a, const MoePlan& plan, const float* weights, const bf16* w, bf16* h,
                         Slot* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream) {
  if constexpr (std::is_same_v<Slot, float>) {
    if (!ws_ok<kGateUp>(a, w, E, H, I))
      return launch_grouped_wgmma<kGateUp>(a, plan, weights, w, h, slot_out, N, K, E, H, I, stream);
  } else if (!ws_ok<kGateUp>(a, w, E, H, I)) {
    return invalid_argument(
        "moe_prefill_down (bf16 slots): sizes or operands the warp-specialised kernel does not take");
  }
  auto* kernel = moe_grouped_ws_kernel<kGateUp, Slot>;
  const cudaError_t attr = once_per_device<cudaError_t>([&] {  // function attributes are per GPU
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kXSmem));
  });
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "moe grouped GEMM (warp-specialised) smem attribute"));
  CUtensorMap tm_w, tm_a;
  if constexpr (kGateUp) {
    ZEST_RETURN_IF_ERROR(make_tensor_map(&tm_w, w, static_cast<uint64_t>(E) * 2 * I, H, kXBN / 2));
    tm_a = tm_w;  // unused: gate/up gathers its rows by cp.async
  } else {
    ZEST_RETURN_IF_ERROR(make_tensor_map(&tm_w, w, static_cast<uint64_t>(E) * H, I, kXBN / 2));
    ZEST_RETURN_IF_ERROR(make_tensor_map(&tm_a, a, static_cast<uint64_t>(N) * K, I, kXBM));
  }
  const int n_tiles = kGateUp ? I / (kXBN / 2) : H / kXBN;
  const long long units = static_cast<long long>(moe_max_tiles(N, K, E)) * n_tiles;
  const int grid = static_cast<int>(std::max<long long>(1, std::min<long long>(sm_count(), units)));
  return launch(kGateUp ? "moe_prefill_gate_up" : "moe_prefill_down", kernel, dim3(grid), dim3(kXThreads), kXSmem,
                stream, tm_w, tm_a, a, plan, weights, h, slot_out, K, H, I);
}

// ---- plan for many tokens -------------------------------------------------------------------------------------
//
// Two launches over CTAs of kMoePlanCtaSlots consecutive slots (8 warps, a warp owns kPlanWarpSlots of them).
// moe_plan_count_kernel: each CTA's expert counts (shared-memory atomics) into plan.cta_counts. moe_plan_place_kernel:
// each CTA sums the counts of the CTAs before it and of all CTAs (the experts' totals; CTA 0 also writes the plan's
// header and tiles from the totals), counts its slots per warp, and places each warp's slots in slot order (ranks
// inside a 32-slot group from __match_any_sync) after the slots of earlier warps and CTAs. The scattered
// sorted_slots stores come from every CTA's SM instead of one (a single CTA spent ~80 us on them at 64k slots).
constexpr int kPlanWarps = 8;
constexpr int kPlanWarpSlots = kMoePlanCtaSlots / kPlanWarps;
constexpr int kPlanMaxExperts = 256;
static_assert(kPlanWarpSlots % 32 == 0, "whole 32-slot groups per warp");

__global__ void __launch_bounds__(kPlanWarps * 32) moe_plan_count_kernel(const int32_t* __restrict__ ids, int NK, int E,
                                                                         int32_t* __restrict__ cta_counts) {
  __shared__ int cnt[kPlanMaxExperts];
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  pdl_wait();
  const int beg = blockIdx.x * kMoePlanCtaSlots, end = min(NK, beg + kMoePlanCtaSlots);
#pragma unroll 4
  for (int i = beg + threadIdx.x; i < end; i += blockDim.x) {
    const int id = __ldg(ids + i);
    if (id >= 0 && id < E) atomicAdd(&cnt[id], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) cta_counts[blockIdx.x * E + e] = cnt[e];
}

// Exclusive prefix over the experts' totals (one warp; the offsets moe_plan_scan_warp gives CTA 0).
__device__ __forceinline__ void plan_first_warp(const int* total, int E, int* first) {
  const int lane = threadIdx.x & 31;
  int off = 0;
  for (int e0 = 0; e0 < E; e0 += 32) {
    const int e = e0 + lane;
    const int c = e < E ? total[e] : 0;
    int cs = c;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int a = __shfl_up_sync(0xffffffffu, cs, o);
      if (lane >= o) cs += a;
    }
    if (e < E) first[e] = off + cs - c;
    off += __shfl_sync(0xffffffffu, cs, 31);
  }
}

__global__ void __launch_bounds__(kPlanWarps * 32) moe_plan_place_kernel(const int32_t* __restrict__ ids, int NK, int E,
                                                                         MoePlan plan, int64_t* active_count_sum) {
  __shared__ int wcnt[kPlanWarps][kPlanMaxExperts];  // per-warp counts, then each warp's next position per expert
  __shared__ int total[kPlanMaxExperts];
  __shared__ int before[kPlanMaxExperts];  // slots of each expert in the CTAs before this one
  __shared__ int first[kPlanMaxExperts];   // sorted position of each expert's first slot
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int i = threadIdx.x; i < kPlanWarps * kPlanMaxExperts; i += blockDim.x) (&wcnt[0][0])[i] = 0;
  pdl_wait();
  const int G = gridDim.x, me = blockIdx.x;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int b = 0, t = 0;
#pragma unroll 8
    for (int g = 0; g < G; ++g) {
      const int c = __ldcg(plan.cta_counts + g * E + e);
      b += g < me ? c : 0;
      t += c;
    }
    before[e] = b;
    total[e] = t;
  }
  __syncthreads();
  const int beg = min(NK, me * kMoePlanCtaSlots + warp * kPlanWarpSlots);
  const int end = min(NK, beg + kPlanWarpSlots);
  int idv[kPlanWarpSlots / 32];
#pragma unroll
  for (int u = 0; u < kPlanWarpSlots / 32; ++u) {
    const int i = beg + 32 * u + lane;
    const int id = i < end ? __ldg(ids + i) : -1;
    idv[u] = id < E ? id : -1;
    if (idv[u] >= 0) atomicAdd(&wcnt[warp][idv[u]], 1);
  }
  if (warp == 0) {
    if (me == 0)
      moe_plan_scan_warp(total, E, plan, first, active_count_sum);
    else
      plan_first_warp(total, E, first);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {  // exclusive prefix over the warps
    int sum = first[e] + before[e];
    for (int w = 0; w < kPlanWarps; ++w) {
      const int c = wcnt[w][e];
      wcnt[w][e] = sum;
      sum += c;
    }
  }
  __syncthreads();
  int* next = wcnt[warp];
#pragma unroll
  for (int u = 0; u < kPlanWarpSlots / 32; ++u) {  // groups in slot order
    const int id = idv[u];
    const unsigned same = __match_any_sync(0xffffffffu, id);
    const int rank = __popc(same & ((1u << lane) - 1));
    if (id >= 0) plan.sorted_slots[next[id] + rank] = beg + 32 * u + lane;
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
  const int ctas = (N * K + kMoePlanCtaSlots - 1) / kMoePlanCtaSlots;
  ZEST_RETURN_IF_ERROR(launch("moe_plan_count", moe_plan_count_kernel, dim3(ctas), dim3(kPlanWarps * 32), 0, stream,
                              ids, N * K, E, plan.cta_counts));
  return launch("moe_plan_place", moe_plan_place_kernel, dim3(ctas), dim3(kPlanWarps * 32), 0, stream, ids, N * K, E,
                plan, active_count_sum);
}

Status moe_prefill_gate_up(const bf16* x, const MoePlan& plan, const bf16* gate_up, bf16* h, int N, int K, int E,
                           int H, int I, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_grouped(N, K, E, H, I));
  if (!mma_shapes_ok(H, I))
    return invalid_argument("moe_prefill_gate_up: needs H % 128 == 0 and I % 64 == 0 (H=" + std::to_string(H) +
                            " I=" + std::to_string(I) + ")");
  return launch_grouped_ws<true, float>(x, plan, nullptr, gate_up, h, nullptr, N, K, E, H, I, stream);
}

Status moe_prefill_down(const bf16* h, const MoePlan& plan, const float* weights, const bf16* down, float* slot_out,
                        int N, int K, int E, int H, int I, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_grouped(N, K, E, H, I));
  if (!mma_shapes_ok(H, I))
    return invalid_argument("moe_prefill_down: needs H % 128 == 0 and I % 64 == 0 (H=" + std::to_string(H) +
                            " I=" + std::to_string(I) + ")");
  return launch_grouped_ws<false, float>(h, plan, weights, down, nullptr, slot_out, N, K, E, H, I, stream);
}

Status moe_prefill_down(const bf16* h, const MoePlan& plan, const float* weights, const bf16* down, bf16* slot_out,
                        int N, int K, int E, int H, int I, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_grouped(N, K, E, H, I));
  if (!mma_shapes_ok(H, I))
    return invalid_argument("moe_prefill_down: needs H % 128 == 0 and I % 64 == 0 (H=" + std::to_string(H) +
                            " I=" + std::to_string(I) + ")");
  return launch_grouped_ws<false, bf16>(h, plan, weights, down, nullptr, slot_out, N, K, E, H, I, stream);
}

bool moe_prefill_bf16_slots(const bf16* h, const bf16* down, int E, int H, int I) {
  return E <= 1024 && mma_shapes_ok(H, I) && ws_ok<false>(h, down, E, H, I);
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
  const cudaError_t configured = once_per_device<cudaError_t>([] {  // function attributes are per GPU
    if (!set_dynamic_smem(reinterpret_cast<const void*>(moe_grouped_gemm_kernel<true>), grouped_smem(true)).is_ok() ||
        !set_dynamic_smem(reinterpret_cast<const void*>(moe_grouped_gemm_kernel<false>), grouped_smem(false)).is_ok())
      return cudaErrorInvalidValue;
    return cudaSuccess;
  });
  ZEST_RETURN_IF_ERROR(cuda_status(configured, "moe_experts_prefill_wmma: shared memory attribute"));
  const int tiles = moe_max_tiles(N, K, E);
  ZEST_RETURN_IF_ERROR(launch("moe_gate_up_prefill", moe_grouped_gemm_kernel<true>, dim3(tiles, I / kGT),
                              dim3(kGWarps * 32), grouped_smem(true), stream, x, plan, weights, gate_up, h, slot_out, K,
                              H, I));
  return launch("moe_down_prefill", moe_grouped_gemm_kernel<false>, dim3(tiles, H / kGT), dim3(kGWarps * 32),
                grouped_smem(false), stream, static_cast<const bf16*>(h), plan, weights, down, h, slot_out, K, H, I);
}

}  // namespace zest::cuda