// Dense y[M,N] = x[M,K] * W[N,K]^T: a weight-streaming kernel for small M (decode) and cuBLASLt otherwise.
#include <cublasLt.h>

#include <array>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_route.cuh"

namespace zest::cuda {

namespace {

std::array<std::atomic<int>, static_cast<size_t>(DecodeOption::kCount)>& decode_options() {
  static std::array<std::atomic<int>, static_cast<size_t>(DecodeOption::kCount)>* opts = [] {
    auto* o = new std::array<std::atomic<int>, static_cast<size_t>(DecodeOption::kCount)>();
    for (size_t i = 0; i < o->size(); ++i) (*o)[i].store(default_decode_option(static_cast<DecodeOption>(i)));
    return o;
  }();
  return *opts;
}

}  // namespace

int default_decode_option(DecodeOption opt) {
  switch (opt) {
    case DecodeOption::kMoeOccupancy: return 1;
    case DecodeOption::kAttentionKernel: return 1;
    default: return 0;
  }
}

void set_decode_option(DecodeOption opt, int value) {
  const auto i = static_cast<size_t>(opt);
  if (i < decode_options().size()) decode_options()[i].store(value);
}

int decode_option(DecodeOption opt) {
  const auto i = static_cast<size_t>(opt);
  return i < decode_options().size() ? decode_options()[i].load() : 0;
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

// cuBLASLt state: one handle, one workspace per stream (GEMMs on different streams, e.g. the vision
// encoder's and the decoder's, run concurrently and must not share scratch memory), and the chosen
// algorithm per (M, N, K).
struct LtState {
  std::mutex mu;
  cublasLtHandle_t handle = nullptr;
  std::map<cudaStream_t, void*> workspaces;
  size_t workspace_bytes = 32u << 20;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  std::map<std::tuple<int, int, int>, Plan> plans;
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
Status lt_plan(int M, int N, int K, LtState::Plan** out) {
  LtState& s = lt();
  auto key = std::make_tuple(M, N, K);
  auto it = s.plans.find(key);
  if (it != s.plans.end()) {
    *out = &it->second;
    return Status::ok();
  }
  if (!s.handle) ZEST_RETURN_IF_ERROR(lt_status(cublasLtCreate(&s.handle), "cublasLtCreate"));
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
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(s.handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &res, &found);
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
  LtState::Plan* p = nullptr;
  ZEST_RETURN_IF_ERROR(lt_plan(M, N, K, &p));
  void*& ws = s.workspaces[stream];
  if (!ws) ZEST_RETURN_IF_ERROR(cuda_status(cudaMalloc(&ws, s.workspace_bytes), "cuBLASLt workspace"));
  const float alpha = 1.f, beta = 0.f;
  return lt_status(cublasLtMatmul(s.handle, p->desc, &alpha, w, p->a, x, p->b, &beta, y, p->c, y, p->c, &p->algo,
                                  ws, s.workspace_bytes, stream),
                   "cublasLtMatmul");
}

namespace {

bool fusable(const bf16* x, const bf16* w, int M, int N, int K) {
  const bool aligned = K % 8 == 0 && (reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(w)) % 16 == 0;
  return decode_option(DecodeOption::kFuseEpilogues) == 1 && aligned && rows_mma_gemm_ok(M, N, K);
}

}  // namespace

Status gemm_add_rmsnorm(const bf16* x, const bf16* w, bf16* out, bf16* x_res, const bf16* norm_w, bf16* xn, int M,
                        int N, int K, float eps, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_dims(x, w, out, M, N, K));
  if (!x_res || !norm_w || !xn) return invalid_argument("gemm_add_rmsnorm: null pointer");
  if (fusable(x, w, M, N, K) && N % 8 == 0) {
    RowsEpilogue epi;
    epi.kind = 1;
    epi.x_res = x_res;
    epi.norm_w = norm_w;
    epi.xn = xn;
    epi.eps = eps;
    return rows_mma_gemm(x, w, out, M, N, K, stream, &epi);
  }
  ZEST_RETURN_IF_ERROR(gemm(x, w, out, M, N, K, stream));
  return add_rmsnorm(x_res, out, norm_w, xn, M, N, eps, stream);
}

Status gemm_router_topk(const bf16* x, const bf16* w_router, bf16* logits, const float* bias, int32_t* ids,
                        float* weights, int N, int E, int H, int K, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_dims(x, w_router, logits, N, E, H));
  if (!ids || !weights) return invalid_argument("gemm_router_topk: null pointer");
  if (fusable(x, w_router, N, E, H) && E <= 256 && K >= 1 && K <= kRouterMaxTopK && K <= E) {
    RowsEpilogue epi;
    epi.kind = 2;
    epi.bias = bias;
    epi.ids = ids;
    epi.route_w = weights;
    epi.top_k = K;
    return rows_mma_gemm(x, w_router, logits, N, E, H, stream, &epi);
  }
  ZEST_RETURN_IF_ERROR(gemm(x, w_router, logits, N, E, H, stream));
  return router_topk(logits, bias, ids, weights, N, E, K, stream);
}

Status gemm_qk_norm_rope_kv(const bf16* x, const bf16* w_qkv, bf16* qkv, int K, const bf16* q_norm, const bf16* k_norm,
                            const int32_t* pos, int pos_stride, RopeParams rope, const int32_t* slot_mapping,
                            bf16* k_cache, bf16* v_cache, int T, int Hq, int Hkv, int D, float eps, cudaStream_t stream) {
  const int N = (Hq + 2 * Hkv) * D;
  ZEST_RETURN_IF_ERROR(check_dims(x, w_qkv, qkv, T, N, K));
  if (Hq <= 0 || Hkv <= 0 || Hq % Hkv != 0 || D <= 0 || D % 2 != 0 || pos_stride < 0 || !pos ||
      (slot_mapping && (!k_cache || !v_cache)))
    return qk_norm_rope_kv(qkv, q_norm, k_norm, pos, pos_stride, rope, slot_mapping, k_cache, v_cache, T, Hq, Hkv, D,
                           eps, stream);  // reports the bad argument
  if (fusable(x, w_qkv, T, N, K) && D % 16 == 0 && Hq + 2 * Hkv <= 1024) {
    RowsEpilogue epi;
    epi.kind = 3;
    epi.eps = eps;
    epi.q_norm = q_norm;
    epi.k_norm = k_norm;
    epi.pos = pos;
    epi.pos_stride = pos_stride;
    epi.rope = rope;
    epi.slot_mapping = slot_mapping;
    epi.k_cache = k_cache;
    epi.v_cache = v_cache;
    epi.q_heads = Hq;
    epi.kv_heads = Hkv;
    epi.head_dim = D;
    return rows_mma_gemm(x, w_qkv, qkv, T, N, K, stream, &epi);
  }
  ZEST_RETURN_IF_ERROR(gemm(x, w_qkv, qkv, T, N, K, stream));
  return qk_norm_rope_kv(qkv, q_norm, k_norm, pos, pos_stride, rope, slot_mapping, k_cache, v_cache, T, Hq, Hkv, D, eps,
                         stream);
}

Status moe_route(const bf16* x, const bf16* w_router, bf16* logits, const float* bias, int32_t* ids, float* weights,
                 int N, int E, int H, int K, const float* sim, int S, float rho, MoePlan* plan,
                 int64_t* active_count_sum, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_dims(x, w_router, logits, N, E, H));
  if (!ids || !weights) return invalid_argument("moe_route: null pointer");
  const bool sere = sim && S > 0 && S < K;
  if (plan && (N > plan->max_tokens || K != plan->top_k || E != plan->experts))
    return invalid_argument("moe_route: the plan was bound for other sizes");
  if (fusable(x, w_router, N, E, H) && E <= kRouteMaxE && K >= 1 && K <= kRouterMaxTopK && K <= E &&
      N * K <= kRouteMaxNK && (!sere || E <= kRouteSereMaxE)) {
    RowsEpilogue epi;
    epi.kind = 2;
    epi.bias = bias;
    epi.ids = ids;
    epi.route_w = weights;
    epi.top_k = K;
    epi.sere_sim = sere ? sim : nullptr;
    epi.sere_s = S;
    epi.sere_rho = rho;
    epi.plan = plan;
    epi.count_sum = active_count_sum;
    return rows_mma_gemm(x, w_router, logits, N, E, H, stream, &epi);
  }
  ZEST_RETURN_IF_ERROR(gemm(x, w_router, logits, N, E, H, stream));
  ZEST_RETURN_IF_ERROR(router_topk(logits, bias, ids, weights, N, E, K, stream));
  if (sere) ZEST_RETURN_IF_ERROR(sere_reroute(ids, weights, sim, N, E, K, S, rho, stream));
  if (plan) ZEST_RETURN_IF_ERROR(moe_plan(ids, N, K, E, *plan, active_count_sum, stream));
  return Status::ok();
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
