// Sampling summaries of bf16 logits rows on the device (the device side of model/sampling.h): one CTA of 1024
// threads per row computes, as the row's plan asks, the argmax (ties to the lowest id), the max and
// Z = sum exp((l - max) / T) (fp32 exponentials, fp64 sums), the id-order inverse-CDF pick at u * Z, and the
// exact top C (radix select on the order-preserving 16-bit key of bf16 over two 8-bit digits, ties at the
// threshold resolved to the lower ids, then a bitonic sort of the C candidates by (key desc, id asc)). Vocabularies of
// 16384 and more (16-byte rows) split each row over a cluster of 8 CTAs instead (sample_rows_cluster_kernel below):
// the same outputs, Z summed in another order.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace zest::cuda {

namespace {

constexpr int kThreads = 1024, kWarps = kThreads / 32;

__device__ __forceinline__ float bits_to_f32(uint32_t b) { return __uint_as_float(b << 16); }
// Order-preserving key: larger key <=> larger value; -0 is keyed as +0 (they compare equal).
__device__ __forceinline__ uint32_t order_key(uint32_t b) {
  if (b == 0x8000u) b = 0;
  return (b & 0x8000u) ? (~b & 0xFFFFu) : (b | 0x8000u);
}
__device__ __forceinline__ uint32_t key_to_bits(uint32_t k) { return (k & 0x8000u) ? (k & 0x7FFFu) : (~k & 0xFFFFu); }

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// A unit is VEC consecutive elements (8 through one 16-byte load when the row allows it, else 1).
// The 8 bf16 bit patterns of a 16-byte unit, in id order.
__device__ __forceinline__ void unpack_unit(const uint4 v, uint32_t (&b)[8]) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    b[2 * j] = w[j] & 0xFFFFu;
    b[2 * j + 1] = w[j] >> 16;
  }
}

template <int VEC>
__device__ __forceinline__ void load_unit(const uint16_t* row, int V, int unit, uint32_t (&b)[VEC]) {
  if constexpr (VEC == 8) {
    unpack_unit(__ldg(reinterpret_cast<const uint4*>(row) + unit), b);
  } else {
    b[0] = unit < V ? row[unit] : 0u;
  }
}

__device__ __forceinline__ void fold_max(float& best, int& bid, float v, int id) {
  if (v > best || (v == best && id < bid)) {
    best = v;
    bid = id;
  }
}

// The first of n segments whose running sum (from `start`) exceeds target, with the sum before it in *base; when
// rounding leaves the target past the end, the last segment with weight; -1 (*base = start) when none has weight.
__device__ __forceinline__ int segment_at(const double* sums, int n, double target, double start, double* base) {
  int s0 = -1, s_last = -1;
  double cum = start, before_last = start, b = start;
  for (int s = 0; s < n; ++s) {
    if (sums[s] > 0) {
      s_last = s;
      before_last = cum;
    }
    if (s0 < 0 && cum + sums[s] > target) {
      s0 = s;
      b = cum;
    }
    cum += sums[s];
  }
  if (s0 < 0) {
    s0 = s_last;
    b = before_last;
  }
  *base = b;
  return s0;
}

// The temperature pick by one warp: it walks units [u_begin, units) in id order from the prefix sum `base` and
// returns the first id whose prefix sum of exp((l - mx) * inv_t) exceeds target, or -1 (*last: the last id with
// weight it saw, -1 if none). Unit u holds ids id0 + u * VEC + j, those below id_end; load(u, b) gives its bits.
template <int VEC, class Load>
__device__ __forceinline__ int walk_units(Load load, int u_begin, int units, int id0, int id_end, float mx,
                                          float inv_t, double target, double base, int* last) {
  const int lane = threadIdx.x & 31;
  int token = -1, last_pos = -1;
  for (int c = u_begin; c < units && token < 0; c += 32) {
    const int u = c + lane;
    float w[VEC];
    double ls = 0;
    int lane_last = -1;
    if (u < units) {
      uint32_t b[VEC];
      load(u, b);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const int id = id0 + u * VEC + j;
        w[j] = id < id_end ? expf((bits_to_f32(b[j]) - mx) * inv_t) : 0.f;
        ls += w[j];
        if (w[j] > 0.f) lane_last = id;
      }
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) w[j] = 0.f;
    }
    double incl = ls;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double n = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += n;
    }
    const unsigned cross = __ballot_sync(0xffffffffu, ls > 0 && base + incl > target);
    int pick = -1;
    if (cross && lane == __ffs(cross) - 1) {
      double p = base + incl - ls;
      for (int j = 0; j < VEC; ++j) {
        if (w[j] <= 0.f) continue;
        p += w[j];
        pick = id0 + u * VEC + j;
        if (p > target) break;
      }
    }
    for (int o = 16; o > 0; o >>= 1) pick = max(pick, __shfl_xor_sync(0xffffffffu, pick, o));
    int ll = lane_last;
    for (int o = 16; o > 0; o >>= 1) ll = max(ll, __shfl_xor_sync(0xffffffffu, ll, o));
    last_pos = max(last_pos, ll);
    token = pick;
    base += __shfl_sync(0xffffffffu, incl, 31);
  }
  *last = last_pos;
  return token;
}

