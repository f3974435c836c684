// read_probe: how fast HBM is read, by access pattern, alone on the GPU (a diagnostic for the decode benchmarks'
// floor). Every decode phase at one token is a read of weights (the lm_head 622 MB, the experts 75 MB per layer);
// the floor divides bytes by the device-to-device copy bandwidth. This probe reads the same bytes as
//   reg-chunk  : each CTA a contiguous range, 16-byte non-caching register loads, U loads in flight per thread;
//   reg-stride : all CTAs sweep the buffer together (grid-stride), the same loads;
//   bulk-ring  : one producer thread per CTA bulk-copies tiles into a ring of shared-memory stages that the other
//                warps hand back (the lm_head's rows_ring without the arithmetic), tiles interleaved over the CTAs
//                as the lm_head's (tile t on CTA t % grid) or contiguous per CTA, in pieces of P bytes;
// over a 640 MB buffer (larger than the 60 MB L2), and over 50 MB bursts from rotating offsets (the size of one
// layer's gate/up weights at one token: the ramp counts). It prints TB/s (bytes read / time), each the median of
// the timed repetitions, CUDA events, after a warm-up. Build: nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a
// bench/read_probe.cu -o read_probe (bench/gpu/readbw.sh).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

namespace {

// common.cuh's ld_stream, repeated: the probe builds with nvcc alone, outside the library.
__device__ __forceinline__ uint4 ld_nc(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <int U>
__global__ void __launch_bounds__(256) reg_chunk(const uint4* __restrict__ src, size_t n16, unsigned* sink) {
  const size_t per = (n16 + gridDim.x - 1) / gridDim.x;
  const size_t b = blockIdx.x * per, e = b + per < n16 ? b + per : n16;
  unsigned acc = 0;
  for (size_t i0 = b + threadIdx.x; i0 < e; i0 += U * 256) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t i = i0 + static_cast<size_t>(u) * 256;
      v[u] = i < e ? ld_nc(src + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

template <int U>
__global__ void __launch_bounds__(256) reg_stride(const uint4* __restrict__ src, size_t n16, unsigned* sink) {
  const size_t total = static_cast<size_t>(gridDim.x) * 256;
  unsigned acc = 0;
  for (size_t i0 = blockIdx.x * 256 + threadIdx.x; i0 < n16; i0 += U * total) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t i = i0 + static_cast<size_t>(u) * total;
      v[u] = i < n16 ? ld_nc(src + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

__device__ __forceinline__ uint32_t saddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                 : "=r"(done)
                 : "r"(bar), "r"(parity)
                 : "memory");
}

constexpr int kRingWarps = 4;
constexpr int kMaxStages = 8;

// One CTA per SM (or two): warp kRingWarps issues the copies, the others wait for each stage and hand it back
// (one arrival per thread, as rows_ring). interleave: tile t of the grid's tiles on CTA t % grid (the lm_head's
// order); otherwise each CTA a contiguous run of tiles. hint: the copies carry an L2 evict-first policy.
__global__ void __launch_bounds__((kRingWarps + 1) * 32) bulk_ring(const unsigned char* __restrict__ src, size_t tiles,
                                                                  uint32_t tile_bytes, uint32_t piece, int stages,
                                                                  int interleave, int hint, unsigned* sink) {
  extern __shared__ __align__(128) unsigned char ring[];
  __shared__ __align__(8) uint64_t full[kMaxStages], empty[kMaxStages];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&full[s])));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(saddr(&empty[s])), "r"(kRingWarps * 32));
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  const size_t per = (tiles + gridDim.x - 1) / gridDim.x;
  const size_t first = interleave ? blockIdx.x : blockIdx.x * per;
  const size_t last = interleave ? tiles : (first + per < tiles ? first + per : tiles);
  const size_t step = interleave ? gridDim.x : 1;
  if (warp == kRingWarps) {
    if (lane == 0) {
      uint64_t pol;
      asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
      int i = 0;
      for (size_t t = first; t < last; t += step, ++i) {
        const int s = i % stages;
        if (i >= stages) bar_wait(saddr(&empty[s]), ((i / stages) & 1) ^ 1);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(&full[s])), "r"(tile_bytes)
                     : "memory");
        const uint32_t dst = saddr(ring + static_cast<size_t>(s) * tile_bytes);
        const unsigned char* from = src + t * tile_bytes;
        for (uint32_t o = 0; o < tile_bytes; o += piece) {
          if (hint)
            asm volatile(
                "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
                "%4;" ::"r"(dst + o),
                "l"(from + o), "r"(piece), "r"(saddr(&full[s])), "l"(pol)
                : "memory");
          else
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                             dst + o),
                         "l"(from + o), "r"(piece), "r"(saddr(&full[s]))
                         : "memory");
        }
      }
    }
    return;
  }
  unsigned acc = 0;
  int i = 0;
  for (size_t t = first; t < last; t += step, ++i) {
    const int s = i % stages;
    bar_wait(saddr(&full[s]), (i / stages) & 1);
    acc ^= reinterpret_cast<const unsigned*>(ring + static_cast<size_t>(s) * tile_bytes)[threadIdx.x];
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(saddr(&empty[s])) : "memory");
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// One layer's gate/up weights at one token as the moe_one gate/up kernel reads them: CTA b takes item b (expert
// b / 48, intermediate rows 16 (b % 48) ..: 16 rows of gate and the same 16 of up, 4 KB each), 3 CTAs per SM.
// how 0: its load pattern (lane (g, tq) 16 bytes of row g at k chunk c, warp w chunks w, w + 8, ...: 8 rows x 64 B
// per instruction, 8 loads in flight per thread); how 1: the same bytes, each instruction 512 contiguous bytes of
// one row (warp w rows w, w + 8, ..., 8 in flight); how 2: bulk copies of the 32 rows into 2 shared-memory stages of
// 8 rows, read back by the warps. hint: evict-first.
constexpr int kItemRows = 16, kRowBytes = 4096, kInter = 768;
__global__ void __launch_bounds__(256) gu_items(const unsigned char* __restrict__ w, int how, int hint, unsigned* sink) {
  extern __shared__ __align__(128) unsigned char st[];
  __shared__ __align__(8) uint64_t full[2];
  const int b = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const unsigned char* gate = w + (static_cast<size_t>(b / 48) * 2 * kInter + (b % 48) * kItemRows) * kRowBytes;
  const unsigned char* up = gate + static_cast<size_t>(kInter) * kRowBytes;
  uint64_t pol;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  auto ld = [&](const unsigned char* q) {
    uint4 v;
    if (hint)
      asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(q), "l"(pol));
    else
      v = ld_nc(q);
    return v;
  };
  unsigned acc = 0;
  // Two rounds of 4 loads (gate and up rows lo / hi at columns k(u)), 8 in flight, then folded into acc.
  auto rounds = [&](int lo, int hi, auto k) {
    uint4 a[8];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      a[u * 4 + 0] = ld(gate + lo * kRowBytes + k(u));
      a[u * 4 + 1] = ld(gate + hi * kRowBytes + k(u));
      a[u * 4 + 2] = ld(up + lo * kRowBytes + k(u));
      a[u * 4 + 3] = ld(up + hi * kRowBytes + k(u));
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) acc ^= a[u].x ^ a[u].y ^ a[u].z ^ a[u].w;
  };
  if (how == 0) {
    const int g = lane >> 2, tq = lane & 3;
    for (int cb = warp; cb < 64; cb += 16) rounds(g, g + 8, [&](int u) { return (cb + u * 8) * 64 + tq * 16; });
  } else if (how == 1) {
    for (int r = warp; r < 32; r += 8) {
      const unsigned char* row = (r < 16 ? gate + r * kRowBytes : up + (r - 16) * kRowBytes) + lane * 16;
      uint4 a[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) a[u] = ld(row + u * 512);
#pragma unroll
      for (int u = 0; u < 8; ++u) acc ^= a[u].x ^ a[u].y ^ a[u].z ^ a[u].w;
    }
  } else if (how == 3) {
    const int g = lane >> 3, t8 = lane & 7;
    for (int cb = warp; cb < 32; cb += 16) {  // 32 pieces of 128 B per row; warp w pieces w, w + 8
      const auto k = [&](int u) { return (cb + u * 8) * 128 + t8 * 16; };
      rounds(g, g + 4, k);
      rounds(g + 8, g + 12, k);
    }
  } else if (how == 4) {
    acc = lane;
  } else {
    if (threadIdx.x == 0) {
      for (int s = 0; s < 2; ++s) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(saddr(&full[s])));
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    }
    __syncthreads();
    for (int q = 0; q < 4; ++q) {  // 4 fills of 8 rows: gate 0-7, 8-15, up 0-7, 8-15
      const int s = q & 1;
      if (threadIdx.x == 0) {
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(saddr(&full[s])),
                     "r"(8 * kRowBytes)
                     : "memory");
        const unsigned char* from = (q < 2 ? gate : up) + (q & 1) * 8 * kRowBytes;
        for (int r = 0; r < 8; ++r)
          asm volatile(
              "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], "
              "%4;" ::"r"(saddr(st + s * 8 * kRowBytes + r * kRowBytes)),
              "l"(from + r * kRowBytes), "r"(kRowBytes), "r"(saddr(&full[s])), "l"(pol)
              : "memory");
      }
      if (q >= 1) {  // the previous fill: wait, read, then every thread is past it before it is refilled
        bar_wait(saddr(&full[(q - 1) & 1]), ((q - 1) >> 1) & 1);
        acc ^= reinterpret_cast<const unsigned*>(st + ((q - 1) & 1) * 8 * kRowBytes)[threadIdx.x];
        __syncthreads();
      }
    }
    bar_wait(saddr(&full[1]), 1);
    acc ^= reinterpret_cast<const unsigned*>(st + 8 * kRowBytes)[threadIdx.x];
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

