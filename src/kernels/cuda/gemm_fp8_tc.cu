// FP8 tensor-core products for prefill and decode's dense products of 33-64 rows (wgmma e4m3 x e4m3, fp32
// accumulation) with block scales: weights as Fp8Weight (scales uniform over 128 x 128 blocks, the official
// checkpoints' blocks), activations from quantize_rows_fp8 (one scale per row per 128 columns). Three modes of one
// warp-specialised persistent kernel:
// - kGateUp: the MoE experts' gate/up over the plan's sorted slots (token rows gathered by cp.async), h =
//   bf16(silu(gate) * up) at the sorted position;
// - kDown: the experts' down over h's FP8 rows by sorted position (tensor copies), slot_out[slot] = w[slot] * out;
// - kDense: y = x W^T for a dense projection (x's FP8 rows by tensor copies, one "expert" of every row).
//
// Work tile: 128 rows (sorted slots or tokens; two consumer warpgroups of 64) x 128 weight rows (gate/up: 64 gate rows
// then the 64 matching up rows). K goes in chunks of 128 (one 128-byte swizzled shared row per operand row, one scale
// block): for each chunk a consumer warpgroup issues four wgmma.m64n128k32 into a chunk accumulator, waits for them,
// and adds it times (row scale x weight block scale) to its fp32 sums (the promotion of block-scaled FP8 GEMMs). A
// 6-stage ring of (A 16 KB, B 16 KB, 130 scales) chunks is filled by the producer warpgroup: the weight tile by TMA (two
// boxes of 64 rows), A rows by TMA (kDown, kDense) or by cp.async with the 128-byte swizzle applied by hand (kGateUp),
// the chunk's 128 row scales and two weight-box scales by cp.async (each producer thread one row; all 128 arrive on the
// stage's full barrier). The plan's offsets and experts sit in shared memory and down's slots and routing weights are
// read at the tile's start, so no consumer waits on a global load between two chunks or at a tile's end.
#include <cuda.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vision_mma.cuh"

namespace zest::cuda {

namespace {

enum class TcMode { kGateUp, kDown, kDense };

constexpr int kBM = 128;       // A rows per work tile
constexpr int kBN = 128;       // weight rows per work tile
constexpr int kBK = 128;       // k per chunk (bytes per shared row)
constexpr int kStages = 6;
constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
constexpr int kMaxExperts = 256;
constexpr size_t kStageBytes = static_cast<size_t>(kBM + kBN) * kBK;
constexpr size_t kSmem = kStages * kStageBytes + 1024;  // + alignment slack

__device__ __forceinline__ uint64_t desc_sw128(const void* smem) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint64_t d = (a >> 4) & 0x3FFF;
  d |= static_cast<uint64_t>(1) << 16;          // leading byte offset (unused with the 128-byte swizzle)
  d |= static_cast<uint64_t>(1024 >> 4) << 32;  // stride byte offset: the next 8-row group
  d |= static_cast<uint64_t>(1) << 62;          // 128-byte swizzle
  return d;
}

// d (+)= A[64 x 32] * B[128 x 32]^T, e4m3 operands in shared memory (K-major); acc_in = false overwrites d.
__device__ __forceinline__ void wgmma_e4m3_m64n128k32(float (&d)[64], uint64_t da, uint64_t db, bool acc_in) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "
      "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),
        "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),
        "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
        "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
        "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(static_cast<int>(acc_in)));
}

// 4-byte async copy global -> shared; zero-fills when !valid (gmem is then not read).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(vmma::smem_addr(smem)), "l"(gmem),
               "r"(valid ? 4 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(vmma::smem_addr(bar)) : "memory");
}

struct TcArgs {
  const uint8_t* a;      // kGateUp: x8 [tokens, H]; kDown: h8 [N K, I]; kDense: x8 [M, K]
  const float* a_scale;  // [rows of a, width / 128]
  const float* w_scale;  // Fp8Weight scales: [weight rows / 16, width / 64]
  MoePlan plan;          // kGateUp, kDown
  const float* route_w;  // kDown
  bf16* out;             // kGateUp: h [N K, I]; kDense: y [M, N]; kDown: the slots as bf16 [N K, H], or null
  float* slot_out;       // kDown without out: the slots as f32 [N K, H]
  int top_k, H, I;       // experts
  int M, N, K;           // kDense: rows, weight rows, width
};

