// Sampling summaries of bf16 logits rows on the device (the device side of model/sampling.h): one CTA of 1024
// threads per row computes, as the row's plan asks, the argmax (ties to the lowest id), the max and
// Z = sum exp((l - max) / T) (fp32 exponentials, fp64 sums), the id-order inverse-CDF pick at u * Z, and the
// exact top C (radix select on the order-preserving 16-bit key of bf16 over two 8-bit digits, ties at the
// threshold resolved to the lower ids, then a bitonic sort of the C candidates by (key desc, id asc)).
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>

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
template <int VEC>
__device__ __forceinline__ void load_unit(const uint16_t* row, int V, int unit, uint32_t (&b)[VEC]) {
  if constexpr (VEC == 8) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(row) + unit);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      b[2 * j] = w[j] & 0xFFFFu;
      b[2 * j + 1] = w[j] >> 16;
    }
  } else {
    b[0] = unit < V ? row[unit] : 0u;
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
    for (int j = 0; j < VEC; ++j) {
      const float v = bits_to_f32(b[j]);
      const int id = u * VEC + j;
      if (v > best || (v == best && id < bid)) {
        best = v;
        bid = id;
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, bid, o);
    if (ov > best || (ov == best && oi < bid)) {
      best = ov;
      bid = oi;
    }
  }
  if (lane == 0) {
    s_val[warp] = best;
    s_id[warp] = bid;
  }
  __syncthreads();
  if (tid == 0) {
    float bv = s_val[0];
    int bi = s_id[0];
    for (int w = 1; w < kWarps; ++w)
      if (s_val[w] > bv || (s_val[w] == bv && s_id[w] < bi)) {
        bv = s_val[w];
        bi = s_id[w];
      }
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
    // When rounding leaves the target past the last segment, the last segment with weight is walked.
    int w0 = -1, w_last = 0;
    double base = 0, cum = 0, before_last = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (s_wsum[w] > 0) {
        w_last = w;
        before_last = cum;
      }
      if (w0 < 0 && cum + s_wsum[w] > target) {
        w0 = w;
        base = cum;
      }
      cum += s_wsum[w];
    }
    if (w0 < 0) {
      w0 = w_last;
      base = before_last;
    }
    int token = -1, last_pos = -1;
    for (int c = w0 * per_warp; c < units && token < 0; c += 32) {
      const int u = c + lane;
      float w[VEC];
      double ls = 0;
      int lane_last = -1;
      if (u < units) {
        uint32_t b[VEC];
        load_unit<VEC>(row, V, u, b);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          w[j] = u * VEC + j < V ? expf((bits_to_f32(b[j]) - mx) * inv_t) : 0.f;
          ls += w[j];
          if (w[j] > 0.f) lane_last = u * VEC + j;
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
          pick = u * VEC + j;
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
    if (lane == 0) out[r] = SampleRowOut{token >= 0 ? token : (last_pos >= 0 ? last_pos : s_id[0]), 0, z, mx, 0.f};
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
    if (warp == 0) {
      // Lane l holds bins 255 - 8l down to 248 - 8l; counts from the top.
      int cnt[8], s = 0;
#pragma unroll
      for (int j = 0; j < 8; ++j) s += cnt[j] = s_hist[255 - 8 * lane - j];
      int excl = s;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(0xffffffffu, excl, o);
        if (lane >= o) excl += n;
      }
      excl -= s;
      const int need = C - above;
      if (excl < need && excl + s >= need) {
        int acc = excl;
        for (int j = 0; j < 8; ++j) {
          if (acc + cnt[j] >= need) {
            s_misc[0] = 255 - 8 * lane - j;
            s_misc[1] = acc;
            break;
          }
          acc += cnt[j];
        }
      }
    }
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
  for (int t0 = 0; t0 < units; t0 += kThreads) {
    const int u = t0 + tid;
    uint32_t b[VEC];
    int n_eq = 0;
    if (u < units) {
      load_unit<VEC>(row, V, u, b);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        if (u * VEC + j >= V) continue;
        const uint32_t k = order_key(b[j]);
        if (k > tkey) {
          const int at = atomicAdd(&s_misc[2], 1);
          if (at < kSampleMaxCandidates)
            s_cand[at] = (static_cast<unsigned long long>(k) << 32) | (~static_cast<uint32_t>(u * VEC + j));
        } else if (k == tkey) {
          ++n_eq;
        }
      }
    }
    const int taken = s_misc[3];  // uniform: written only between the barriers below
    if (taken < take_eq) {
      // Exclusive prefix of the tie counts over the tile in id order (thread-major).
      int incl = n_eq;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int n = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += n;
      }
      if (lane == 31) s_id[warp] = incl;
      __syncthreads();
      int before = 0, tile = 0;
      for (int w = 0; w < kWarps; ++w) {
        if (w < warp) before += s_id[w];
        tile += s_id[w];
      }
      int rank = taken + before + incl - n_eq;
      if (n_eq > 0) {
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          if (u * VEC + j >= V) continue;
          if (order_key(b[j]) != tkey) continue;
          if (rank < take_eq) {
            const int at = atomicAdd(&s_misc[2], 1);
            if (at < kSampleMaxCandidates)
              s_cand[at] = (static_cast<unsigned long long>(tkey) << 32) | (~static_cast<uint32_t>(u * VEC + j));
          }
          ++rank;
        }
      }
      __syncthreads();
      if (tid == 0) s_misc[3] = min(take_eq, taken + tile);
    }
    __syncthreads();
  }
  const int n = min(s_misc[2], kSampleMaxCandidates);
  for (int i = n + tid; i < kSampleMaxCandidates; i += kThreads) s_cand[i] = 0ull;
  __syncthreads();
  // Bitonic sort, descending.
  for (int k = 2; k <= kSampleMaxCandidates; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      const int i = tid, ixj = i ^ j;
      if (ixj > i) {
        const unsigned long long a = s_cand[i], c = s_cand[ixj];
        const bool desc = (i & k) == 0;
        if (desc ? a < c : a > c) {
          s_cand[i] = c;
          s_cand[ixj] = a;
        }
      }
      __syncthreads();
    }
  }
  if (tid < C) {
    const unsigned long long e = s_cand[tid];
    cand_ids[static_cast<size_t>(r) * kSampleMaxCandidates + tid] = static_cast<int32_t>(~static_cast<uint32_t>(e));
    cand_logits[static_cast<size_t>(r) * kSampleMaxCandidates + tid] =
        bits_to_f32(key_to_bits(static_cast<uint32_t>(e >> 32)));
  }
  if (tid == 0) out[r] = SampleRowOut{-1, n, z, mx, 0.f};
}

}  // namespace

Status sample_rows(const bf16* logits, int rows, int vocab, const SampleRowSpec* spec, SampleRowOut* out,
                   int32_t* cand_ids, float* cand_logits, cudaStream_t stream) {
  if (rows <= 0 || vocab <= 0) return invalid_argument("sample_rows: rows and vocab must be positive");
  if (!logits || !spec || !out || !cand_ids || !cand_logits) return invalid_argument("sample_rows: null pointer");
  const auto* bits = reinterpret_cast<const uint16_t*>(logits);
  const bool vec = vocab % 8 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
  if (vec)
    return launch("sample_rows", sample_rows_kernel<8>, dim3(rows), dim3(kThreads), 0, stream, bits, vocab, spec, out,
                  cand_ids, cand_logits);
  return launch("sample_rows", sample_rows_kernel<1>, dim3(rows), dim3(kThreads), 0, stream, bits, vocab, spec, out,
                cand_ids, cand_logits);
}

}  // namespace zest::cuda