// Warp 0 over a 256-bin histogram of one key digit (counts from the top bin): the bin at which the count reaches
// `need` into misc[0], the count of the bins above it into misc[1].
__device__ __forceinline__ void digit_at(const int* hist, int need, int* misc) {
  const int lane = threadIdx.x & 31;
  // Lane l holds bins 255 - 8l down to 248 - 8l.
  int cnt[8], s = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += cnt[j] = hist[255 - 8 * lane - j];
  int excl = s;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, excl, o);
    if (lane >= o) excl += n;
  }
  excl -= s;
  if (excl < need && excl + s >= need) {
    int acc = excl;
    for (int j = 0; j < 8; ++j) {
      if (acc + cnt[j] >= need) {
        misc[0] = 255 - 8 * lane - j;
        misc[1] = acc;
        break;
      }
      acc += cnt[j];
    }
  }
}

// The candidates of a block of kT threads over units [0, units) (unit u: ids id0 + u * VEC + j below id_end, bits
// from load(u, b)): every key above tkey, and of the keys equal to tkey the take_eq lowest ids, as (key << 32 | ~id)
// into cand (atomic order; those past `limit` dropped). misc[2] (written) and misc[3] (ties taken) are zero on entry
// behind a barrier; warp_sums holds kT / 32 ints.
template <int kT, int VEC, class Load>
__device__ void collect_candidates(Load load, int units, int id0, int id_end, uint32_t tkey, int take_eq, int limit,
                                   unsigned long long* cand, int* misc, int* warp_sums) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int t0 = 0; t0 < units; t0 += kT) {
    const int u = t0 + tid;
    uint32_t b[VEC];
    int n_eq = 0;
    if (u < units) {
      load(u, b);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const int id = id0 + u * VEC + j;
        if (id >= id_end) continue;
        const uint32_t k = order_key(b[j]);
        if (k > tkey) {
          const int at = atomicAdd(&misc[2], 1);
          if (at < limit) cand[at] = (static_cast<unsigned long long>(k) << 32) | (~static_cast<uint32_t>(id));
        } else if (k == tkey) {
          ++n_eq;
        }
      }
    }
    const int taken = misc[3];  // uniform: written only between the barriers below
    if (taken < take_eq) {
      // Exclusive prefix of the tie counts over the tile in id order (thread-major).
      int incl = n_eq;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
      }
      if (lane == 31) warp_sums[warp] = incl;
      __syncthreads();
      int before = 0, tile = 0;
      for (int w = 0; w < kT / 32; ++w) {
        if (w < warp) before += warp_sums[w];
        tile += warp_sums[w];
      }
      int rank = taken + before + incl - n_eq;
      if (n_eq > 0) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const int id = id0 + u * VEC + j;
          if (id >= id_end || order_key(b[j]) != tkey) continue;
          if (rank < take_eq) {
            const int at = atomicAdd(&misc[2], 1);
            if (at < limit) cand[at] = (static_cast<unsigned long long>(tkey) << 32) | (~static_cast<uint32_t>(id));
          }
          ++rank;
        }
      }
      __syncthreads();
      if (tid == 0) misc[3] = min(take_eq, taken + tile);
    }
    __syncthreads();
  }
}

