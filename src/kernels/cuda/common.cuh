// Helpers shared by the CUDA kernels of zest: error conversion, launches, bf16 vector math, warp reductions.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <mutex>
#include <string>
#include <utility>

#include "core/status.h"
#include "kernels/cuda/kernels.h"

namespace zest::cuda {

// Converts a CUDA error into a Status naming the operation.
inline Status cuda_status(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status::ok();
  return internal_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Appends the launch attributes every launch of this library carries to attrs[n...] (programmatic stream
// serialisation when enabled) and returns the new count (at most n + 1).
// The current GPU (0 when the runtime cannot say).
inline int current_device() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    cudaGetLastError();
    dev = 0;
  }
  return dev;
}

// f() once per GPU (the current one) and its result from then on: for what belongs to a device rather than to the
// process - a kernel's function attributes (cudaFuncSetAttribute sets them for the current device only) and what the
// device can schedule - so that a process launching on several GPUs sets them on each. Every call site (a lambda of
// its own type) has its own memory.
template <class T, class F>
T once_per_device(F f) {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> done[kMaxDevices];
  static T value[kMaxDevices];
  static std::mutex mu;
  const int dev = current_device();
  if (dev < 0 || dev >= kMaxDevices) return f();
  if (done[dev].load(std::memory_order_acquire)) return value[dev];
  std::lock_guard<std::mutex> lock(mu);
  if (!done[dev].load(std::memory_order_relaxed)) {
    value[dev] = f();
    done[dev].store(true, std::memory_order_release);
  }
  return value[dev];
}

inline int common_launch_attrs(cudaLaunchAttribute* attrs, int n) {
  if (programmatic_launch()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  return n;
}

// Launches `kernel` on `stream`, with the programmatic-dependent-launch attribute when it is enabled.
// Every kernel launched this way calls pdl_wait() before touching memory.
template <typename... KArgs, typename... Args>
Status launch(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
              Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  cfg.attrs = attr;
  cfg.numAttrs = static_cast<unsigned int>(common_launch_attrs(attr, 0));
  note_launch(name, stream);
  return cuda_status(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(std::forward<Args>(args))...), name);
}

// A launch configuration of `grid` CTAs in clusters of `cluster_x` along x: attr[0] is the cluster dimension, the
// only attribute so far (numAttrs 1; the caller may add more after it).
inline cudaLaunchConfig_t cluster_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, unsigned cluster_x,
                                         cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = cluster_x;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// The same as launch for a grid of thread-block clusters of `cluster_x` CTAs along x.
template <typename... KArgs, typename... Args>
Status launch_cluster(const char* name, void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                      cudaStream_t stream, unsigned cluster_x, Args&&... args) {
  cudaLaunchAttribute attr[2];
  cudaLaunchConfig_t cfg = cluster_config(grid, block, smem, stream, cluster_x, attr);
  cfg.numAttrs = static_cast<unsigned int>(common_launch_attrs(attr, 1));
  note_launch(name, stream);
  return cuda_status(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(std::forward<Args>(args))...), name);
}

// Clusters of `cluster_x` CTAs of `kernel` (a grid of `grid` CTAs along x, `block` threads, `smem` bytes of dynamic
// shared memory) that can be resident at once, from cudaOccupancyMaxActiveClusters; 0 when the query fails (its
// error cleared). Set the kernel's attributes (shared memory size, non-portable cluster size) first.
template <typename... KArgs>
int max_active_clusters(void (*kernel)(KArgs...), unsigned cluster_x, unsigned grid, dim3 block, size_t smem) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = cluster_config(dim3(grid), block, smem, nullptr, cluster_x, attr);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();
    n = 0;
  }
  return n;
}

// cuTensorMapEncodeTiled, looked up once through the runtime's driver entry point (so the library needs no link
// against libcuda); nullptr when the driver lacks it.
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                   const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                   CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
inline EncodeTiledFn encode_tiled_fn() {
  static const EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return static_cast<EncodeTiledFn>(nullptr);
    }
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// %globaltimer (ns).
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

#ifdef ZEST_STEP_TIMELINE
// Step timeline (set_step_timeline, kernels.h; only in the library built with ZEST_STEP_TIMELINE, which the
// timeline tools link, so that the kernels of every other build keep their bare PDL waits): this translation unit's
// copy of the device buffer pointer, set through the setter each unit registers at static initialisation.
namespace {
__constant__ unsigned long long* g_step_timeline = nullptr;
cudaError_t set_unit_step_timeline(void* buffer) {
  return cudaMemcpyToSymbol(g_step_timeline, &buffer, sizeof(buffer));
}
[[maybe_unused]] const bool g_step_timeline_registered = register_step_timeline_unit(&set_unit_step_timeline);
}  // namespace

