// Elementwise kernels of the vision tower: LayerNorm (+ residual), bias + GELU, patch coordinates, the
// resampled learned position embedding and the 2-D rotary embedding of q/k.
#include <cmath>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vision_kernels.h"

namespace zest::cuda {

namespace {

constexpr int kRowsPerBlock = 8;  // LayerNorm: one warp per row

std::string str(long long v) { return std::to_string(v); }

Status check_rows(const char* what, int rows, int cols) {
  if (rows <= 0 || cols <= 0)
    return invalid_argument(std::string(what) + ": rows and cols must be positive (got " + str(rows) + ", " +
                            str(cols) + ")");
  return Status::ok();
}

// Mean and rsqrt(var + eps) of one fp32 row, two passes, by one warp.
__device__ __forceinline__ void row_stats(const float* x, int dim, float eps, int lane, float& mean, float& inv) {
  float s = 0.f;
  for (int i = lane; i < dim; i += 32) s += x[i];
  mean = warp_sum(s) / static_cast<float>(dim);
  float v = 0.f;
  for (int i = lane; i < dim; i += 32) {
    const float d = x[i] - mean;
    v = fmaf(d, d, v);
  }
  inv = rsqrtf(warp_sum(v) / static_cast<float>(dim) + eps);
}

__global__ void layernorm_kernel(const float* __restrict__ x, const bf16* __restrict__ w, const bf16* __restrict__ b,
                                 bf16* __restrict__ y, int rows, int dim, float eps) {
  pdl_wait();
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  const float* xr = x + static_cast<size_t>(row) * dim;
  float mean, inv;
  row_stats(xr, dim, eps, lane, mean, inv);
  bf16* yr = y + static_cast<size_t>(row) * dim;
  for (int i = lane; i < dim; i += 32)
    yr[i] = __float2bfloat16((xr[i] - mean) * inv * __bfloat162float(w[i]) + __bfloat162float(b[i]));
}

__global__ void residual_layernorm_kernel(float* __restrict__ x, const bf16* __restrict__ delta,
                                          const bf16* __restrict__ bias, const bf16* __restrict__ w,
                                          const bf16* __restrict__ b, bf16* __restrict__ y, int rows, int dim,
                                          float eps) {
  pdl_wait();
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / 32, lane = threadIdx.x % 32;
  if (row >= rows) return;
  float* xr = x + static_cast<size_t>(row) * dim;
  const bf16* dr = delta + static_cast<size_t>(row) * dim;
  for (int i = lane; i < dim; i += 32) xr[i] += __bfloat162float(dr[i]) + (bias ? __bfloat162float(bias[i]) : 0.f);
  float mean, inv;
  row_stats(xr, dim, eps, lane, mean, inv);
  bf16* yr = y + static_cast<size_t>(row) * dim;
  for (int i = lane; i < dim; i += 32)
    yr[i] = __float2bfloat16((xr[i] - mean) * inv * __bfloat162float(w[i]) + __bfloat162float(b[i]));
}

__device__ __forceinline__ float gelu(float v, bool tanh_approx) {
  if (tanh_approx) {
    constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * v * (1.f + tanhf(kC * (v + 0.044715f * v * v * v)));
  }
  return 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
}

// 8 bf16 per thread (cols % 8 == 0) or one (otherwise); op 0: bias add, 1: bias + gelu tanh, 2: bias + gelu erf.
template <int V>
__global__ void bias_act_kernel(bf16* __restrict__ h, const bf16* __restrict__ bias, size_t n_vec, int cols, int op) {
  pdl_wait();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n_vec;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int c0 = static_cast<int>((i * V) % cols);
    bf16 v[V];
    if constexpr (V == 8) {
      *reinterpret_cast<uint4*>(v) = *reinterpret_cast<const uint4*>(h + i * V);
    } else {
      v[0] = h[i];
    }
#pragma unroll
    for (int e = 0; e < V; ++e) {
      float f = __bfloat162float(v[e]) + (bias ? __bfloat162float(bias[c0 + e]) : 0.f);
      if (op != 0) f = gelu(f, op == 1);
      v[e] = __float2bfloat16(f);
    }
    if constexpr (V == 8) {
      *reinterpret_cast<uint4*>(h + i * V) = *reinterpret_cast<const uint4*>(v);
    } else {
      h[i] = v[0];
    }
  }
}

Status bias_act(const char* name, bf16* h, const bf16* bias, int rows, int cols, int op, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_rows(name, rows, cols));
  const size_t n = static_cast<size_t>(rows) * cols;
  const bool vec = cols % 8 == 0 && reinterpret_cast<uintptr_t>(h) % 16 == 0;
  const size_t n_vec = vec ? n / 8 : n;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<size_t>((n_vec + threads - 1) / threads, 16ull * sm_count()));
  if (vec) return launch(name, bias_act_kernel<8>, dim3(blocks), dim3(threads), 0, stream, h, bias, n_vec, cols, op);
  return launch(name, bias_act_kernel<1>, dim3(blocks), dim3(threads), 0, stream, h, bias, n_vec, cols, op);
}