// Bitonic sort of a[0, n) descending (n a power of two) by a block of kT threads.
template <int kT>
__device__ void sort_desc(unsigned long long* a, int n) {
  for (int k = 2; k <= n; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < n; i += kT) {
        const int ixj = i ^ j;
        if (ixj > i) {
          const unsigned long long x = a[i], y = a[ixj];
          const bool desc = (i & k) == 0;
          if (desc ? x < y : x > y) {
            a[i] = y;
            a[ixj] = x;
          }
        }
      }
      __syncthreads();
    }
  }
}

template <int VEC>
__global__ void __launch_bounds__(kThreads) sample_rows_kernel(const uint16_t* __restrict__ logits, int V,
                                                               const SampleRowSpec* __restrict__ spec,
                                                               SampleRowOut* __restrict__ out,
                                                               int32_t* __restrict__ cand_ids,
                                                               float* __restrict__ cand_logits) {
  pdl_wait();
  const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const SampleRowSpec sp = spec[r];
  if (sp.mode != kSampleGreedy && sp.mode != kSampleTemperature && sp.mode != kSampleCandidates) {
    if (tid == 0) out[r] = SampleRowOut{-1, 0, 0.0, 0.f, 0.f};
    return;
  }
  const uint16_t* row = logits + static_cast<size_t>(r) * V;
  const int units = (V + VEC - 1) / VEC;

  __shared__ float s_val[kWarps];
  __shared__ int s_id[kWarps];
  __shared__ double s_wsum[kWarps];
  __shared__ int s_hist[256];
  __shared__ unsigned long long s_cand[kSampleMaxCandidates];
  __shared__ int s_misc[8];
  __shared__ double s_d[2];

  // ---- max / argmax (ties: lowest id) ----
  float best = -INFINITY;
  int bid = INT_MAX;
#pragma unroll 2
  for (int u = tid; u < units; u += kThreads) {
    uint32_t b[VEC];
    load_unit<VEC>(row, V, u, b);
#pragma unroll
    for (int j = 0; j < VEC; ++j) fold_max(best, bid, bits_to_f32(b[j]), u * VEC + j);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bid, o);
    fold_max(best, bid, ov, oi);
  }
  if (lane == 0) {
    s_val[warp] = best;
    s_id[warp] = bid;
  }
  __syncthreads();
  if (tid == 0) {
    float bv = s_val[0];
    int bi = s_id[0];
    for (int w = 1; w < kWarps; ++w) fold_max(bv, bi, s_val[w], s_id[w]);
    s_val[0] = bv;
    s_id[0] = bi == INT_MAX ? 0 : bi;
  }
  __syncthreads();
  const float mx = s_val[0];
  if (sp.mode == kSampleGreedy) {
    if (tid == 0) out[r] = SampleRowOut{s_id[0], 0, 0.0, mx, 0.f};
    return;
  }

  // ---- Z over warp segments of consecutive units (the walk below reuses the segment sums) ----
  const float inv_t = sp.inv_t;
  const int per_warp = (units + kWarps - 1) / kWarps;
  {
    const int u0 = warp * per_warp, u1 = min(units, u0 + per_warp);
    double acc = 0;
    for (int u = u0 + lane; u < u1; u += 32) {
      uint32_t b[VEC];
      load_unit<VEC>(row, V, u, b);
      float part = 0.f;
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        if (u * VEC + j < V) part += expf((bits_to_f32(b[j]) - mx) * inv_t);
      acc += part;
    }
    acc = warp_sum_d(acc);
    if (lane == 0) s_wsum[warp] = acc;
  }
  __syncthreads();
  if (tid == 0) {
    double z = 0;
    for (int w = 0; w < kWarps; ++w) z += s_wsum[w];
    s_d[0] = z;
  }
  __syncthreads();
  const double z = s_d[0];

  if (sp.mode == kSampleTemperature) {
    // First id whose prefix sum exceeds u * Z: the segment holding it, then one warp walks in id order.
    if (warp != 0) return;
    const double target = sp.u * z;
    double base = 0;
    const int w0 = max(0, segment_at(s_wsum, kWarps, target, 0.0, &base));
    int last_pos = -1;
    const int token = walk_units<VEC>([&](int u, uint32_t(&b)[VEC]) { load_unit<VEC>(row, V, u, b); },
                                      w0 * per_warp, units, 0, V, mx, inv_t, target, base, &last_pos);
    if (lane == 0) {
      const int tok = token >= 0 ? token : (last_pos >= 0 ? last_pos : s_id[0]);
      out[r] = SampleRowOut{tok, 0, z, mx, bits_to_f32(row[tok])};
    }
    return;
  }

  // ---- top C: radix select on the 16-bit key, two 8-bit digits ----
  const int C = max(1, min(sp.candidates, min(V, kSampleMaxCandidates)));
  // digit 0: high byte over all elements; digit 1: low byte among those whose high byte is the threshold's.
  int above = 0, thr = 0;
  for (int digit = 0; digit < 2; ++digit) {
    for (int i = tid; i < 256; i += kThreads) s_hist[i] = 0;
    __syncthreads();
    for (int u = tid; u < units; u += kThreads) {
      uint32_t b[VEC];
      load_unit<VEC>(row, V, u, b);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (u * VEC + j >= V) continue;
        const uint32_t k = order_key(b[j]);
        if (digit == 0) atomicAdd(&s_hist[k >> 8], 1);
        else if (static_cast<int>(k >> 8) == thr) atomicAdd(&s_hist[k & 255], 1);
      }
    }
    __syncthreads();
    if (warp == 0) digit_at(s_hist, C - above, s_misc);
    __syncthreads();
    above += s_misc[1];
    thr = digit == 0 ? s_misc[0] : (thr << 8) | s_misc[0];
    __syncthreads();
  }
  // Keys above thr: all taken; keys equal to thr: the lowest (C - above) ids.
  const uint32_t tkey = static_cast<uint32_t>(thr);
  const int take_eq = C - above;
  if (tid == 0) {
    s_misc[2] = 0;  // candidates written
    s_misc[3] = 0;  // threshold ties taken
  }
  __syncthreads();
  collect_candidates<kThreads, VEC>([&](int u, uint32_t(&b)[VEC]) { load_unit<VEC>(row, V, u, b); }, units, 0, V,
                                    tkey, take_eq, kSampleMaxCandidates, s_cand, s_misc, s_id);
  const int n = min(s_misc[2], kSampleMaxCandidates);
  for (int i = n + tid; i < kSampleMaxCandidates; i += kThreads) s_cand[i] = 0ull;
  __syncthreads();
  sort_desc<kThreads>(s_cand, kSampleMaxCandidates);
  if (tid < C) {
    const unsigned long long e = s_cand[tid];
    cand_ids[static_cast<size_t>(r) * kSampleMaxCandidates + tid] = static_cast<int32_t>(~static_cast<uint32_t>(e));
    cand_logits[static_cast<size_t>(r) * kSampleMaxCandidates + tid] =
        bits_to_f32(key_to_bits(static_cast<uint32_t>(e >> 32)));
  }
  if (tid == 0) out[r] = SampleRowOut{-1, n, z, mx, 0.f};
}

