// Decode experts at one token (moe_one.cu): a gate/up kernel and a down kernel whose CTAs bulk-copy (TMA) their share
// of the down weights into shared memory before their programmatic-dependent-launch wait, so that the down weights
// stream from HBM while gate/up runs and the down kernel only computes once gate/up has finished. Same function and
// the same bits as the rows_mma gate/up + down kernels (same k split, accumulation order and fixed-order sums).
#pragma once
#include <cstdint>

#include "kernels/cuda/kernels.h"

namespace zest::cuda {

// Variants (DecodeOption::kMoeKernel 16 + variant): 0 = gate/up with 4 chunks in flight per warp at two CTAs per SM,
// the down weights copied before the wait; 1 = as 0 with the down copies issued after the wait (what the early copies
// buy); 2 = as 0 with 2 chunks in flight per warp at three gate/up CTAs per SM; 3 = as 0 with the gate/up items after
// each CTA's first claimed in order from a counter (MoePlan::ready, as moe_experts_stream uses it: launches on one plan
// must not overlap); 4 = as 0 with each CTA's next gate/up item prefetched into L2 when an item starts; 5 = as 4, and
// the k of the current item beyond its first round of register loads prefetched too; 6 = as 0 with down CTAs of 4
// warps (2 tiles each; fewer registers beside the gate/up CTAs); 7 = as 1, and each gate/up CTA prefetches an equal
// share of the step's down weights into L2 right after its wait (a ninth warp); 8 = as 7 with the down copies
// before the wait by down CTAs of 4 warps; 9 = gate/up as rows_mma's (2 chunks in flight, three CTAs per SM, 80
// registers) with evict-first weight loads, warp 0 prefetching the CTA's share of the down weights into L2 after its
// first loads, down copies after the wait; 10 = as 9 without the evict-first policy; 11 = as 10 without the L2
// prefetch; 12 = as 9, and warp 0 also prefetches the rest of its CTA's gate/up item (beyond the first round of loads)
// into L2; 13 = as 12 without the down weights' prefetch; 14 = as 9 with the down kernel streaming its weights (from
// L2) through registers, as rows_mma's down kernel (3 CTAs per SM, no dynamic shared memory); 15 = as 12 with that
// down kernel; 16 = as 14 without prefetches or evict-first policy (rows_mma's two kernels, cloned); 17 = as 16 with
// each down CTA loading its first item's weights into registers and prefetching its later items into L2 before its
// wait.
constexpr int kOneVariants = 18;

// Whether moe_experts_one serves these sizes: N <= 8 tokens, H and I multiples of 32, I * 2 bytes rows of at least
// 128 bytes, and each CTA's share of the down weights of min(E, N * K) experts (plus its h rows) in shared memory.
bool moe_one_ok(int N, int K, int E, int H, int I);

// The function of moe_experts_decode (same arguments and layouts; the plan must be built for these ids). h is
// written by the gate/up kernel and read by the down kernel. Unsupported sizes give an error Status. stamps (tests):
// when not null, globaltimer stamps [2 * gate/up grid + 5 * down grid] (grids from moe_one_grids): gate/up CTA b
// after its wait and at its end; down CTA b at entry, copies issued, after its wait, tiles landed and at its end.
Status moe_experts_one(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up, const bf16* down,
                       bf16* h, float* slot_out, int N, int K, int E, int H, int I, int variant, cudaStream_t stream,
                       uint64_t* stamps = nullptr);
// The gate/up and down grids of moe_experts_one for these sizes and variant.
void moe_one_grids(int N, int K, int E, int H, int I, int variant, int* gate_up_grid, int* down_grid);

}  // namespace zest::cuda