__device__ __forceinline__ unsigned long long globaltimer_ns() { return global_ns(); }

// The first thread of a CTA reads the buffer pointer and the time before the wait and, when a buffer is set, takes a
// record slot after the wait and fills it. Per-SM counters keep the atomics of one launch apart.
struct StepTimelineSlot {
  unsigned long long* tl = nullptr;
  unsigned long long ready = 0;
};

__device__ __forceinline__ StepTimelineSlot step_timeline_begin() {
  StepTimelineSlot slot;
  if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
    slot.tl = g_step_timeline;
    slot.ready = globaltimer_ns();
  }
  return slot;
}

// Appends one record {%gridid, tag << 56 | SM << 32 | CTA, t0, t1} to tl (tag 0: a wait record, k + 1: phase k).
__device__ __forceinline__ void step_timeline_append(unsigned long long* tl, unsigned long long tag,
                                                     unsigned long long t0, unsigned long long t1) {
  unsigned long long grid;
  unsigned int sm;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(grid));
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  const unsigned long long sms = tl[0], cap = tl[1];
  if (sm >= sms) return;
  const unsigned long long i = atomicAdd(tl + 2 + sm, 1ull);
  if (i >= cap) return;
  unsigned long long* r = tl + 2 + sms + 4 * (sm * cap + i);
  const unsigned int cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  r[0] = grid;
  r[1] = tag << 56 | static_cast<unsigned long long>(sm) << 32 | cta;
  r[2] = t0;
  r[3] = t1;
}

__device__ __forceinline__ void step_timeline_end(const StepTimelineSlot& slot) {
  if (slot.tl) step_timeline_append(slot.tl, 0, slot.ready, globaltimer_ns());
}

// A phase stamp: thread 0 of the CTA appends {grid, (k + 1) << 56 | SM << 32 | CTA, globaltimer, 0} (k < 8), e.g.
// phase 0 at the kernel's first instruction (when the CTA became resident) and later ones at its inner steps.
__device__ __forceinline__ void step_timeline_phase(int k) {
  if (threadIdx.x != 0 || threadIdx.y != 0 || threadIdx.z != 0) return;
  unsigned long long* tl = g_step_timeline;
  if (tl) step_timeline_append(tl, static_cast<unsigned long long>(k + 1), globaltimer_ns(), 0);
}
#else
__device__ __forceinline__ void step_timeline_phase(int) {}
struct StepTimelineSlot {};
__device__ __forceinline__ StepTimelineSlot step_timeline_begin() { return {}; }
__device__ __forceinline__ void step_timeline_end(const StepTimelineSlot&) {}
#endif

// The PDL wait alone (the caller lets its dependents launch itself).
__device__ __forceinline__ void pdl_wait_only() {
  const StepTimelineSlot slot = step_timeline_begin();
  asm volatile("griddepcontrol.wait;" ::: "memory");
  step_timeline_end(slot);
}

// Waits for the previous kernel in the stream (no-op without programmatic launch), then lets the next
// kernel start its prologue early.
__device__ __forceinline__ void pdl_wait() {
  const StepTimelineSlot slot = step_timeline_begin();
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  step_timeline_end(slot);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16(v)); }

// A wait that never ends means a bug (a byte count or a dependency that cannot complete): spin loops trap after this
// long, so the launch fails with an error instead of hanging the device.
constexpr uint64_t kWatchdogNs = 10'000'000'000ull;

// GPU-scope acquire load and release add of a counter in global memory.
__device__ __forceinline__ uint32_t ld_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_add(uint32_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// RMSNorm pieces shared by the norm kernels and the kernels that fold a norm in (the same arithmetic, so the same
// bits): the sum of squares of 8 values in order, and y = bf16(bf16(v * inv) * w) for 8 values packed as bf16.
__device__ __forceinline__ float sumsq8(const float* v) {
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) ss += v[i] * v[i];
  return ss;
}
__device__ __forceinline__ uint4 rms_scale8(const float* v, float inv, const uint4& w) {
  const bf16* wb = reinterpret_cast<const bf16*>(&w);
  uint4 o;
  bf16* ob = reinterpret_cast<bf16*>(&o);
#pragma unroll
  for (int i = 0; i < 8; ++i) ob[i] = __float2bfloat16(bf16_round(v[i] * inv) * __bfloat162float(wb[i]));
  return o;
}
// Sum over the CTA of one value per thread (every thread gets the total): warp sums, then the first warp-count lanes'
// values summed by the same butterfly. red: at least blockDim.x / 32 floats of shared memory.
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  const int nw = blockDim.x >> 5;
  float t = lane < nw ? red[lane] : 0.f;
  t = warp_sum(t);
  __syncthreads();
  return t;
}