// ---- the same summaries with each row split over a cluster of kClCtas CTAs -----------------------------------
// For large vocabularies (16-byte loads): CTA `rank` of a row's cluster copies its slice of the row (units [beg, end),
// 38 KB at the Qwen3 vocabulary) into shared memory with every load of a thread in flight, and every later pass reads
// shared memory. Max / argmax: per CTA, then every CTA combines the kClCtas partials (stored into each CTA's shared
// memory) in rank order, which is id order. Z: per warp over consecutive units (the per-unit fp32 parts of the
// one-CTA kernel), the CTAs' sums combined in rank order. The temperature pick: the CTA whose share of Z holds u * Z
// walks its slice in id order. Top C: each CTA selects the top min(C, slice) of its slice exactly (the one-CTA
// kernel's radix select, histograms aggregated per warp) and sorts them; every CTA copies the sorted lists of the
// others and ranks its own entries in the merge of all (key descending, id ascending: a total order), writing those of
// rank < C. The global top C is inside the union of the local ones, so the output is the one-CTA kernel's.
constexpr int kClCtas = 8, kClThreads = 512, kClWarps = kClThreads / 32, kClUnroll = 5;
// Vocabularies the cluster kernel takes: from 16384 (smaller rows: the one-CTA kernel) up to a slice of 96 KB.
constexpr int kClMinVocab = 16384, kClMaxVocab = kClCtas * 8 * 6144;
constexpr size_t kClMaxSmem = 6144 * 16 + static_cast<size_t>(kClCtas) * kSampleMaxCandidates * 8;

