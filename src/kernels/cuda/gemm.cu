// Dense y[M,N] = x[M,K] * W[N,K]^T: a weight-streaming kernel for small M (decode) and cuBLASLt otherwise.
#include <cublasLt.h>

#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "kernels/cuda/common.cuh"

namespace zest::cuda {

Status set_dynamic_smem(const void* fn, size_t smem) {
  if (smem <= 48 * 1024) return Status::ok();
  return cuda_status(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
                     "cudaFuncSetAttribute");
}

Status set_max_carveout(const void* fn) {
  static std::mutex mu;
  static std::set<std::pair<const void*, int>> applied;  // (kernel, GPU): function attributes are per device
  const std::pair<const void*, int> key(fn, current_device());
  std::lock_guard<std::mutex> lock(mu);
  if (applied.count(key)) return Status::ok();
  ZEST_RETURN_IF_ERROR(cuda_status(
      cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared),
      "carveout"));
  applied.insert(key);
  return Status::ok();
}

Status set_min_carveout(const void* fn, int ctas_per_sm, size_t dynamic_smem) {
  cudaFuncAttributes fa{};
  int dev = 0, max_sm = 0, reserved = 0;
  ZEST_RETURN_IF_ERROR(cuda_status(cudaFuncGetAttributes(&fa, fn), "carveout"));
  ZEST_RETURN_IF_ERROR(cuda_status(cudaGetDevice(&dev), "carveout"));
  ZEST_RETURN_IF_ERROR(
      cuda_status(cudaDeviceGetAttribute(&max_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev), "carveout"));
  ZEST_RETURN_IF_ERROR(
      cuda_status(cudaDeviceGetAttribute(&reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev), "carveout"));
  const size_t need = static_cast<size_t>(ctas_per_sm) * (fa.sharedSizeBytes + dynamic_smem + reserved);
  const int pct = max_sm > 0 ? static_cast<int>(std::min<size_t>(100, (100 * need + max_sm - 1) / max_sm)) : -1;
  return cuda_status(cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, pct), "carveout");
}

namespace {

constexpr int kSkinnyMaxM = 8;
constexpr int kSkinnyWarps = 8;

// One warp per output column n: streams row W[n] once (16-byte loads, 4 in flight per lane) and
// multiplies it with all M rows of x (read through L1).
template <int M>
__global__ void __launch_bounds__(kSkinnyWarps * 32) gemm_skinny_kernel(const bf16* __restrict__ x,
                                                                        const bf16* __restrict__ w,
                                                                        bf16* __restrict__ y, int N, int K) {
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int n = blockIdx.x * kSkinnyWarps + (threadIdx.x >> 5);
  if (n >= N) return;
  const bf16* wr = w + static_cast<size_t>(n) * K;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
  constexpr int kUnroll = 4;
  for (int base = lane * 8; base < K; base += 256 * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = base + u * 256;
      wv[u] = k < K ? ld_stream(wr + k) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int k = base + u * 256;
      if (k < K) {
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(m) * K + k));
          acc[m] += dot8(wv[u], xv);
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float v = warp_sum(acc[m]);
    if (lane == 0) y[static_cast<size_t>(m) * N + n] = __float2bfloat16(v);
  }
}

template <int M>
Status launch_skinny(const bf16* x, const bf16* w, bf16* y, int N, int K, cudaStream_t s) {
  return launch("gemm_skinny", gemm_skinny_kernel<M>, dim3((N + kSkinnyWarps - 1) / kSkinnyWarps),
                dim3(kSkinnyWarps * 32), 0, s, x, w, y, N, K);
}

// cuBLASLt state: one handle per GPU (a cuBLASLt context belongs to the device current at its creation), one
// workspace per stream (GEMMs on different streams, e.g. the vision encoder's and the decoder's, run concurrently and
// must not share scratch memory), and the chosen algorithm per (GPU, M, N, K).
struct LtState {
  std::mutex mu;
  std::map<int, cublasLtHandle_t> handles;
  std::map<cudaStream_t, void*> workspaces;
  size_t workspace_bytes = 32u << 20;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<std::tuple<int, int, int, int>, Plan> plans;
};

LtState& lt() {
  static LtState* s = new LtState();
  return *s;
}

Status lt_status(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return internal_error(std::string(what) + ": cuBLASLt status " + std::to_string(static_cast<int>(st)));
}

