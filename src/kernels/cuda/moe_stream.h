// Decode experts as one persistent weight-streaming kernel (moe_stream.cu): producer warps issue bulk
// copies (cp.async.bulk, the Hopper copy engine) of weight rows and token rows into a ring of shared-memory stages
// guarded by mbarriers, and consumer warps multiply them on tensor cores. Each CTA walks a flat list of work items,
// first every (expert, 8 or 16 intermediate rows) gate/up item, then every (expert, 16 or 32 output rows) down
// item; a down item waits only for its own expert's gate/up items (per-expert ready counters), and its weight copies
// are issued before that wait. Same function and numerics as moe_experts_decode.
#pragma once
#include <cstdint>

#include "kernels/cuda/kernels.h"

namespace zest::cuda {

// Shapes the streaming kernel takes: H and I positive multiples of 64.
bool moe_stream_ok(int H, int I);
constexpr int kStreamVariants = 2;

// Variants (k chunk, stages, tokens per pass, m16 weight tiles per stage, producer warps, CTAs per SM), both with
// weight rows and down's h rows as 2-D tensor boxes (one copy per 8-64 rows), items claimed two ahead (their expert
// and token range loaded while the item before streams) and a dedicated epilogue warp (double-buffered partial sums:
// the consumer warps never wait for a pass's outputs or the h publish): 0 = 256, 3, 16, 2, 1, 2 (the default up to
// 8 tokens); 1 = 256, 2, 16, 4, 1, 2 (above). Both give bit-identical results (each output row and token column is
// summed the same way). The twelve other forms measured slower were deleted (git history; docs/perf-history.md). The plan must be bound for (N, K, E) (moe_plan_bind) and built; its counters (MoePlan::ready) belong to
// this launch, so launches on one plan must not overlap in time (launches on different plans may). CTAs claim items
// in order, so the launch completes even when only some of its CTAs fit beside other kernels. Unsupported shapes give
// an error Status.
Status moe_experts_stream(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up,
                          const bf16* down, bf16* h, float* slot_out, int N, int K, int E, int H, int I, int variant,
                          cudaStream_t stream);

// The same over block-wise FP8 weights (Fp8Weight, as moe_experts_fp8 takes them): the ring's stages carry 256 FP8
// columns of 64 weight rows and their scales, the consumers turn the bytes into bf16 exactly and scale each 64-column
// step's products in f32; h and slot_out as above (h rounded as the bf16 kernel rounds it). Needs H and I multiples of
// 256 (moe_stream_fp8_ok) and 16-byte aligned operands; the plan's counters as above.
bool moe_stream_fp8_ok(int H, int I);
Status moe_experts_stream_fp8(const bf16* x, const MoePlan& plan, const float* weights, Fp8Weight gate_up,
                              Fp8Weight down, bf16* h, float* slot_out, int N, int K, int E, int H, int I,
                              cudaStream_t stream);

// For tests of the above on a partly occupied GPU: launches `ctas` one-warp CTAs on `stream`, each with the largest
// shared memory a CTA may have (so no CTA of the streaming kernel fits beside one on its multiprocessor). CTA b sets
// started[b] = 1, then spins until *release != 0 or 30 s have passed. `started` and `release` are host memory mapped
// into the device (cudaHostAllocMapped), so the host sees the CTAs start and ends them while they run.
Status hold_multiprocessors(int ctas, int* started, const int* release, cudaStream_t stream);

}  // namespace zest::cuda