// Block-wide histogram add of `bin` (0-255) over the active lanes, one shared atomic per distinct bin of the warp.
__device__ __forceinline__ void hist_add(int* hist, uint32_t bin, bool active) {
  const unsigned mask = __ballot_sync(0xffffffffu, active);
  if (!active) return;
  const unsigned peers = __match_any_sync(mask, bin);
  if ((threadIdx.x & 31) == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
}

__global__ void __launch_bounds__(kClThreads) sample_rows_cluster_kernel(const uint16_t* __restrict__ logits, int V,
                                                                         const SampleRowSpec* __restrict__ spec,
                                                                         SampleRowOut* __restrict__ out,
                                                                         int32_t* __restrict__ cand_ids,
                                                                         float* __restrict__ cand_logits) {
  extern __shared__ __align__(16) unsigned char cl_smem[];
  __shared__ float c_max[kClCtas];
  __shared__ int c_arg[kClCtas], c_cnt[kClCtas];
  __shared__ double c_z[kClCtas];
  __shared__ float w_val[kClWarps];
  __shared__ int w_id[kClWarps];
  __shared__ double w_sum[kClWarps];
  __shared__ int hist[256];
  __shared__ int misc[8];
  const int rank = static_cast<int>(cluster_rank()), r = blockIdx.x / kClCtas;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int units = V / 8, per = (units + kClCtas - 1) / kClCtas;
  const int beg = min(units, rank * per), end = min(units, beg + per), n_units = end - beg;
  uint4* slice = reinterpret_cast<uint4*>(cl_smem);
  pdl_wait();
  const SampleRowSpec sp = spec[r];
  if (sp.mode != kSampleGreedy && sp.mode != kSampleTemperature && sp.mode != kSampleCandidates) {
    if (rank == 0 && tid == 0) out[r] = SampleRowOut{-1, 0, 0.0, 0.f, 0.f};
    return;  // the whole cluster: the mode is the row's
  }
  const uint4* row = reinterpret_cast<const uint4*>(logits + static_cast<size_t>(r) * V);
  // No CTA stores into another's shared memory before every CTA of the cluster runs: this barrier's wait comes after
  // the loads.
  cluster_arrive_relaxed();

  // ---- the slice into shared memory, max / argmax on the way ----
  float best = -INFINITY;
  int bid = INT_MAX;
  for (int u0 = tid; u0 < n_units; u0 += kClThreads * kClUnroll) {
    uint4 v[kClUnroll];
#pragma unroll
    for (int k = 0; k < kClUnroll; ++k) {
      const int u = u0 + k * kClThreads;
      v[k] = u < n_units ? __ldg(row + beg + u) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < kClUnroll; ++k) {
      const int u = u0 + k * kClThreads;
      if (u >= n_units) break;
      slice[u] = v[k];
      uint32_t b[8];
      unpack_unit(v[k], b);
#pragma unroll
      for (int j = 0; j < 8; ++j) fold_max(best, bid, bits_to_f32(b[j]), (beg + u) * 8 + j);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bid, o);
    fold_max(best, bid, ov, oi);
  }
  if (lane == 0) {
    w_val[warp] = best;
    w_id[warp] = bid;
  }
  __syncthreads();
  if (warp == 0) {
    best = lane < kClWarps ? w_val[lane] : -INFINITY;
    bid = lane < kClWarps ? w_id[lane] : INT_MAX;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bid, o);
      fold_max(best, bid, ov, oi);
    }
  }
  cluster_wait();
  if (warp == 0) {
    const float cb = __shfl_sync(0xffffffffu, best, 0);
    const int ci = __shfl_sync(0xffffffffu, bid, 0);
    if (lane < kClCtas) {  // this CTA's partial into every CTA of the cluster
      st_cluster_f32(cluster_map(&c_max[rank], lane), cb);
      st_cluster_s32(cluster_map(&c_arg[rank], lane), ci);
    }
  }
  cluster_arrive();
  cluster_wait();
  float mx = -INFINITY;
  int arg = INT_MAX;
  for (int c = 0; c < kClCtas; ++c) fold_max(mx, arg, c_max[c], c_arg[c]);
  if (arg == INT_MAX) arg = 0;
  if (sp.mode == kSampleGreedy) {
    if (rank == 0 && tid == 0) out[r] = SampleRowOut{arg, 0, 0.0, mx, 0.f};
    return;  // nothing reads this CTA's shared memory any more
  }

  // ---- Z: warp segments of consecutive units of the slice ----
  const float inv_t = sp.inv_t;
  const int per_warp = (n_units + kClWarps - 1) / kClWarps;
  {
    const int u0 = warp * per_warp, u1 = min(n_units, u0 + per_warp);
    double acc = 0;
    for (int u = u0 + lane; u < u1; u += 32) {
      uint32_t b[8];
      unpack_unit(slice[u], b);
      float part = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) part += expf((bits_to_f32(b[j]) - mx) * inv_t);
      acc += part;
    }
    acc = warp_sum_d(acc);
    if (lane == 0) w_sum[warp] = acc;
  }
  __syncthreads();
  if (tid < kClCtas) {
    double z = 0;
    for (int w = 0; w < kClWarps; ++w) z += w_sum[w];
    st_cluster_f64(cluster_map(&c_z[rank], tid), z);
  }
  cluster_arrive();
  cluster_wait();
  double z = 0;
  for (int c = 0; c < kClCtas; ++c) z += c_z[c];

  if (sp.mode == kSampleTemperature) {
    // The CTA whose share holds u * Z (rounding past the last share: the last share with weight) walks its slice.
    const double target = sp.u * z;
    double base = 0;
    const int c0 = segment_at(c_z, kClCtas, target, 0.0, &base);
    if (c0 < 0) {  // no weight anywhere: the argmax, as the one-CTA kernel ends
      if (rank == 0 && tid == 0) out[r] = SampleRowOut{arg, 0, z, mx, mx};
      return;
    }
    if (rank != c0 || warp != 0) return;
    double wbase = base;
    const int w0 = max(0, segment_at(w_sum, kClWarps, target, base, &wbase));
    int last_pos = -1;
    const int token = walk_units<8>([&](int u, uint32_t(&b)[8]) { unpack_unit(slice[u], b); }, w0 * per_warp, n_units,
                                    beg * 8, INT_MAX, mx, inv_t, target, wbase, &last_pos);
    if (lane == 0) {
      const int tok = token >= 0 ? token : (last_pos >= 0 ? last_pos : arg);
      out[r] = SampleRowOut{tok, 0, z, mx, bits_to_f32(static_cast<uint32_t>(logits[static_cast<size_t>(r) * V + tok]))};
    }
    return;
  }

  // ---- top C of the slice: radix select on the 16-bit key, two 8-bit digits ----
  const int C = max(1, min(sp.candidates, min(V, kSampleMaxCandidates)));
  const int n_local = min(C, n_units * 8);
  int cpad = 2;  // a power of two >= C, at least one 16-byte pair
  while (cpad < C) cpad <<= 1;
  unsigned long long* lists = reinterpret_cast<unsigned long long*>(cl_smem + static_cast<size_t>(per) * 16);
  unsigned long long* mine = lists + static_cast<size_t>(rank) * cpad;
  int above = 0, thr = 0;
  for (int digit = 0; digit < 2; ++digit) {
    for (int i = tid; i < 256; i += kClThreads) hist[i] = 0;
    __syncthreads();
    for (int u0 = 0; u0 < n_units; u0 += kClThreads) {  // warp-uniform trip count (hist_add's ballot)
      const int u = u0 + tid;
      uint32_t b[8];
      unpack_unit(u < n_units ? slice[u] : make_uint4(0, 0, 0, 0), b);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const uint32_t k = order_key(b[j]);
        if (digit == 0) hist_add(hist, k >> 8, u < n_units);
        else hist_add(hist, k & 255, u < n_units && static_cast<int>(k >> 8) == thr);
      }
    }
    __syncthreads();
    if (warp == 0) digit_at(hist, n_local - above, misc);
    __syncthreads();
    above += misc[1];
    thr = digit == 0 ? misc[0] : (thr << 8) | misc[0];
    __syncthreads();
  }
  const uint32_t tkey = static_cast<uint32_t>(thr);
  const int take_eq = n_local - above;
  if (tid == 0) {
    misc[2] = 0;  // candidates written
    misc[3] = 0;  // threshold ties taken
  }
  for (int i = n_local + tid; i < cpad; i += kClThreads) mine[i] = 0ull;
  __syncthreads();
  collect_candidates<kClThreads, 8>([&](int u, uint32_t(&b)[8]) { unpack_unit(slice[u], b); }, n_units, beg * 8,
                                    INT_MAX, tkey, take_eq, n_local, mine, misc, w_id);
  sort_desc<kClThreads>(mine, cpad);  // the local list descending, padding 0 last
  if (tid < kClCtas) st_cluster_s32(cluster_map(&c_cnt[rank], tid), n_local);
  cluster_arrive();
  cluster_wait();
  // The other CTAs' sorted lists into this CTA's copy, 16 bytes at a time.
  const int chunks = cpad / 2;  // two entries per 16 bytes
  for (int i = tid; i < (kClCtas - 1) * chunks; i += kClThreads) {
    const int c = (rank + 1 + i / chunks) % kClCtas, at = (i % chunks) * 2;
    if (at >= c_cnt[c]) continue;
    unsigned long long* dst = lists + static_cast<size_t>(c) * cpad + at;
    const uint4 v = ld_cluster_v4(cluster_map(dst, c));
    *reinterpret_cast<uint4*>(dst) = v;
  }
  __syncthreads();
  // Rank of each own entry in the merge: its index plus, per other list, the entries ahead of it.
  for (int i = tid; i < n_local; i += kClThreads) {
    const unsigned long long e = mine[i];
    int rk = i;
    for (int c = 0; c < kClCtas && rk < C; ++c) {
      if (c == rank) continue;
      const unsigned long long* L = lists + static_cast<size_t>(c) * cpad;
      int lo = 0, hi = c_cnt[c];  // entries ahead of e: the first index whose entry is below e
      while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (L[mid] > e) lo = mid + 1;
        else hi = mid;
      }
      rk += lo;
    }
    if (rk < C) {
      cand_ids[static_cast<size_t>(r) * kSampleMaxCandidates + rk] = static_cast<int32_t>(~static_cast<uint32_t>(e));
      cand_logits[static_cast<size_t>(r) * kSampleMaxCandidates + rk] =
          bits_to_f32(key_to_bits(static_cast<uint32_t>(e >> 32)));
    }
  }
  if (rank == 0 && tid == 0) {
    int total = 0;
    for (int c = 0; c < kClCtas; ++c) total += c_cnt[c];
    out[r] = SampleRowOut{-1, min(C, total), z, mx, 0.f};
  }
  // Nobody leaves while another CTA may still copy its list.
  cluster_arrive();
  cluster_wait();
}