// Finds (or builds) the cached plan of an (M, N, K) product. Row-major y = x W^T is computed as the
// column-major product y^T[N,M] = W'^T x' where W' = W^T viewed column-major [K,N] and x' = [K,M].
Status lt_plan(int dev, cublasLtHandle_t handle, int M, int N, int K, LtState::Plan** out) {
  LtState& s = lt();
  auto key = std::make_tuple(dev, M, N, K);
  auto it = s.plans.find(key);
  if (it != s.plans.end()) {
    *out = &it->second;
    return Status::ok();
  }
  LtState::Plan p;
  ZEST_RETURN_IF_ERROR(lt_status(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc"));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  ZEST_RETURN_IF_ERROR(lt_status(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, K, N, K), "layout A"));
  ZEST_RETURN_IF_ERROR(lt_status(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, K, M, K), "layout B"));
  ZEST_RETURN_IF_ERROR(lt_status(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_16BF, N, M, N), "layout C"));
  cublasLtMatmulPreference_t pref = nullptr;
  ZEST_RETURN_IF_ERROR(lt_status(cublasLtMatmulPreferenceCreate(&pref), "preference"));
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &s.workspace_bytes,
                                       sizeof(s.workspace_bytes));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  // The heuristic's pick for the row class of M (rows_class) when it also serves M: rows then get the same bits in
  // products of any row count of one class (padded CUDA decode graphs against unpadded steps).
  const int Mc = rows_class(M);
  if (Mc != M) {
    cublasLtMatrixLayout_t bc = nullptr, cc = nullptr;
    cublasLtMatmulHeuristicResult_t check{};
    const bool ok = cublasLtMatrixLayoutCreate(&bc, CUDA_R_16BF, K, Mc, K) == CUBLAS_STATUS_SUCCESS &&
                    cublasLtMatrixLayoutCreate(&cc, CUDA_R_16BF, N, Mc, N) == CUBLAS_STATUS_SUCCESS &&
                    cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, bc, cc, cc, pref, 1, &res, &found) ==
                        CUBLAS_STATUS_SUCCESS &&
                    found > 0 &&
                    cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.c, p.c, &res.algo, &check) ==
                        CUBLAS_STATUS_SUCCESS &&
                    check.workspaceSize <= s.workspace_bytes;
    if (!ok) found = 0;
    if (bc) cublasLtMatrixLayoutDestroy(bc);
    if (cc) cublasLtMatrixLayoutDestroy(cc);
  }
  if (found == 0) st = cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    return internal_error("cuBLASLt found no algorithm for a bf16 GEMM of M=" + std::to_string(M) +
                          " N=" + std::to_string(N) + " K=" + std::to_string(K));
  p.algo = res.algo;
  *out = &s.plans.emplace(key, p).first->second;
  return Status::ok();
}

Status check_dims(const bf16* x, const bf16* w, const bf16* y, int M, int N, int K) {
  if (M <= 0 || N <= 0 || K <= 0)
    return invalid_argument("gemm: sizes must be positive (M=" + std::to_string(M) + " N=" + std::to_string(N) +
                            " K=" + std::to_string(K) + ")");
  if (!x || !w || !y) return invalid_argument("gemm: null pointer");
  return Status::ok();
}

}  // namespace

Status gemm_cublaslt(const bf16* x, const bf16* w, bf16* y, int M, int N, int K, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_dims(x, w, y, M, N, K));
  LtState& s = lt();
  std::lock_guard<std::mutex> lock(s.mu);
  const int dev = current_device();
  cublasLtHandle_t& handle = s.handles[dev];
  if (!handle) ZEST_RETURN_IF_ERROR(lt_status(cublasLtCreate(&handle), "cublasLtCreate"));
  LtState::Plan* p = nullptr;
  ZEST_RETURN_IF_ERROR(lt_plan(dev, handle, M, N, K, &p));
  void*& ws = s.workspaces[stream];
  if (!ws) ZEST_RETURN_IF_ERROR(cuda_status(cudaMalloc(&ws, s.workspace_bytes), "cuBLASLt workspace"));
  const float alpha = 1.f, beta = 0.f;
  note_launch("cublasLtMatmul", stream);
  return lt_status(cublasLtMatmul(handle, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c, &p->algo,
                                  ws, s.workspace_bytes, stream),
                   "cublasLtMatmul");
}

Status gemm(const bf16* x, const bf16* w, bf16* y, int M, int N, int K, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_dims(x, w, y, M, N, K));
  const bool aligned = K % 8 == 0 && (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16 == 0;
  if (aligned && rows_mma_gemm_ok(M, N, K)) return rows_mma_gemm(x, w, y, M, N, K, stream);
  if (M <= kSkinnyMaxM && aligned) {
    switch (M) {
      case 1: return launch_skinny<1>(x, w, y, N, K, stream);
      case 2: return launch_skinny<2>(x, w, y, N, K, stream);
      case 3: return launch_skinny<3>(x, w, y, N, K, stream);
      case 4: return launch_skinny<4>(x, w, y, N, K, stream);
      case 5: return launch_skinny<5>(x, w, y, N, K, stream);
      case 6: return launch_skinny<6>(x, w, y, N, K, stream);
      case 7: return launch_skinny<7>(x, w, y, N, K, stream);
      default: return launch_skinny<8>(x, w, y, N, K, stream);
    }
  }
  return gemm_cublaslt(x, w, y, M, N, K, stream);
}

}  // namespace zest::cuda
