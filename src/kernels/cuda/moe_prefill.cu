// MoE prefill experts: tensor-core grouped GEMMs over the tiles of the device-side plan (MoePlan), gate/up with
// the SiLU*up epilogue, then down with the routing-weight epilogue.
#include <mma.h>

#include <algorithm>
#include <string>

#include "kernels/cuda/common.cuh"

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

Status moe_experts_prefill(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up,
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