template <TcMode kMode>
__global__ void __launch_bounds__(kThreads, 1)
    gemm_fp8_tc_kernel(const __grid_constant__ CUtensorMap tm_w, const __grid_constant__ CUtensorMap tm_a, TcArgs p) {
  constexpr bool kGU = kMode == TcMode::kGateUp, kDn = kMode == TcMode::kDown, kDense = kMode == TcMode::kDense;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024 - (static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) & 1023)) & 1023);
  __shared__ __align__(8) uint64_t full_bar[kStages];
  __shared__ __align__(8) uint64_t empty_bar[kStages];
  __shared__ int mstart[kMaxExperts + 1];  // first row tile of each active expert (experts)
  __shared__ int s_off[kMaxExperts + 1];   // the plan's offsets and active experts (experts)
  __shared__ int s_exp[kMaxExperts];
  __shared__ float s_sc[kStages][kBM + 2];  // per stage: the chunk's 128 row scales, then the two weight-box scales
  __shared__ int s_active;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      mbar_init_count(&full_bar[s], 128 + 1);  // every producer thread (cp.async, noinc) + the expect_tx arrival
      mbar_init_count(&empty_bar[s], 8);  // the consumer warps that read the stage
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  pdl_wait();
  if constexpr (!kDense) {
    if (warp == 0) {
      const int na = *p.plan.num_active;
      int base = 0;
      for (int j0 = 0; j0 < na; j0 += 32) {
        const int j = j0 + lane;
        const int m = j < na ? (p.plan.offsets[j + 1] - p.plan.offsets[j] + kBM - 1) / kBM : 0;
        int s = m;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int v = __shfl_up_sync(0xffffffffu, s, o);
          if (lane >= o) s += v;
        }
        if (j < na) {
          mstart[j] = base + s - m;
          s_off[j] = p.plan.offsets[j];
          s_exp[j] = p.plan.active_experts[j];
        }
        base += __shfl_sync(0xffffffffu, s, 31);
      }
      if (lane == 0) {
        mstart[na] = base;
        s_off[na] = p.plan.offsets[na];
        s_active = na;
      }
    }
  }
  __syncthreads();
  const int na = kDense ? 1 : s_active;
  const int total_m = kDense ? (p.M + kBM - 1) / kBM : mstart[na];
  const int n_tiles = kGU ? p.I / (kBN / 2) : kDn ? p.H / kBN : p.N / kBN;
  const int units = total_m * n_tiles;
  const int width = kGU ? p.H : kDn ? p.I : p.K;
  const int nk = width / kBK;
  // Row tile q -> active expert j, first row m0 (sorted position or token), rows.
  auto decode_rows = [&](int q, int& j, int& m0, int& rows) {
    if constexpr (kDense) {
      j = 0;
      m0 = q * kBM;
      rows = min(kBM, p.M - m0);
    } else {
      int lo = 0, hi = na - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (mstart[mid] <= q)
          lo = mid;
        else
          hi = mid - 1;
      }
      j = lo;
      m0 = s_off[j] + (q - mstart[j]) * kBM;
      rows = min(kBM, s_off[j + 1] - m0);
    }
  };
  // The weight rows of the tile's two 64-row boxes.
  auto weight_rows = [&](int j, int nt, int& wr0, int& wr1) {
    const int e = kDense ? 0 : s_exp[j];
    if constexpr (kGU) {
      wr0 = e * 2 * p.I + nt * (kBN / 2);
      wr1 = wr0 + p.I;
    } else {
      wr0 = (kDn ? e * p.H : 0) + nt * kBN;
      wr1 = wr0 + kBN / 2;
    }
  };

  if (warp < 4) {
    // ---- producer warpgroup ----
    asm volatile("setmaxnreg.dec.sync.aligned.u32 56;\n" ::: "memory");
    // Every producer thread copies a row scale per chunk and arrives on the stage's full barrier, so none can run a
    // phase ahead of the consumers' release of a stage it has not filled (a warp that only waited on the empty
    // barriers, gated by nothing, once fell two phases behind and hung its CTA).
    const int t = threadIdx.x;
    const int a_blocks = width / 128, w_chunks = (width + 63) / 64;
    const int lr = t >> 3, lc = t & 7;  // kGateUp: rows lr + 16 v (v < 8), 16-byte chunk lc
    const int sw = (lc ^ (lr & 7)) * 16;
    int stage = 0;
    unsigned phase = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x) {
      const int pq = u / n_tiles, nt = u - pq * n_tiles;
      int j, m0, rows, wr0, wr1;
      decode_rows(pq, j, m0, rows);
      weight_rows(j, nt, wr0, wr1);
      // this thread's scale row (row t of the tile) and, in thread 0, the two weight boxes' scale rows
      int srow = -1;
      if (t < rows) srow = kGU ? p.plan.sorted_slots[m0 + t] / p.top_k : m0 + t;
      const float* sa_src = p.a_scale + static_cast<size_t>(srow >= 0 ? srow : 0) * a_blocks;
      const float* sw0_src = p.w_scale + static_cast<size_t>(wr0 / 16) * w_chunks;
      const float* sw1_src = p.w_scale + static_cast<size_t>(wr1 / 16) * w_chunks;
      int tok[8];
      if constexpr (kGU) {
#pragma unroll
        for (int v = 0; v < 8; ++v) {
          const int r = lr + 16 * v;
          tok[v] = r < rows ? p.plan.sorted_slots[m0 + r] / p.top_k : -1;
        }
      }
      for (int kc = 0; kc < nk; ++kc) {
        mbar_wait(&empty_bar[stage], phase ^ 1);
        unsigned char* sA = smem + stage * kStageBytes;
        unsigned char* sB = sA + kBM * kBK;
        if (t == 0) {
          mbar_arrive_expect_tx(&full_bar[stage], kBN * kBK + (kGU ? 0 : kBM * kBK));
          tensor_load_2d(sB, &tm_w, kc * kBK, wr0, &full_bar[stage]);
          tensor_load_2d(sB + (kBN / 2) * kBK, &tm_w, kc * kBK, wr1, &full_bar[stage]);
          if constexpr (!kGU) tensor_load_2d(sA, &tm_a, kc * kBK, m0, &full_bar[stage]);
        }
        if constexpr (kGU) {
#pragma unroll
          for (int v = 0; v < 8; ++v) {
            const int r = lr + 16 * v;
            const uint8_t* src = p.a + static_cast<size_t>(tok[v] >= 0 ? tok[v] : 0) * p.H + kc * kBK + lc * 16;
            vmma::cp_async16(sA + r * kBK + sw, src, tok[v] >= 0);
          }
        }
        cp_async4(&s_sc[stage][t], sa_src + kc, srow >= 0);
        if (t == 0) {
          cp_async4(&s_sc[stage][kBM], sw0_src + 2 * kc, true);
          cp_async4(&s_sc[stage][kBM + 1], sw1_src + 2 * kc, true);
        }
        cp_async_mbar_arrive_noinc(&full_bar[stage]);
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
    vmma::cp_async_wait<0>();
  } else {
    // ---- consumer warpgroups: rows 64 wg .. 64 wg + 63 of each tile ----
    asm volatile("setmaxnreg.inc.sync.aligned.u32 224;\n" ::: "memory");
    const int wg = (warp >> 2) - 1, wq = warp & 3, g = lane >> 2, tq = lane & 3;
    int i = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x, ++i) {
      const int pq = u / n_tiles, nt = u - pq * n_tiles;
      int j, m0, rows;
      decode_rows(pq, j, m0, rows);
      const bool act = 64 * wg < rows;
      const int r0 = 64 * wg + 16 * wq + g;  // the thread's two rows: r0 and r0 + 8 of the tile
      // down: the rows' slots and routing weights, read now for the tile's end
      int slot[2] = {0, 0};
      float wt[2] = {0.f, 0.f};
      if constexpr (kDn) {
#pragma unroll
        for (int hr = 0; hr < 2; ++hr)
          if (r0 + 8 * hr < rows) {
            slot[hr] = p.plan.sorted_slots[m0 + r0 + 8 * hr];
            wt[hr] = p.route_w[slot[hr]];
          }
      }
      float acc[64], part[64];
#pragma unroll
      for (int c = 0; c < 64; ++c) acc[c] = 0.f;
      for (int kc = 0; kc < nk; ++kc) {
        const int pos = i * nk + kc;
        const int stage = pos % kStages;
        mbar_wait(&full_bar[stage], (pos / kStages) & 1);
        // this chunk's scales, read before the stage is released
        const float sa0 = s_sc[stage][r0], sa1 = s_sc[stage][r0 + 8];
        const float sw0 = s_sc[stage][kBM], sw1 = s_sc[stage][kBM + 1];
        if (act) {
          if constexpr (kGU) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async -> wgmma
          const unsigned char* sA = smem + stage * kStageBytes + wg * 64 * kBK;
          const unsigned char* sB = smem + stage * kStageBytes + kBM * kBK;
          asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
          for (int kk = 0; kk < kBK / 32; ++kk)
            wgmma_e4m3_m64n128k32(part, desc_sw128(sA + kk * 32), desc_sw128(sB + kk * 32), kk > 0);
          asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
          asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        }
        if (lane == 0) mbar_arrive(&empty_bar[stage]);
        if (act) {
          // part[4 c8 + 2 hr + c]: row 16 wq + g + 8 hr, column 8 c8 + 2 tq + c; columns 0-63 are box 0's rows
#pragma unroll
          for (int c8 = 0; c8 < 16; ++c8) {
            const float sw = c8 < 8 ? sw0 : sw1;
#pragma unroll
            for (int hr = 0; hr < 2; ++hr) {
              const float s = (hr ? sa1 : sa0) * sw;
              acc[4 * c8 + 2 * hr] = fmaf(part[4 * c8 + 2 * hr], s, acc[4 * c8 + 2 * hr]);
              acc[4 * c8 + 2 * hr + 1] = fmaf(part[4 * c8 + 2 * hr + 1], s, acc[4 * c8 + 2 * hr + 1]);
            }
          }
        }
      }
      if (!act) continue;
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = 64 * wg + 16 * wq + g + 8 * hr;
        if (r >= rows) continue;
        if constexpr (kGU) {
          bf16* hrow = p.out + static_cast<size_t>(m0 + r) * p.I + nt * (kBN / 2) + 2 * tq;
#pragma unroll
          for (int c8 = 0; c8 < 8; ++c8) {
            float hv[2];
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const float gv = bf16_round(acc[4 * c8 + 2 * hr + c]), uv = bf16_round(acc[4 * (c8 + 8) + 2 * hr + c]);
              hv[c] = bf16_round(gv / (1.f + __expf(-gv))) * uv;
            }
            *reinterpret_cast<__nv_bfloat162*>(hrow + 8 * c8) = __floats2bfloat162_rn(hv[0], hv[1]);
          }
        } else if constexpr (kDn) {
          const size_t at = static_cast<size_t>(slot[hr]) * p.H + nt * kBN + 2 * tq;
          // bf16-exact values: stored as bf16 (half the bytes, for the combine's bf16 form) or as f32
#pragma unroll
          for (int c8 = 0; c8 < 16; ++c8) {
            const float v0 = bf16_round(bf16_round(acc[4 * c8 + 2 * hr]) * wt[hr]);
            const float v1 = bf16_round(bf16_round(acc[4 * c8 + 2 * hr + 1]) * wt[hr]);
            if (p.out)
              *reinterpret_cast<__nv_bfloat162*>(p.out + at + 8 * c8) = __floats2bfloat162_rn(v0, v1);
            else
              *reinterpret_cast<float2*>(p.slot_out + at + 8 * c8) = make_float2(v0, v1);
          }
        } else {
          bf16* yrow = p.out + static_cast<size_t>(m0 + r) * p.N + nt * kBN + 2 * tq;
#pragma unroll
          for (int c8 = 0; c8 < 16; ++c8)
            *reinterpret_cast<__nv_bfloat162*>(yrow + 8 * c8) =
                __floats2bfloat162_rn(acc[4 * c8 + 2 * hr], acc[4 * c8 + 2 * hr + 1]);
        }
      }
    }
  }
}