// One CTA per row: each thread takes edits of the row in turn (ids distinct: no two threads touch one logit).
__global__ void __launch_bounds__(256) apply_logit_edits_kernel(uint16_t* __restrict__ logits, int V,
                                                                const int32_t* __restrict__ row_begin,
                                                                const LogitEditSpec* __restrict__ edits,
                                                                float* __restrict__ edit_raw) {
  pdl_wait();
  const int r = blockIdx.x;
  const int b = row_begin[r], e = row_begin[r + 1];
  for (int i = b + static_cast<int>(threadIdx.x); i < e; i += blockDim.x) {
    const LogitEditSpec ed = edits[i];
    if (ed.id < 0 || ed.id >= V) continue;
    uint16_t* at = logits + static_cast<size_t>(r) * V + ed.id;
    const float raw = bits_to_f32(*at);
    edit_raw[i] = raw;
    // The host's f32 steps one by one (no fused multiply-add).
    float l = __fadd_rn(raw, ed.bias);
    if (ed.rep != 1.f) l = l > 0.f ? __fdiv_rn(l, ed.rep) : __fmul_rn(l, ed.rep);
    l = __fsub_rn(l, ed.sub);
    *at = __bfloat16_as_ushort(__float2bfloat16_rn(l));
  }
}

// Guided decoding: a thread per logit of the rows that have a mask (blockIdx.y: the row); a clear bit makes the logit
// -inf (bf16 0xFF80). The 32 threads of a warp read one mask word.
__global__ void __launch_bounds__(256) apply_token_masks_kernel(uint16_t* __restrict__ logits, int V, int words,
                                                                const int32_t* __restrict__ mask_row,
                                                                const uint32_t* __restrict__ masks) {
  pdl_wait();
  const int r = blockIdx.y;
  const int m = mask_row[r];
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (m < 0 || t >= V) return;
  const uint32_t w = masks[static_cast<size_t>(m) * words + (t >> 5)];
  if (!((w >> (t & 31)) & 1u)) logits[static_cast<size_t>(r) * V + t] = 0xFF80;
}

}  // namespace

