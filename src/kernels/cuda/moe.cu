// MoE experts: the device-side plan (per-expert slot lists, no host sync) and the decode path (weight-streaming
// kernels that read each active expert once). The prefill path (grouped GEMMs over tiles) is in moe_prefill.cu.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_one.h"
#include "kernels/cuda/moe_stream.h"

namespace zest::cuda {

namespace {

constexpr int kMaxExperts = 1024;
constexpr int kPlanStage = 4096;  // slot ids staged in shared memory by moe_plan_kernel (16 KiB)
constexpr int kPlanSlotE = 256;   // slot-per-thread path: at most blockDim slots and this many experts
// The decode experts by batch. One token: moe_one (rows_mma's two kernels with the first gate/up item's plan entries
// loaded beside the active count, one-barrier epilogues and the down CTAs' first weights loaded before their wait; the
// same bits): batch-1 TPOT 2.742 ms against 2.853 with rows_mma, SERE S=2 2.306 against 2.445 (H200, d84b9e8). More
// tokens: the streaming kernel, form 0 (tensor boxes, two m16 tiles per stage, items claimed ahead, epilogue warp) up
// to 8 tokens, form 1 (as 0 with four m16 tiles, two stages) above. Measured on H200 (Qwen3-30B-A3B shapes, 48 layers,
// context 1024, TPOT at 6ca2520): batch 8 / 32 / 64 rows_mma 9.456 / 18.097 / 21.365 ms, form 0 8.477 / 16.365 /
// 19.037, form 1 8.534 / 16.062 / 18.653. The streaming kernel claims its items in order, so it completes whatever
// share of the GPU it gets (two decoders on two streams at once). Sizes a kernel does not take go to rows_mma's
// tensor-core kernels (H and I multiples of 32), else the CUDA-core kernels below.
constexpr int kStreamMaxFormZero = 8;  // tokens

// ---- plan ------------------------------------------------------------------------------------------------

__global__ void __launch_bounds__(1024) moe_plan_kernel(const int32_t* __restrict__ ids, int NK, int E,
                                                        MoePlan plan, int64_t* active_count_sum) {
  pdl_wait();
  __shared__ int counts[kMaxExperts];
  __shared__ int offset_of[kMaxExperts];
  // Slot ids staged for the per-expert scans, or per-warp counts [32][E] of the slot-per-thread path.
  __shared__ int scratch[kPlanStage > 32 * kPlanSlotE ? kPlanStage : 32 * kPlanSlotE];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  // Slot-per-thread path (decode batches): thread i holds slot i; its rank among equal ids is the warp's match
  // mask below its lane plus the counts of the same id in earlier warps. Three barriers, no loops over slots.
  const bool per_thread = NK <= static_cast<int>(blockDim.x) && E <= kPlanSlotE;
  int my_id = -1;
  unsigned below = 0;
  // Otherwise decode-sized id lists are staged in shared memory once (every warp scans them for each of its
  // experts; from global memory those scans were a chain of dependent L2 round trips).
  const bool staged = !per_thread && NK <= kPlanStage;
  if (per_thread) {
    for (int i = threadIdx.x; i < nwarps * E; i += blockDim.x) scratch[i] = 0;
    my_id = static_cast<int>(threadIdx.x) < NK ? __ldg(ids + threadIdx.x) : -1;
    if (my_id >= E) my_id = -1;
    const unsigned peers = __match_any_sync(0xffffffffu, my_id >= 0 ? my_id : E + lane);
    below = peers & ((1u << lane) - 1u);
    __syncthreads();
    if (my_id >= 0 && below == 0) scratch[warp * E + my_id] = __popc(peers);
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {  // exclusive prefix over warps, total count
      int c = 0;
      for (int w = 0; w < nwarps; ++w) {
        const int t = scratch[w * E + e];
        scratch[w * E + e] = c;
        c += t;
      }
      counts[e] = c;
    }
    __syncthreads();
  } else {
    if (staged) {
      for (int i = threadIdx.x; i < NK; i += blockDim.x) scratch[i] = __ldg(ids + i);
      __syncthreads();
    }
    const int32_t* src = staged ? scratch : ids;
    for (int e = warp; e < E; e += nwarps) {
      int c = 0;
      for (int base = 0; base < NK; base += 32) {
        const int i = base + lane;
        const int id = i < NK ? src[i] : -1;
        c += __popc(__ballot_sync(0xffffffffu, id == e));
      }
      if (lane == 0) counts[e] = c;
    }
    __syncthreads();
  }
  if (warp == 0) moe_plan_scan_warp(counts, E, plan, offset_of, active_count_sum);
  __syncthreads();
  if (per_thread) {
    if (my_id >= 0) plan.sorted_slots[offset_of[my_id] + scratch[warp * E + my_id] + __popc(below)] = threadIdx.x;
    return;
  }
  const int32_t* src = staged ? scratch : ids;
  for (int e = warp; e < E; e += nwarps) {
    if (counts[e] == 0) continue;
    int pos = offset_of[e];
    for (int base = 0; base < NK; base += 32) {
      const int i = base + lane;
      const int id = i < NK ? src[i] : -1;
      const unsigned m = __ballot_sync(0xffffffffu, id == e);
      if (id == e) plan.sorted_slots[pos + __popc(m & ((1u << lane) - 1))] = i;
      pos += __popc(m);
    }
  }
}

// ---- decode experts -----------------------------------------------------------------------------------------

constexpr int kTok = 8;       // tokens per pass over a weight row
constexpr int kExpWarps = 8;  // warps per CTA

// gate/up: item = (active expert j, 8 intermediate rows); warp w computes row i = 8*group + w for gate and up.
__global__ void __launch_bounds__(kExpWarps * 32) moe_gate_up_decode_kernel(const bf16* __restrict__ x, MoePlan plan,
                                                                            const bf16* __restrict__ gate_up,
                                                                            bf16* __restrict__ h, int K, int H, int I) {
  pdl_wait();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* xs = reinterpret_cast<bf16*>(smem_raw);  // [kTok][H]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int groups = (I + kExpWarps - 1) / kExpWarps;
  const int items = *plan.num_active * groups;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int j = item / groups, i = (item % groups) * kExpWarps + warp;
    const int e = plan.active_experts[j];
    const int beg = plan.offsets[j], end = plan.offsets[j + 1];
    const bf16* wg = gate_up + (static_cast<size_t>(e) * 2 * I + i) * H;
    const bf16* wu = wg + static_cast<size_t>(I) * H;
    for (int c0 = beg; c0 < end; c0 += kTok) {
      const int nt = min(kTok, end - c0);
      __syncthreads();
      for (int v = threadIdx.x; v < nt * H / 8; v += blockDim.x) {
        const int t = v / (H / 8), c = (v % (H / 8)) * 8;
        const int tok = plan.sorted_slots[c0 + t] / K;
        *reinterpret_cast<uint4*>(xs + t * H + c) = *reinterpret_cast<const uint4*>(x + static_cast<size_t>(tok) * H + c);
      }
      __syncthreads();
      if (i >= I) continue;
      float ag[kTok], au[kTok];
#pragma unroll
      for (int t = 0; t < kTok; ++t) ag[t] = au[t] = 0.f;
      constexpr int kU = 4;
      for (int base = lane * 8; base < H; base += 256 * kU) {
        uint4 g4[kU], u4[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int k = base + u * 256;
          g4[u] = k < H ? ld_stream(wg + k) : make_uint4(0, 0, 0, 0);
          u4[u] = k < H ? ld_stream(wu + k) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int k = base + u * 256;
          if (k >= H) break;
#pragma unroll
          for (int t = 0; t < kTok; ++t) {
            if (t >= nt) break;
            const uint4 xv = *reinterpret_cast<const uint4*>(xs + t * H + k);
            ag[t] += dot8(g4[u], xv);
            au[t] += dot8(u4[u], xv);
          }
        }
      }
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        if (t >= nt) break;
        const float g = bf16_round(warp_sum(ag[t]));
        const float u = bf16_round(warp_sum(au[t]));
        if (lane == t) {
          const float s = bf16_round(g / (1.f + __expf(-g)));
          h[static_cast<size_t>(c0 + t) * I + i] = __float2bfloat16(s * u);
        }
      }
    }
  }
}

