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
// buy); 2 = as 0 with 2 chunks in flight per warp at three gate/up CTAs per SM.
constexpr int kOneVariants = 3;

// Whether moe_experts_one serves these sizes: N <= 8 tokens, H and I multiples of 32, I * 2 bytes rows of at least
// 128 bytes, and each CTA's share of the down weights of min(E, N * K) experts (plus its h rows) in shared memory.
bool moe_one_ok(int N, int K, int E, int H, int I);

// The function of moe_experts_decode (same arguments and layouts; the plan must be built for these ids). h is
// written by the gate/up kernel and read by the down kernel. Unsupported sizes give an error Status.
Status moe_experts_one(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up, const bf16* down,
                       bf16* h, float* slot_out, int N, int K, int E, int H, int I, int variant, cudaStream_t stream);

}  // namespace zest::cuda