// Tensor map over a row-major FP8 matrix [rows, cols] in boxes of 128 columns (128 bytes, 128-byte swizzle) x
// box_rows rows; reads past the last row give zeros.
Status make_map_u8(CUtensorMap* map, const uint8_t* base, uint64_t rows, uint64_t cols, uint32_t box_rows) {
  const EncodeTiledFn fn = encode_tiled_fn();
  if (fn == nullptr) return unsupported("FP8 tensor-core GEMM: cuTensorMapEncodeTiled is not available");
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kBK), box_rows};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = fn(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<uint8_t*>(base), dims, strides, box, elem,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return internal_error("FP8 tensor-core GEMM: cuTensorMapEncodeTiled failed (" + std::to_string(r) + ")");
  return Status::ok();
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

template <TcMode kMode>
Status launch_tc(const CUtensorMap& tm_w, const CUtensorMap& tm_a, const TcArgs& args, long long units,
                 cudaStream_t stream, const char* name) {
  auto* kernel = gemm_fp8_tc_kernel<kMode>;
  const cudaError_t attr = once_per_device<cudaError_t>([&] {  // function attributes are per GPU
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
  });
  ZEST_RETURN_IF_ERROR(cuda_status(attr, "FP8 tensor-core GEMM smem attribute"));
  int dev = 0, sms = 0;
  ZEST_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&dev), "cudaGetDevice"));
  ZEST_RETURN_IF_ERROR(cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "SM count"));
  const int grid = static_cast<int>(std::max<long long>(1, std::min<long long>(sms, units)));
  return launch(name, kernel, dim3(grid), dim3(kThreads), kSmem, stream, tm_w, tm_a, args);
}

}  // namespace