// down: item = (active expert j, 32 output rows); 8 lanes per row, 4 rows per warp.
__global__ void __launch_bounds__(kExpWarps * 32) moe_down_decode_kernel(MoePlan plan, const float* __restrict__ weights,
                                                                         const bf16* __restrict__ down,
                                                                         const bf16* __restrict__ h,
                                                                         float* __restrict__ slot_out, int H, int I) {
  pdl_wait();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  bf16* hs = reinterpret_cast<bf16*>(smem_raw);  // [kTok][I]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane & 7;
  constexpr int kRowsPerItem = kExpWarps * 4;
  const int groups = (H + kRowsPerItem - 1) / kRowsPerItem;
  const int items = *plan.num_active * groups;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int j = item / groups;
    const int r = (item % groups) * kRowsPerItem + warp * 4 + (lane >> 3);
    const int e = plan.active_experts[j];
    const int beg = plan.offsets[j], end = plan.offsets[j + 1];
    const bf16* wr = down + (static_cast<size_t>(e) * H + r) * I;
    for (int c0 = beg; c0 < end; c0 += kTok) {
      const int nt = min(kTok, end - c0);
      __syncthreads();
      for (int v = threadIdx.x; v < nt * I / 8; v += blockDim.x)
        reinterpret_cast<uint4*>(hs)[v] = reinterpret_cast<const uint4*>(h + static_cast<size_t>(c0) * I)[v];
      __syncthreads();
      float acc[kTok];
#pragma unroll
      for (int t = 0; t < kTok; ++t) acc[t] = 0.f;
      if (r < H) {
        constexpr int kU = 4;
        for (int base = sub * 8; base < I; base += 64 * kU) {
          uint4 w4[kU];
#pragma unroll
          for (int u = 0; u < kU; ++u) {
            const int k = base + u * 64;
            w4[u] = k < I ? ld_stream(wr + k) : make_uint4(0, 0, 0, 0);
          }
#pragma unroll
          for (int u = 0; u < kU; ++u) {
            const int k = base + u * 64;
            if (k >= I) break;
#pragma unroll
            for (int t = 0; t < kTok; ++t) {
              if (t >= nt) break;
              acc[t] += dot8(w4[u], *reinterpret_cast<const uint4*>(hs + t * I + k));
            }
          }
        }
      }
#pragma unroll
      for (int t = 0; t < kTok; ++t) {
        float v = acc[t];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        v += __shfl_xor_sync(0xffffffffu, v, 4);
        acc[t] = v;
      }
      if (r < H && sub < nt) {
        float v = acc[0];
#pragma unroll
        for (int t = 1; t < kTok; ++t)
          if (sub == t) v = acc[t];
        const int slot = plan.sorted_slots[c0 + sub];
        slot_out[static_cast<size_t>(slot) * H + r] = bf16_round(bf16_round(v) * weights[slot]);
      }
    }
  }
}

