// tile_probe.h: weight-tile copies into shared memory by four methods (a diagnostic for the decode benchmark).
#include "kernels/cuda/tile_probe.h"

#include <string>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"

namespace zest::cuda {

namespace {

constexpr int kProbeThreads = 256;
constexpr int kProbeMaxBytes = 200 * 1024;

__global__ void __launch_bounds__(kProbeThreads) tile_probe_kernel(const unsigned char* __restrict__ src,
                                                                   uint32_t* __restrict__ sink,
                                                                   unsigned long long* __restrict__ times, int bytes,
                                                                   int pieces, int how, int late_wait) {
  extern __shared__ __align__(128) unsigned char tile[];
  __shared__ __align__(8) uint64_t bar;
  __shared__ uint32_t red[kProbeThreads / 32];
  if (!late_wait) pdl_wait();
  const unsigned long long t0 = global_ns();
  const unsigned char* from = src + static_cast<size_t>(blockIdx.x) * bytes;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t piece = static_cast<uint32_t>(bytes / pieces);
  if (how == 0 || how == 1) {
    if (threadIdx.x == 0) {
      mbar_init(&bar);
      mbar_arrive_expect_tx(&bar, static_cast<uint32_t>(bytes));
    }
    __syncthreads();
    if (how == 0 && threadIdx.x == 0)
      for (int p = 0; p < pieces; ++p) bulk_load(tile + p * piece, from + static_cast<size_t>(p) * piece, piece, &bar);
    if (how == 1 && warp == 0)
      for (int p = lane; p < pieces; p += 32)
        bulk_load(tile + p * piece, from + static_cast<size_t>(p) * piece, piece, &bar);
    // late_wait: as the decode GEMMs, the copies issued, then the wait on the previous kernel; warp 1 does not wait
    // on it and takes the time the tile landed.
    if (late_wait && warp != 1) pdl_wait();
    mbar_wait(&bar, 0);
    if (threadIdx.x == 32 && times) times[2 * blockIdx.x + 1] = global_ns();
  } else if (how == 2) {
    for (int i = threadIdx.x; i < bytes / 16; i += kProbeThreads)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(tile + i * 16)), "l"(from + i * 16)
                   : "memory");
    asm volatile("cp.async.commit_group;" ::: "memory");
    if (late_wait) pdl_wait();
    asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
  } else {
    if (late_wait) pdl_wait();
    constexpr int kU = 8;
    for (int i0 = threadIdx.x; i0 < bytes / 16; i0 += kU * kProbeThreads) {
      uint4 v[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int i = i0 + u * kProbeThreads;
        v[u] = i < bytes / 16 ? ld_stream(from + i * 16) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int i = i0 + u * kProbeThreads;
        if (i < bytes / 16) *reinterpret_cast<uint4*>(tile + i * 16) = v[u];
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0 && times) {  // this CTA's start and (other than bulk copies) the time its tile had landed
    times[2 * blockIdx.x] = t0;
    if (how >= 2) times[2 * blockIdx.x + 1] = global_ns();
  }
  uint32_t x = 0;
  for (int i = threadIdx.x; i < bytes / 4; i += kProbeThreads) x ^= reinterpret_cast<const uint32_t*>(tile)[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x ^= __shfl_xor_sync(0xffffffffu, x, o);
  if (lane == 0) red[warp] = x;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t t = 0;
    for (int w = 0; w < kProbeThreads / 32; ++w) t ^= red[w];
    sink[blockIdx.x] = t;
  }
}

// Spins until `ns` have passed since its start; lets the next kernel launch at once.
__global__ void spin_kernel(unsigned long long ns) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const unsigned long long t0 = global_ns();
  while (global_ns() - t0 < ns) {
  }
}

}  // namespace

Status busy_wait_kernel(int ctas, double us, cudaStream_t stream) {
  if (ctas <= 0 || us < 0) return invalid_argument("busy_wait_kernel: need ctas > 0 and us >= 0");
  return launch("spin", spin_kernel, dim3(ctas), dim3(32), 0, stream, static_cast<unsigned long long>(us * 1e3));
}

Status tile_copy_probe(const void* src, size_t offset, uint32_t* sink, unsigned long long* times, int ctas,
                       int bytes_per_cta, int pieces, TileCopy how, cudaStream_t stream, bool late_wait) {
  if (!src || !sink || ctas <= 0 || bytes_per_cta <= 0 || bytes_per_cta > kProbeMaxBytes || pieces <= 0 ||
      bytes_per_cta % pieces != 0 || (bytes_per_cta / pieces) % 16 != 0 ||
      (reinterpret_cast<uintptr_t>(src) + offset) % 16 != 0)
    return invalid_argument("tile_copy_probe: need ctas > 0, 0 < bytes_per_cta <= 200 KB split into `pieces` "
                            "multiples of 16 bytes, a 16-byte aligned source and non-null pointers");
  static bool configured = false;
  if (!configured) {
    ZEST_RETURN_IF_ERROR(cuda_status(cudaFuncSetAttribute(reinterpret_cast<const void*>(tile_probe_kernel),
                                                          cudaFuncAttributeMaxDynamicSharedMemorySize, kProbeMaxBytes),
                                     "tile_copy_probe: shared memory attribute"));
    configured = true;
  }
  return launch("tile_probe", tile_probe_kernel, dim3(ctas), dim3(kProbeThreads), static_cast<size_t>(bytes_per_cta),
                stream, static_cast<const unsigned char*>(src) + offset, sink, times, bytes_per_cta, pieces,
                static_cast<int>(how), late_wait ? 1 : 0);
}

}  // namespace zest::cuda