struct Probe {
  const unsigned char* buf;
  size_t buf_bytes;
  unsigned* sink;
  int sms;
};

// Median TB/s of `reps` launches of fn(offset, bytes), each reading `bytes` at a rotating offset of the buffer.
template <typename F>
double timed(const Probe& p, size_t bytes, int reps, F fn) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  const size_t slots = std::max<size_t>(1, p.buf_bytes / bytes);
  for (int w = 0; w < 3; ++w) fn((w % slots) * bytes, bytes);
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a));
    fn(((r + 3) % slots) * bytes, bytes);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CK(cudaGetLastError());
  std::sort(ms.begin(), ms.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return bytes / (ms[ms.size() / 2] * 1e-3) / 1e12;
}

template <int U>
void run_reg(const Probe& p, size_t bytes, int reps, int per_sm, bool stride) {
  const int grid = p.sms * per_sm;
  const double tbs = timed(p, bytes, reps, [&](size_t off, size_t n) {
    const uint4* s = reinterpret_cast<const uint4*>(p.buf + off);
    if (stride)
      reg_stride<U><<<grid, 256>>>(s, n / 16, p.sink);
    else
      reg_chunk<U><<<grid, 256>>>(s, n / 16, p.sink);
  });
  std::printf("| %s | %d CTAs/SM x 256 thr, %d x 16 B in flight per thread | %.0f MB | %.3f |\n",
              stride ? "reg-stride" : "reg-chunk", per_sm, U, bytes / 1e6, tbs);
}