Status apply_token_masks(bf16* logits, int rows, int vocab, int words, const int32_t* mask_row, const uint32_t* masks,
                         cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0) return invalid_argument("apply_token_masks: rows and vocab must be positive");
  if (rows > 65535) return invalid_argument("apply_token_masks: at most 65535 rows");
  if (words < (vocab + 31) / 32) return invalid_argument("apply_token_masks: a mask needs (vocab + 31) / 32 words");
  if (!logits || !mask_row || !masks) return invalid_argument("apply_token_masks: null pointer");
  return launch("apply_token_masks", apply_token_masks_kernel, dim3((vocab + 255) / 256, rows), dim3(256), 0, stream,
                reinterpret_cast<uint16_t*>(logits), vocab, words, mask_row, masks);
}

Status apply_logit_edits(bf16* logits, int rows, int vocab, const int32_t* row_begin, const LogitEditSpec* edits,
                         float* edit_raw, cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0) return invalid_argument("apply_logit_edits: rows and vocab must be positive");
  if (!logits || !row_begin || !edits || !edit_raw) return invalid_argument("apply_logit_edits: null pointer");
  return launch("apply_logit_edits", apply_logit_edits_kernel, dim3(rows), dim3(256), 0, stream,
                reinterpret_cast<uint16_t*>(logits), vocab, row_begin, edits, edit_raw);
}

