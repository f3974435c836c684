// Decode experts at one token (moe_one.cu): rows_mma's gate/up and down kernels (same arithmetic, same bits) with the
// first gate/up item's plan entries loaded beside the active count, one-barrier epilogues and the down CTAs loading
// their first item's weights and prefetching their next items before their programmatic-dependent-launch wait.
#pragma once
#include <cstdint>

#include "kernels/cuda/kernels.h"

namespace zest::cuda {

// The layer's MoE combine folded into the down kernel: the last of its CTAs to finish
// (an exit counter) runs moe_combine_add_rmsnorm on x / y for the N tokens, the same bits as that launch. `done` is
// one device word, zero before the first launch; the last CTA sets it back to zero. Needs moe_one_combine_ok(H).
struct OneCombine {
  bf16* x = nullptr;             // [N, H] residual, updated in place
  const int32_t* ids = nullptr;  // [N, K] routing ids (-1: empty slot)
  const bf16* w = nullptr;       // the next RMSNorm's weight, or null (x only)
  bf16* y = nullptr;             // [N, H] normalised rows
  float eps = 0.f;
  unsigned* done = nullptr;
  // Down by output rows (moe_one_rows_ok; w and y null): a cluster of two CTAs computes rows [16 b, 16 b + 16) of
  // every active expert (each rank half of them, weight rows bulk-copied before the wait) and adds the slots to x
  // itself (the same bits as the chain's x; no exit counter, no last CTA, done unused); the next RMSNorm is left to
  // the next kernel (gemm_kv_prefetch with KvPrefetch::norm_w).
  bool rows = false;
};
bool moe_one_rows_ok(int N, int K, int E, int H, int I);
bool moe_one_combine_ok(int H);

// Whether moe_experts_one serves these sizes: 1 <= N <= 8 tokens, 1 <= K <= E, H and I positive multiples of 32.
bool moe_one_ok(int N, int K, int E, int H, int I);

// The function of moe_experts_decode (same arguments and layouts; the plan must be built for these ids). h is
// written by the gate/up kernel and read by the down kernel. Unsupported sizes give an error Status. stamps (tests):
// when not null, globaltimer stamps [2 * gate/up grid + 3 * down grid] (grids from moe_one_grids): gate/up CTA b
// after its wait and at its end; down CTA b at entry, after its wait and at its end.
Status moe_experts_one(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up, const bf16* down,
                       bf16* h, float* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream,
                       uint64_t* stamps = nullptr, const OneCombine* combine = nullptr);
// The gate/up and down grids of moe_experts_one for these sizes.
void moe_one_grids(int N, int K, int E, int H, int I, int* gate_up_grid, int* down_grid);

}  // namespace zest::cuda
