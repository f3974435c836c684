// The MoE half of a decode layer in one persistent launch (CUDA-side header).
//
// moe_block_decode replaces the chain add_rmsnorm -> moe_route -> moe_experts_decode (rows_mma) ->
// moe_combine_add_rmsnorm for steps of at most 8 tokens: x = bf16(x + o); xn' = rmsnorm(x, post_norm); router logits
// xn' * router_w^T (bf16-rounded fp32 sums) + softmax/top-k/renormalisation into ids / weights [T, K]; gate/up
// (SiLU(gate) * up rounded to bf16), down scaled by the routing weight; x = bf16(x + bf16(sum_k slot outputs));
// xn = rmsnorm(x, next_norm) (skipped when next_norm is null). Same rounding points and summation orders as those
// kernels, so the outputs are the chain's bits. *active_count_sum (optional) += the distinct experts of the step.
//
// One cooperative launch (every CTA resident), phases separated by grid barriers on counters in `workspace`:
//   A. every CTA adds and normalises the T rows itself; the first ceil(E / 8) CTAs compute 8 experts' logits each
//      (router rows bulk-copied into shared memory before the wait on the previous kernel);
//   B. every CTA runs the top-k and builds the expert list in shared memory; CTA 0 writes ids / weights; CTAs compute
//      gate/up items (expert, 16 intermediate rows) into h, the weights bulk-copied into a ring of shared-memory
//      stages (DecodeOption::kMoeBlock 3: register loads), then start the bulk copies of their down tiles;
//   C. CTA g owns output rows [16 g, 16 g + 16) of every active expert's down projection (tiles double-buffered in
//      shared memory) and combines them with the residual for those columns;
//   D. CTA t < T normalises row t.
// The workspace (moe_block_workspace_bytes) must be zero-filled once when allocated; it is never reset afterwards
// (barrier generations). Launches that may run at the same time (two streams) need two workspaces. With
// workspace == nullptr the function uses one of its own per stream (allocated at the first such launch on the
// stream, which must not be inside a stream capture).
#pragma once
#include "kernels/cuda/kernels.h"

namespace zest::cuda {

// Whether moe_block_decode serves these sizes on this device: 1 <= T <= 8, 1 <= K <= min(16, E), E <= 256,
// H a multiple of 32 up to 2048, I a multiple of 32 up to 1024, cooperative launches and the shared memory.
bool moe_block_ok(int T, int H, int E, int K, int I);
// Workspace bytes for up to max_tokens tokens.
size_t moe_block_workspace_bytes(int max_tokens, int E, int K, int I);

// x [T, H] (updated in place), o [T, H] (the attention output projection), post_norm / next_norm [H] RMSNorm weights,
// router_w [E, H], router_bias [E] fp32 or null, gate_up / down as in kernels.h, xn [T, H] out, ids / weights [T, K]
// out, logits [T, E] bf16 out or null.
Status moe_block_decode(bf16* x, const bf16* o, const bf16* post_norm, const bf16* router_w, const float* router_bias,
                        const bf16* gate_up, const bf16* down, const bf16* next_norm, bf16* xn, int32_t* ids,
                        float* weights, bf16* logits, int64_t* active_count_sum, void* workspace,
                        size_t workspace_bytes, int T, int H, int E, int K, int I, float eps, cudaStream_t stream);

}  // namespace zest::cuda