__global__ void f32_to_bf16_kernel(const float* __restrict__ x, bf16* __restrict__ y, size_t n) {
  pdl_wait();
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    y[i] = __float2bfloat16(x[i]);
}

// Image of patch row r: the last image whose first row is <= r (grids sorted by first row).
__device__ __forceinline__ int image_of_row(const int32_t* grids, int n_images, int r) {
  int lo = 0, hi = n_images - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (grids[mid * 4] <= r)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

__global__ void patch_coords_kernel(const int32_t* __restrict__ grids, int n_images, int N, int merge, int half,
                                    float theta, int32_t* __restrict__ coords, float2* __restrict__ rope_cs) {
  pdl_wait();
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= N) return;
  const int img = image_of_row(grids, n_images, r);
  const int h = grids[img * 4 + 2], w = grids[img * 4 + 3];
  const int p = (r - grids[img * 4]) % (h * w);
  const int unit = merge * merge, block = p / unit, in = p % unit;
  const int row = (block / (w / merge)) * merge + in / merge;
  const int col = (block % (w / merge)) * merge + in % merge;
  coords[2 * r] = row;
  coords[2 * r + 1] = col;
  const int quarter = half / 2;
  for (int k = 0; k < half; ++k) {
    const int kk = k < quarter ? k : k - quarter;
    const float inv_freq = 1.0f / powf(theta, static_cast<float>(2 * kk) / static_cast<float>(half));
    const float a = static_cast<float>(k < quarter ? row : col) * inv_freq;
    rope_cs[static_cast<size_t>(r) * half + k] = make_float2(cosf(a), sinf(a));
  }
}

// Bilinear align-corners taps of one axis (as the CPU tower's axis_taps).
__device__ __forceinline__ void axis_taps(int index, int size, int side, int taps[2], float weights[2]) {
  const float src = static_cast<float>(index) * static_cast<float>(side - 1) / static_cast<float>(max(size - 1, 1));
  const float fl = floorf(src);
#pragma unroll
  for (int o = 0; o < 2; ++o) {
    taps[o] = min(max(static_cast<int>(fl) + o, 0), side - 1);
    weights[o] = fmaxf(0.f, 1.f - fabsf(src - fl - static_cast<float>(o)));
  }
}