// 8 bf16 values packed in a uint4, as fp32, and back (round to nearest).
__device__ __forceinline__ void unpack8(const uint4& u, float* v) {
  const bf16* b = reinterpret_cast<const bf16*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = __bfloat162float(b[i]);
}
__device__ __forceinline__ uint4 pack8(const float* v) {
  uint4 u;
  bf16* b = reinterpret_cast<bf16*>(&u);
#pragma unroll
  for (int i = 0; i < 8; ++i) b[i] = __float2bfloat16(v[i]);
  return u;
}

// 8 consecutive slot-output values (fp32 or bf16 slots) as fp32, loaded through L2 (ld.global.cg).
__device__ __forceinline__ void ldcg_slot8(const float* p, float* v) {
  const float4 a = __ldcg(reinterpret_cast<const float4*>(p)), b = __ldcg(reinterpret_cast<const float4*>(p) + 1);
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void ldcg_slot8(const bf16* p, float* v) {
  unpack8(__ldcg(reinterpret_cast<const uint4*>(p)), v);
}

// One token row of moe_combine_add_rmsnorm (elementwise.cu norm_kernel<2> for hidden <= 8 * blockDim.x, one
// 8-element chunk per thread; the one-token experts' folded combine): x = bf16(x + bf16(sum of slot_out[k] over
// k < K with ids[k] >= 0, in k order, in fp32)), then, when y is not null, y = w * bf16(x * rsqrt(mean(x^2) + eps))
// with wv this thread's 8 norm weights (loaded by the caller, possibly before its PDL wait). All K slot rows are
// loaded at once (empty slots skipped at the sum; ids null: none empty); x, ids and slot_out are read through L2 (they
// may come from other CTAs of the same launch). Slot outputs fp32 or bf16. Every thread of the CTA calls it; red: blockDim.x / 32 floats
// of shared memory.
template <class Slot>
__device__ __forceinline__ void combine_norm_row(bf16* x, const Slot* slot_out, const int32_t* ids, int K,
                                                 const uint4& wv, bf16* y, int hidden, float eps, float* red) {
  const int c = threadIdx.x * 8;
  const bool own = c < hidden;
  float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  if (own) {
    unpack8(__ldcg(reinterpret_cast<const uint4*>(x + c)), v);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k0 = 0; k0 < K; k0 += 8) {
      float a[8][8];
      int id[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int k = k0 + u;
        id[u] = k < K ? (ids ? __ldcg(ids + k) : 0) : -1;
        ldcg_slot8(slot_out + static_cast<size_t>(k < K ? k : 0) * hidden + c, a[u]);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (id[u] < 0) continue;
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[i] += a[u][i];
      }
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = bf16_round(v[i] + bf16_round(acc[i]));
    *reinterpret_cast<uint4*>(x + c) = pack8(v);
  }
  step_timeline_phase(5);  // the row's loads have landed
  if (!y) return;
  const float tot = block_sum(sumsq8(v), red);
  const float inv = rsqrtf(tot / hidden + eps);
  if (own) *reinterpret_cast<uint4*>(y + c) = rms_scale8(v, inv, wv);
}

// Dot product of 8 bf16 pairs packed in two uint4 values, fp32.
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b) {
  const __nv_bfloat162* pa = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* pb = reinterpret_cast<const __nv_bfloat162*>(&b);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 fa = __bfloat1622float2(pa[i]);
    float2 fb = __bfloat1622float2(pb[i]);
    s = fmaf(fa.x, fb.x, s);
    s = fmaf(fa.y, fb.y, s);
  }
  return s;
}

// 16-byte streaming load of read-only data that is used once (weights).
__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// Adds n to a 64-bit statistics counter without waiting for it: a reduction (no value returned), so the thread goes
// on at once where a load-add-store would wait one L2 round trip for the load.
__device__ __forceinline__ void count_add(int64_t* counter, long long n) {
  atomicAdd(reinterpret_cast<unsigned long long*>(counter), static_cast<unsigned long long>(n));
}