bool gemm_fp8_tc_ok(int N, int K) { return N > 0 && K > 0 && N % kBN == 0 && K % kBK == 0; }

bool moe_experts_fp8_tc_ok(int E, int H, int I) {
  return E > 0 && E <= kMaxExperts && H % kBN == 0 && H % kBK == 0 && I % (kBN / 2) == 0 && I % kBK == 0;
}

Status gemm_fp8_tc(const uint8_t* x8, const float* x_scale, Fp8Weight w, bf16* y, int M, int N, int K,
                   cudaStream_t stream) {
  if (M <= 0 || !gemm_fp8_tc_ok(N, K))
    return invalid_argument("gemm_fp8_tc: need M > 0 and N, K positive multiples of 128 (M " + std::to_string(M) +
                            ", N " + std::to_string(N) + ", K " + std::to_string(K) + ")");
  if (!aligned16(x8) || !aligned16(w.q) || !aligned16(y))
    return invalid_argument("gemm_fp8_tc: operands must be 16-byte aligned");
  CUtensorMap tm_w, tm_a;
  ZEST_RETURN_IF_ERROR(make_map_u8(&tm_w, w.q, static_cast<uint64_t>(N), K, kBN / 2));
  ZEST_RETURN_IF_ERROR(make_map_u8(&tm_a, x8, static_cast<uint64_t>(M), K, kBM));
  TcArgs a{};
  a.a = x8;
  a.a_scale = x_scale;
  a.w_scale = w.scales;
  a.out = y;
  a.M = M;
  a.N = N;
  a.K = K;
  const long long units = static_cast<long long>((M + kBM - 1) / kBM) * (N / kBN);
  return launch_tc<TcMode::kDense>(tm_w, tm_a, a, units, stream, "gemm_fp8_tc");
}