// One CTA per patch row.
__global__ void pos_embed_add_kernel(const bf16* __restrict__ pe, const bf16* __restrict__ bias,
                                     const bf16* __restrict__ table, int side, const int32_t* __restrict__ grids,
                                     int n_images, const int32_t* __restrict__ coords, float* __restrict__ x, int dim) {
  pdl_wait();
  const int r = blockIdx.x;
  const int img = image_of_row(grids, n_images, r);
  int th[2], tw[2];
  float wh[2], ww[2];
  axis_taps(coords[2 * r], grids[img * 4 + 2], side, th, wh);
  axis_taps(coords[2 * r + 1], grids[img * 4 + 3], side, tw, ww);
  const bf16* rows[4] = {
      table + static_cast<size_t>(th[0] * side + tw[0]) * dim, table + static_cast<size_t>(th[0] * side + tw[1]) * dim,
      table + static_cast<size_t>(th[1] * side + tw[0]) * dim, table + static_cast<size_t>(th[1] * side + tw[1]) * dim};
  const float wt[4] = {wh[0] * ww[0], wh[0] * ww[1], wh[1] * ww[0], wh[1] * ww[1]};
  const bf16* per = pe + static_cast<size_t>(r) * dim;
  float* xr = x + static_cast<size_t>(r) * dim;
  for (int d = threadIdx.x; d < dim; d += blockDim.x) {
    float acc = 0.f;
#pragma unroll
    for (int t = 0; t < 4; ++t) acc += __bfloat162float(rows[t][d]) * wt[t];
    xr[d] = (__bfloat162float(per[d]) + (bias ? __bfloat162float(bias[d]) : 0.f)) + acc;
  }
}

// One thread per 8-byte chunk: 4 rotate-half pairs (d, d + head_dim/2) of a q or k head, or 8 values of v
// (bias only). Math in fp32.
__global__ void qkv_rope_kernel(bf16* __restrict__ qkv, const bf16* __restrict__ bias,
                                const float2* __restrict__ rope_cs, int N, int heads, int head_dim) {
  pdl_wait();
  const int H = heads * head_dim, half = head_dim / 2, rot = 2 * heads * (half / 4), units = rot + (bias ? H / 8 : 0);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < static_cast<size_t>(N) * units;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int r = static_cast<int>(i / units), u = static_cast<int>(i % units);
    bf16* row = qkv + static_cast<size_t>(r) * 3 * H;
    if (u < rot) {
      const int hh = u / (half / 4), j0 = (u % (half / 4)) * 4;
      const int d0 = hh * head_dim + j0, d1 = d0 + half;
      uint2 va = *reinterpret_cast<const uint2*>(row + d0), vb = *reinterpret_cast<const uint2*>(row + d1);
      const bf16* a = reinterpret_cast<const bf16*>(&va);
      const bf16* b = reinterpret_cast<const bf16*>(&vb);
      bf16 oa[4], ob[4];
      const float2* cs = rope_cs + static_cast<size_t>(r) * half + j0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float x = __bfloat162float(a[e]) + (bias ? __bfloat162float(bias[d0 + e]) : 0.f);
        const float y = __bfloat162float(b[e]) + (bias ? __bfloat162float(bias[d1 + e]) : 0.f);
        const float2 c = cs[e];
        oa[e] = __float2bfloat16(x * c.x - y * c.y);
        ob[e] = __float2bfloat16(y * c.x + x * c.y);
      }
      *reinterpret_cast<uint2*>(row + d0) = *reinterpret_cast<const uint2*>(oa);
      *reinterpret_cast<uint2*>(row + d1) = *reinterpret_cast<const uint2*>(ob);
    } else if (bias) {
      const int d = 2 * H + (u - rot) * 8;
      uint4 vv = *reinterpret_cast<const uint4*>(row + d);
      bf16* x = reinterpret_cast<bf16*>(&vv);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = __float2bfloat16(__bfloat162float(x[e]) + __bfloat162float(bias[d + e]));
      *reinterpret_cast<uint4*>(row + d) = vv;
    }
  }
}

}  // namespace

Status vision_layernorm(const float* x, const bf16* w, const bf16* b, bf16* y, int rows, int dim, float eps,
                        cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_rows("vision_layernorm", rows, dim));
  if (!x || !w || !b || !y) return invalid_argument("vision_layernorm: null pointer");
  return launch("vision_layernorm", layernorm_kernel, dim3((rows + kRowsPerBlock - 1) / kRowsPerBlock),
                dim3(kRowsPerBlock * 32), 0, stream, x, w, b, y, rows, dim, eps);
}