// One warp (all 32 lanes) turns per-expert slot counts [E] into the MoE plan: the active-expert list, their slot
// offsets, the kMoeTileM-row prefill tiles and the counts; offset_of[e] receives expert e's first sorted slot.
__device__ __forceinline__ void moe_plan_scan_warp(const int* counts, int E, const MoePlan& plan, int* offset_of,
                                                   int64_t* active_count_sum) {
  const int lane = threadIdx.x & 31;
  for (int e = lane; e <= E; e += 32) plan.ready[e] = 0u;  // a fresh plan: nothing ready or claimed
  int na = 0, off = 0, nt = 0;
  for (int e0 = 0; e0 < E; e0 += 32) {
    const int e = e0 + lane;
    const int c = e < E ? counts[e] : 0;
    const int tiles = (c + kMoeTileM - 1) / kMoeTileM;
    const unsigned act = __ballot_sync(0xffffffffu, c > 0);
    int cs = c, ts = tiles;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int a = __shfl_up_sync(0xffffffffu, cs, o), b = __shfl_up_sync(0xffffffffu, ts, o);
      if (lane >= o) {
        cs += a;
        ts += b;
      }
    }
    const int idx = na + __popc(act & ((1u << lane) - 1));
    const int my_off = off + cs - c, my_tile = nt + ts - tiles;
    if (e < E) offset_of[e] = my_off;
    if (c > 0) {
      plan.active_experts[idx] = e;
      plan.offsets[idx] = my_off;
      for (int r = 0; r < tiles; ++r) {
        plan.tile_active[my_tile + r] = idx;
        plan.tile_start[my_tile + r] = my_off + r * kMoeTileM;
      }
    }
    na += __popc(act);
    off += __shfl_sync(0xffffffffu, cs, 31);
    nt += __shfl_sync(0xffffffffu, ts, 31);
  }
  if (lane == 0) {
    plan.offsets[na] = off;
    *plan.num_active = na;
    *plan.num_tiles = nt;
    if (active_count_sum) count_add(active_count_sum, na);
  }
}

// c += a * b for one bf16 mma.m16n8k16 tile (fp32 accumulators): a0-a3 the A fragment (rows g and g + 8, k pairs
// tq and tq + 4), b0-b1 the B fragment.
__device__ __forceinline__ void mma16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// A warp's B fragments (token rows) for one round of 32-wide k chunks of the small-M tensor-core products: chunk
// c = c0 + u * step (u < N) of token rows x0 (lanes' rows g) and x1 (rows g + 8), 16 bytes per lane (k = 8 tq .. 8 tq +
// 7 of the chunk, x0 / x1 already offset by 8 tq); a null row or a chunk at or past `chunks` gives zeros.
template <int N>
__device__ __forceinline__ void load_token_chunks(uint4 (&xa)[N], uint4 (&xb)[N], const bf16* x0, const bf16* x1, int c0,
                                                  int step, int chunks) {
#pragma unroll
  for (int u = 0; u < N; ++u) {
    const int c = c0 + u * step;
    const bool ok = c < chunks;
    xa[u] = ok && x0 ? __ldg(reinterpret_cast<const uint4*>(x0 + c * 32)) : make_uint4(0, 0, 0, 0);
    xb[u] = ok && x1 ? __ldg(reinterpret_cast<const uint4*>(x1 + c * 32)) : make_uint4(0, 0, 0, 0);
  }
}

// Number of multiprocessors of the current device (cached).
int sm_count();

// Lets fn take `smem` bytes of dynamic shared memory (needed above 48 KiB; below it nothing is set).
Status set_dynamic_smem(const void* fn, size_t smem);
// Sets fn's preferred shared-memory carveout to the smallest share of the SM's unified L1 / shared memory that still
// holds ctas_per_sm CTAs (static + dynamic_smem shared memory and the per-CTA reserve each), the rest staying L1.
Status set_min_carveout(const void* fn, int ctas_per_sm, size_t dynamic_smem);
// Sets fn's preferred carveout to the largest shared-memory share; remembered per function, so that only the first
// launch sets it.
Status set_max_carveout(const void* fn);

// Tensor-core weight-streaming paths (rows_mma.cu) for few tokens, used by gemm and moe_experts_decode.
bool rows_mma_gemm_ok(int M, int N, int K);
Status rows_mma_gemm(const bf16* x, const bf16* w, bf16* y, int M, int N, int K, cudaStream_t stream);
bool rows_mma_moe_ok(int H, int I);
Status rows_mma_moe(const bf16* x, const MoePlan& plan, const float* weights, const bf16* gate_up, const bf16* down,
                    bf16* h, float* slot_out, int N, int K, int E, int H, int I, cudaStream_t stream);

}  // namespace zest::cuda