Status moe_gate_up_fp8_tc(const uint8_t* x8, const float* x_scale, const MoePlan& plan, Fp8Weight gate_up, bf16* h,
                          int N, int K, int E, int H, int I, cudaStream_t stream) {
  if (N <= 0 || K <= 0 || !moe_experts_fp8_tc_ok(E, H, I))
    return invalid_argument("moe_gate_up_fp8_tc: need tokens, E <= 256, H a multiple of 128 and I of 128");
  if (N > plan.max_tokens || K != plan.top_k || E != plan.experts)
    return invalid_argument("moe_gate_up_fp8_tc: the plan is bound for other sizes");
  if (!aligned16(x8) || !aligned16(gate_up.q) || !aligned16(h))
    return invalid_argument("moe_gate_up_fp8_tc: operands must be 16-byte aligned");
  CUtensorMap tm_w;
  ZEST_RETURN_IF_ERROR(make_map_u8(&tm_w, gate_up.q, static_cast<uint64_t>(E) * 2 * I, H, kBN / 2));
  TcArgs a{};
  a.a = x8;
  a.a_scale = x_scale;
  a.w_scale = gate_up.scales;
  a.plan = plan;
  a.out = h;
  a.top_k = K;
  a.H = H;
  a.I = I;
  const long long units = static_cast<long long>(moe_max_tiles(N, K, E)) * (I / (kBN / 2));
  return launch_tc<TcMode::kGateUp>(tm_w, tm_w, a, units, stream, "moe_gate_up_fp8_tc");
}