Status vision_residual_layernorm(float* x, const bf16* delta, const bf16* bias, const bf16* w, const bf16* b, bf16* y,
                                 int rows, int dim, float eps, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_rows("vision_residual_layernorm", rows, dim));
  if (!x || !delta || !w || !b || !y) return invalid_argument("vision_residual_layernorm: null pointer");
  return launch("vision_residual_layernorm", residual_layernorm_kernel,
                dim3((rows + kRowsPerBlock - 1) / kRowsPerBlock), dim3(kRowsPerBlock * 32), 0, stream, x, delta, bias,
                w, b, y, rows, dim, eps);
}

Status vision_bias_gelu(bf16* h, const bf16* bias, int rows, int cols, bool tanh, cudaStream_t stream) {
  return bias_act("vision_bias_gelu", h, bias, rows, cols, tanh ? 1 : 2, stream);
}

Status vision_bias_add(bf16* y, const bf16* bias, int rows, int cols, cudaStream_t stream) {
  return bias_act("vision_bias_add", y, bias, rows, cols, 0, stream);
}

Status vision_f32_to_bf16(const float* x, bf16* y, size_t n, cudaStream_t stream) {
  if (n == 0) return Status::ok();
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<size_t>((n + threads - 1) / threads, 16ull * sm_count()));
  return launch("vision_f32_to_bf16", f32_to_bf16_kernel, dim3(blocks), dim3(threads), 0, stream, x, y, n);
}

Status vision_patch_coords(const int32_t* grids, int n_images, int N, int merge, int head_dim, float theta,
                           int32_t* coords, float2* rope_cs, cudaStream_t stream) {
  if (n_images <= 0 || N <= 0 || merge <= 0)
    return invalid_argument("vision_patch_coords: n_images, N and merge must be positive");
  if (head_dim <= 0 || head_dim % 4 != 0)
    return invalid_argument("vision_patch_coords: head_dim " + str(head_dim) + " must be a positive multiple of 4");
  return launch("vision_patch_coords", patch_coords_kernel, dim3((N + 127) / 128), dim3(128), 0, stream, grids,
                n_images, N, merge, head_dim / 2, theta, coords, rope_cs);
}

Status vision_pos_embed_add(const bf16* pe, const bf16* bias, const bf16* pos_table, int side, const int32_t* grids,
                            int n_images, const int32_t* coords, float* x, int N, int dim, cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_rows("vision_pos_embed_add", N, dim));
  if (side <= 0 || n_images <= 0) return invalid_argument("vision_pos_embed_add: side and n_images must be positive");
  return launch("vision_pos_embed_add", pos_embed_add_kernel, dim3(N), dim3(std::min(256, (dim + 31) / 32 * 32)), 0,
                stream, pe, bias, pos_table, side, grids, n_images, coords, x, dim);
}

Status vision_qkv_rope(bf16* qkv, const bf16* bias, const float2* rope_cs, int N, int heads, int head_dim,
                       cudaStream_t stream) {
  ZEST_RETURN_IF_ERROR(check_rows("vision_qkv_rope", N, heads * head_dim));
  if (head_dim % 8 != 0)
    return invalid_argument("vision_qkv_rope: head_dim must be a multiple of 8, got " + str(head_dim));
  if (reinterpret_cast<uintptr_t>(qkv) % 16 != 0)
    return invalid_argument("vision_qkv_rope: qkv must be 16-byte aligned");
  const size_t units = static_cast<size_t>(N) * (2 * heads * (head_dim / 8) + (bias ? heads * head_dim / 8 : 0));
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<size_t>((units + threads - 1) / threads, 16ull * sm_count()));
  return launch("vision_qkv_rope", qkv_rope_kernel, dim3(blocks), dim3(threads), 0, stream, qkv, bias, rope_cs, N,
                heads, head_dim);
}

}  // namespace zest::cuda