Status check_moe(const char* op, int N, int K, int E, int H, int I) {
  if (N <= 0 || K <= 0 || E <= 0 || E > kMaxExperts || K > E || H <= 0 || I <= 0 || H % 8 != 0 || I % 8 != 0)
    return invalid_argument(std::string(op) + ": need N, K > 0, K <= E <= 1024 and H, I positive multiples of 8 (N=" +
                            std::to_string(N) + " K=" + std::to_string(K) + " E=" + std::to_string(E) +
                            " H=" + std::to_string(H) + " I=" + std::to_string(I) + ")");
  return Status::ok();
}

// Grid of a persistent kernel: enough CTAs to fill the GPU, at most `items`.
Status persistent_grid(const void* kernel, size_t smem, int items, int* grid) {
  int per_sm = 0;
  ZEST_RETURN_IF_ERROR(cuda_status(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kExpWarps * 32, smem), "occupancy"));
  *grid = std::max(1, std::min(items, std::max(1, per_sm) * sm_count()));
  return Status::ok();
}

}  // namespace

int moe_max_tiles(int N, int K, int E) { return (N * K + kMoeTileM - 1) / kMoeTileM + E; }

size_t moe_plan_bytes(int N, int K, int E) {
  const size_t ints =
      2 + E + (E + 1) + static_cast<size_t>(N) * K + 2 * static_cast<size_t>(moe_max_tiles(N, K, E)) + (E + 1) +
      (static_cast<size_t>(N) * K + kMoePlanCtaSlots - 1) / kMoePlanCtaSlots * E;
  return (ints * sizeof(int32_t) + 255) / 256 * 256;
}