namespace {
// moe_down_fp8_tc into f32 slots (slot_out) or bf16 ones (slot_bf16).
Status down_tc(const uint8_t* h8, const float* h_scale, const MoePlan& plan, const float* weights, Fp8Weight down,
               float* slot_out, bf16* slot_bf16, int N, int K, int E, int H, int I, cudaStream_t stream) {
  if (N <= 0 || K <= 0 || !moe_experts_fp8_tc_ok(E, H, I))
    return invalid_argument("moe_down_fp8_tc: need tokens, E <= 256, H a multiple of 128 and I of 128");
  if (N > plan.max_tokens || K != plan.top_k || E != plan.experts)
    return invalid_argument("moe_down_fp8_tc: the plan is bound for other sizes");
  if (!aligned16(h8) || !aligned16(down.q) || !aligned16(slot_out ? static_cast<const void*>(slot_out) : slot_bf16))
    return invalid_argument("moe_down_fp8_tc: operands must be 16-byte aligned");
  CUtensorMap tm_w, tm_a;
  ZEST_RETURN_IF_ERROR(make_map_u8(&tm_w, down.q, static_cast<uint64_t>(E) * H, I, kBN / 2));
  ZEST_RETURN_IF_ERROR(make_map_u8(&tm_a, h8, static_cast<uint64_t>(N) * K, I, kBM));
  TcArgs a{};
  a.a = h8;
  a.a_scale = h_scale;
  a.w_scale = down.scales;
  a.plan = plan;
  a.route_w = weights;
  a.slot_out = slot_out;
  a.out = slot_bf16;
  a.top_k = K;
  a.H = H;
  a.I = I;
  const long long units = static_cast<long long>(moe_max_tiles(N, K, E)) * (H / kBN);
  return launch_tc<TcMode::kDown>(tm_w, tm_a, a, units, stream, "moe_down_fp8_tc");
}
}  // namespace

Status moe_down_fp8_tc(const uint8_t* h8, const float* h_scale, const MoePlan& plan, const float* weights,
                       Fp8Weight down, float* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream) {
  if (!slot_out) return invalid_argument("moe_down_fp8_tc: no slot output");
  return down_tc(h8, h_scale, plan, weights, down, slot_out, nullptr, N, K, E, H, I, stream);
}

Status moe_down_fp8_tc(const uint8_t* h8, const float* h_scale, const MoePlan& plan, const float* weights,
                       Fp8Weight down, bf16* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream) {
  if (!slot_out) return invalid_argument("moe_down_fp8_tc: no slot output");
  return down_tc(h8, h_scale, plan, weights, down, nullptr, slot_out, N, K, E, H, I, stream);
}

}  // namespace zest::cuda