Status sample_rows(const bf16* logits, int rows, int vocab, const SampleRowSpec* spec, SampleRowOut* out,
                   int32_t* cand_ids, float* cand_logits, cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0) return invalid_argument("sample_rows: rows and vocab must be positive");
  if (!logits || !spec || !out || !cand_ids || !cand_logits) return invalid_argument("sample_rows: null pointer");
  const auto* bits = reinterpret_cast<const uint16_t*>(logits);
  const bool vec = vocab % 8 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  if (vec && vocab >= kClMinVocab && vocab <= kClMaxVocab) {
    const int per = (vocab / 8 + kClCtas - 1) / kClCtas;
    const size_t smem = static_cast<size_t>(per) * 16 + static_cast<size_t>(kClCtas) * kSampleMaxCandidates * 8;
    const cudaError_t smem_attr = once_per_device<cudaError_t>([&] {  // function attributes are per GPU
      return cudaFuncSetAttribute(sample_rows_cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(kClMaxSmem));
    });
    ZEST_RETURN_IF_ERROR(cuda_status(smem_attr, "sample_rows: shared memory attribute"));
    return launch_cluster("sample_rows", sample_rows_cluster_kernel, dim3(rows * kClCtas), dim3(kClThreads), smem,
                          stream, kClCtas, bits, vocab, spec, out, cand_ids, cand_logits);
  }
  if (vec)
    return launch("sample_rows", sample_rows_kernel<8>, dim3(rows), dim3(kThreads), 0, stream, bits, vocab, spec, out,
                  cand_ids, cand_logits);
  return launch("sample_rows", sample_rows_kernel<1>, dim3(rows), dim3(kThreads), 0, stream, bits, vocab, spec, out,
                cand_ids, cand_logits);
}

}  // namespace zest::cuda