void moe_plan_bind(MoePlan& plan, void* buffer, int N, int K, int E) {
  int32_t* p = static_cast<int32_t*>(buffer);
  plan.num_active = p++;
  plan.num_tiles = p++;
  plan.active_experts = p;
  p += E;
  plan.offsets = p;
  p += E + 1;
  plan.sorted_slots = p;
  p += static_cast<size_t>(N) * K;
  plan.tile_active = p;
  p += moe_max_tiles(N, K, E);
  plan.tile_start = p;
  p += moe_max_tiles(N, K, E);
  plan.ready = reinterpret_cast<uint32_t*>(p);
  p += E + 1;
  plan.cta_counts = p;
  plan.max_tokens = N;
  plan.top_k = K;
  plan.experts = E;
}

Status moe_plan_reset_counters(const MoePlan& plan, cudaStream_t stream) {
  if (plan.ready == nullptr || plan.experts <= 0)
    return invalid_argument("moe_plan_reset_counters: the plan is not bound");
  return cuda_status(cudaMemsetAsync(plan.ready, 0, (static_cast<size_t>(plan.experts) + 1) * sizeof(uint32_t), stream),
                     "moe_plan_reset_counters");
}

Status moe_plan(const int32_t* ids, int N, int K, int E, MoePlan& plan, int64_t* active_count_sum, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_moe("moe_plan", N, K, E, 8, 8));
  if (N > plan.max_tokens || K != plan.top_k || E != plan.experts)
    return invalid_argument("moe_plan: the plan was bound for other sizes (max_tokens " +
                            std::to_string(plan.max_tokens) + ", top_k " + std::to_string(plan.top_k) + ", experts " +
                            std::to_string(plan.experts) + ")");
  return launch("moe_plan", moe_plan_kernel, dim3(1), dim3(1024), 0, stream, ids, N * K, E, plan, active_count_sum);
}

namespace {
__global__ void local_expert_ids_kernel(const int32_t* __restrict__ ids, int32_t* __restrict__ out, int n, int first,
                                        int count) {
  pdl_wait();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int id = ids[i];
  out[i] = id >= first && id < first + count ? id - first : -1;
}
}  // namespace

Status local_expert_ids(const int32_t* ids, int32_t* out, int n, int first, int count, cudaStream_t stream) {
  if (n <= 0 || first < 0 || count <= 0) return invalid_argument("local_expert_ids: need ids and a range of experts");
  return launch("local_expert_ids", local_expert_ids_kernel, dim3((n + 255) / 256), dim3(256), 0, stream, ids, out, n,
                first, count);
}

