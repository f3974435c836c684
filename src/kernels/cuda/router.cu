// MoE routing: softmax + top-k + renormalisation (one warp per token), SERE re-routing (one CTA per layer) and
// the fused decode routing (top-k, SERE and the expert plan in one CTA).
#include "kernels/cuda/moe_route.cuh"

namespace zest::cuda {

namespace {

constexpr int kRouterWarps = 4;
constexpr int kMaxExperts = kRouteMaxExperts;
constexpr int kMaxTopK = kRouteMaxTopK;
constexpr int kFusedThreads = 512;

__global__ void __launch_bounds__(kRouterWarps * 32) router_topk_kernel(const bf16* __restrict__ logits,
                                                                        const float* __restrict__ bias,
                                                                        int32_t* __restrict__ ids,
                                                                        float* __restrict__ weights, int N, int E,
                                                                        int K) {
  pdl_wait();
  extern __shared__ float probs_all[];
  const int warp = threadIdx.x >> 5;
  const int n = blockIdx.x * kRouterWarps + warp;
  if (n >= N) return;
  route_token_warp(logits + static_cast<size_t>(n) * E, bias, probs_all + warp * E, E, K,
                   ids + static_cast<size_t>(n) * K, weights + static_cast<size_t>(n) * K);
}

__global__ void __launch_bounds__(1024) sere_reroute_kernel(int32_t* __restrict__ ids, float* __restrict__ weights,
                                                            const float* __restrict__ sim, int N, int E, int K,
                                                            int S, float rho) {
  pdl_wait();
  sere_reroute_block(ids, weights, sim, N, E, K, S, rho);
}

// Decode routing in one CTA: router top-k (a warp per token), SERE (when sim != nullptr), the expert plan.
__global__ void __launch_bounds__(kFusedThreads) moe_route_plan_kernel(const bf16* __restrict__ logits,
                                                                       const float* __restrict__ bias,
                                                                       const float* __restrict__ sim, int S, float rho,
                                                                       int32_t* ids, float* weights, MoePlan plan,
                                                                       int64_t* active_count_sum, int N, int E, int K) {
  pdl_wait();
  extern __shared__ float probs_all[];
  const int warp = threadIdx.x >> 5;
  for (int n = warp; n < N; n += kFusedThreads / 32)
    route_token_warp(logits + static_cast<size_t>(n) * E, bias, probs_all + warp * E, E, K,
                     ids + static_cast<size_t>(n) * K, weights + static_cast<size_t>(n) * K);
  __syncthreads();  // the CTA's global writes are visible to the CTA after the barrier
  if (sim) {
    sere_reroute_block(ids, weights, sim, N, E, K, S, rho);
    __syncthreads();
  }
  moe_plan_block(ids, N * K, E, plan, active_count_sum);
}

}  // namespace

Status router_topk(const bf16* logits, const float* bias, int32_t* ids, float* weights, int N, int E, int K,
                   cudaStream_t stream) {
  if (N <= 0 || E <= 0 || E > kMaxExperts || K <= 0 || K > kMaxTopK || K > E)
    return invalid_argument("router_topk: need N > 0, 0 < E <= 1024 and 0 < K <= min(16, E) (N=" + std::to_string(N) +
                            " E=" + std::to_string(E) + " K=" + std::to_string(K) + ")");
  const size_t smem = static_cast<size_t>(kRouterWarps) * E * sizeof(float);
  return launch("router_topk", router_topk_kernel, dim3((N + kRouterWarps - 1) / kRouterWarps),
                dim3(kRouterWarps * 32), smem, stream, logits, bias, ids, weights, N, E, K);
}

Status sere_reroute(int32_t* ids, float* weights, const float* sim, int N, int E, int K, int S, float rho,
                    cudaStream_t stream) {
  if (S <= 0 || S >= K) return Status::ok();
  if (N <= 0 || E <= 0 || E > kMaxExperts || K > kMaxTopK)
    return invalid_argument("sere_reroute: need N > 0, 0 < E <= 1024 and K <= 16 (N=" + std::to_string(N) +
                            " E=" + std::to_string(E) + " K=" + std::to_string(K) + ")");
  if (!sim) return invalid_argument("sere_reroute: the similarity matrix is null");
  return launch("sere_reroute", sere_reroute_kernel, dim3(1), dim3(1024), 0, stream, ids, weights, sim, N, E, K, S,
                rho);
}

Status moe_route_plan(const bf16* logits, const float* bias, const float* sim, int S, float rho, int32_t* ids,
                      float* weights, MoePlan& plan, int64_t* active_count_sum, int N, int E, int K,
                      cudaStream_t stream) {
  if (N <= 0 || E <= 0 || E > kMaxExperts || K <= 0 || K > kMaxTopK || K > E)
    return invalid_argument("moe_route_plan: need N > 0, 0 < E <= 1024 and 0 < K <= min(16, E) (N=" +
                            std::to_string(N) + " E=" + std::to_string(E) + " K=" + std::to_string(K) + ")");
  if (N > plan.max_tokens || K != plan.top_k || E != plan.experts)
    return invalid_argument("moe_route_plan: the plan was bound for other sizes (max_tokens " +
                            std::to_string(plan.max_tokens) + ", top_k " + std::to_string(plan.top_k) + ", experts " +
                            std::to_string(plan.experts) + ")");
  const bool sere = sim != nullptr && S > 0 && S < K;
  const size_t smem = static_cast<size_t>(kFusedThreads / 32) * E * sizeof(float);
  static bool configured = false;
  if (!configured) {
    ZEST_RETURN_IF_ERROR(cuda_status(
        cudaFuncSetAttribute(reinterpret_cast<const void*>(moe_route_plan_kernel),
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>((kFusedThreads / 32) * kMaxExperts * sizeof(float))),
        "cudaFuncSetAttribute"));
    configured = true;
  }
  return launch("moe_route_plan", moe_route_plan_kernel, dim3(1), dim3(kFusedThreads), smem, stream, logits, bias,
                sere ? sim : nullptr, S, rho, ids, weights, plan, active_count_sum, N, E, K);
}

}  // namespace zest::cuda