void run_ring(const Probe& p, size_t bytes, int reps, int per_sm, uint32_t tile, uint32_t piece, int stages,
              int interleave, int hint) {
  const size_t smem = static_cast<size_t>(tile) * stages;
  CK(cudaFuncSetAttribute(bulk_ring, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const int grid = p.sms * per_sm;
  const size_t tiles = bytes / tile;
  const double tbs = timed(p, bytes, reps, [&](size_t off, size_t) {
    bulk_ring<<<grid, (kRingWarps + 1) * 32, smem>>>(p.buf + off, tiles, tile, piece, stages, interleave, hint,
                                                     p.sink);
  });
  std::printf("| bulk-ring | %d CTA/SM, %d stages x %u KB in %u KB pieces, %s%s | %.0f MB | %.3f |\n", per_sm, stages,
              tile / 1024, piece / 1024, interleave ? "tiles interleaved" : "tiles contiguous",
              hint ? ", evict-first" : "", bytes / 1e6, tbs);
}

double run_items(const Probe& p, int how, int hint) {
  const size_t bytes = size_t(384) * 32 * kRowBytes;  // 8 experts' gate/up rows: 50.3 MB
  const size_t smem = how == 2 ? 2 * 8 * kRowBytes : 0;
  if (smem) CK(cudaFuncSetAttribute(gu_items, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  // The items of 8 experts lie in 8 x 2 x 768 rows (the expert's whole gate/up: 12.6 MB each); rotate over regions
  // of 8 experts so that no launch finds its rows in L2.
  const size_t region = size_t(8) * 2 * kInter * kRowBytes;
  const double tbs = timed(p, region, 41, [&](size_t off, size_t) {
    gu_items<<<384, 256, smem>>>(p.buf + off, how, hint, p.sink);
  }) * bytes / region;
  return bytes / tbs / 1e6;  // us
}

}  // namespace

int main() {
  int dev = 0;
  CK(cudaSetDevice(dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  Probe p{};
  p.sms = prop.multiProcessorCount;
  p.buf_bytes = size_t(640) << 20;
  unsigned char* buf = nullptr;
  CK(cudaMalloc(&buf, p.buf_bytes * 2));
  CK(cudaMalloc(&p.sink, 64));
  // Random bytes (never zeros): a counter hashed per 4-byte word.
  {
    std::vector<uint32_t> h(1 << 20);
    uint32_t s = 12345;
    for (auto& v : h) v = s = s * 1664525u + 1013904223u;
    for (size_t o = 0; o < p.buf_bytes * 2; o += h.size() * 4)
      CK(cudaMemcpy(buf + o, h.data(), std::min(h.size() * 4, p.buf_bytes * 2 - o), cudaMemcpyHostToDevice));
  }
  p.buf = buf;
  std::printf("%s, %d SMs, L2 %d MB\n", prop.name, p.sms, prop.l2CacheSize >> 20);
  // Copy bandwidth as the decode benchmark measures it (bytes read + written).
  {
    const size_t n = size_t(512) << 20;
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    std::vector<float> ms;
    for (int r = 0; r < 13; ++r) {
      CK(cudaEventRecord(a));
      CK(cudaMemcpyAsync(buf + p.buf_bytes, buf, n, cudaMemcpyDeviceToDevice));
      CK(cudaEventRecord(b));
      CK(cudaEventSynchronize(b));
      float t;
      CK(cudaEventElapsedTime(&t, a, b));
      if (r >= 3) ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    std::printf("copy bandwidth (read + written): %.3f TB/s\n\n", 2.0 * n / (ms[ms.size() / 2] * 1e-3) / 1e12);
  }
  std::printf("| pattern | form | bytes | TB/s read |\n|---|---|---|---|\n");
  {
    const char* name[] = {"moe_one's pattern: 8 rows x 64 B per instruction, 8 in flight per thread",
                          "512 contiguous bytes of one row per instruction, 8 in flight",
                          "bulk copies of 4 KB rows into 2 shared-memory stages of 8 rows",
                          "4 rows x 128 B per instruction, 8 in flight",
                          "no loads (the launch and event overhead)"};
    const int hows[] = {0, 1, 3, 2, 4};
    std::vector<double> us[5][2];
    for (int round = 0; round < 5; ++round)
      for (int how : hows)
        for (int hint = 1; hint >= (how == 0 || how == 1 ? 0 : 1); --hint) us[how][hint].push_back(run_items(p, how, hint));
    std::printf("One layer's gate/up weights at one token (8 experts x 48 items of 128 KB, 384 CTAs, 3 per SM; one launch, "
                "us between events, median of 41 per round, 5 rounds interleaved):\n\n| pattern | rounds (us) |\n|---|---|\n");
    for (int how : hows)
      for (int hint = 1; hint >= 0; --hint) {
        if (us[how][hint].empty()) continue;
        std::printf("| %s%s |", name[how], hint && how != 4 ? ", evict-first" : "");
        for (double v : us[how][hint]) std::printf(" %.2f", v);
        std::printf(" |\n");
      }
    std::printf("\n");
  }
  const size_t big = size_t(622) << 20, burst = size_t(50) << 20;
  for (size_t bytes : {big, burst}) {
    const int reps = bytes == big ? 11 : 41;
    run_reg<4>(p, bytes, reps, 3, false);
    run_reg<8>(p, bytes, reps, 3, false);
    run_reg<16>(p, bytes, reps, 2, false);
    run_reg<8>(p, bytes, reps, 4, false);
    run_reg<8>(p, bytes, reps, 3, true);
    run_reg<16>(p, bytes, reps, 4, true);
    run_ring(p, bytes, reps, 1, 64 << 10, 4 << 10, 3, 1, 1);   // the lm_head's rows_ring (16 rows of 4 KB)
    run_ring(p, bytes, reps, 1, 64 << 10, 4 << 10, 3, 0, 1);
    run_ring(p, bytes, reps, 1, 64 << 10, 64 << 10, 3, 1, 1);
    run_ring(p, bytes, reps, 1, 64 << 10, 4 << 10, 3, 1, 0);
    run_ring(p, bytes, reps, 1, 32 << 10, 4 << 10, 6, 1, 1);
    run_ring(p, bytes, reps, 1, 16 << 10, 4 << 10, 8, 1, 1);
    run_ring(p, bytes, reps, 2, 32 << 10, 4 << 10, 3, 1, 1);
    run_ring(p, bytes, reps, 3, 32 << 10, 4 << 10, 2, 1, 1);
  }
  CK(cudaFree(buf));
  CK(cudaFree(p.sink));
  return 0;
}