Status moe_experts_decode(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up,
                          const bf16* down, bf16* h, float* slot_out, int N, int K, int E, int H, int I,
                          cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_moe("moe_experts_decode", N, K, E, H, I));
  if (N <= 1) {
    if (moe_one_ok(N, K, E, H, I))
      return moe_experts_one(x, plan, weights, gate_up, down, h, slot_out, N, K, E, H, I, stream);
  } else if (moe_stream_ok(H, I)) {
    return moe_experts_stream(x, plan, weights, gate_up, down, h, slot_out, N, K, E, H, I,
                              N <= kStreamMaxFormZero ? 0 : 1, stream);
  }
  if (rows_mma_moe_ok(H, I)) return rows_mma_moe(x, plan, weights, gate_up, down, h, slot_out, N, K, E, H, I, stream);
  const size_t smem_gu = static_cast<size_t>(kTok) * H * sizeof(bf16);
  const size_t smem_dn = static_cast<size_t>(kTok) * I * sizeof(bf16);
  constexpr size_t kMaxSmem = static_cast<size_t>(kTok) * 8192 * sizeof(bf16);
  if (smem_gu > kMaxSmem || smem_dn > kMaxSmem)
    return unsupported("moe_experts_decode: hidden or expert width above 8192 is not supported");
  const cudaError_t configured = once_per_device<cudaError_t>([&] {  // function attributes are per GPU
    for (const void* fn : {reinterpret_cast<const void*>(moe_gate_up_decode_kernel),
                           reinterpret_cast<const void*>(moe_down_decode_kernel)})
      if (!set_dynamic_smem(fn, kMaxSmem).is_ok()) return cudaErrorInvalidValue;
    return cudaSuccess;
  });
  ZEST_RETURN_IF_ERROR(cuda_status(configured, "moe_experts_decode: shared memory attribute"));
  // Upper bound of work items: every expert with tokens (at most min(E, N*K)).
  const int max_active = std::min(E, N * K);
  int grid_gu = 0, grid_dn = 0;
  ZEST_RETURN_IF_ERROR(persistent_grid(reinterpret_cast<const void*>(moe_gate_up_decode_kernel), smem_gu,
                                       max_active * ((I + kExpWarps - 1) / kExpWarps), &grid_gu));
  ZEST_RETURN_IF_ERROR(persistent_grid(reinterpret_cast<const void*>(moe_down_decode_kernel), smem_dn,
                                       max_active * ((H + kExpWarps * 4 - 1) / (kExpWarps * 4)), &grid_dn));
  ZEST_RETURN_IF_ERROR(launch("moe_gate_up_decode", moe_gate_up_decode_kernel, dim3(grid_gu), dim3(kExpWarps * 32),
                              smem_gu, stream, x, plan, gate_up, h, K, H, I));
  return launch("moe_down_decode", moe_down_decode_kernel, dim3(grid_dn), dim3(kExpWarps * 32), smem_dn, stream, plan,
                weights, down, h, slot_out, H, I);
}

// One token on moe_one: the down kernel by output rows (OneCombine::rows) when the caller leaves the next RMSNorm to
// the next kernel (x only).
bool moe_down_rows_on(int N, int K, int E, int H, int I) {
  return N <= 1 && moe_one_ok(N, K, E, H, I) && moe_one_rows_ok(N, K, E, H, I);
}

Status moe_experts_decode_combine(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up,
                                  const bf16* down, bf16* h, float* slot_out, int N, int K, int E, int H, int I,
                                  bf16* cx, const int32_t* ids, const bf16* cw, bf16* cy, float eps, unsigned* done,
                                  cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_moe("moe_experts_decode_combine", N, K, E, H, I));
  // One token, x only (the caller normalises later): the down kernel by output rows adds the slots itself.
  if (!cw && !cy && moe_down_rows_on(N, K, E, H, I)) {
    OneCombine c;
    c.x = cx;
    c.ids = ids;
    c.rows = true;
    return moe_experts_one(x, plan, weights, gate_up, down, h, slot_out, N, K, E, H, I, stream, nullptr, &c);
  }
  // One token: the combine folded into the down kernel's last CTA.
  if (done && N <= 1 && moe_one_ok(N, K, E, H, I) && moe_one_combine_ok(H)) {
    OneCombine c;
    c.x = cx;
    c.ids = ids;
    c.w = cw;
    c.y = cy;
    c.eps = eps;
    c.done = done;
    return moe_experts_one(x, plan, weights, gate_up, down, h, slot_out, N, K, E, H, I, stream, nullptr, &c);
  }
  ZEST_RETURN_IF_ERROR(moe_experts_decode(x, plan, weights, gate_up, down, h, slot_out, N, K, E, H, I, stream));
  return moe_combine_add_rmsnorm(cx, slot_out, ids, K, cw, cy, N, H, eps, stream);
}

}  // namespace zest::cuda
