// Reference CPU kernels in f32. Row-major raw-pointer interfaces; every function is deterministic
// (each output element is reduced in a fixed order, independent of the thread count).
#pragma once
#include <cstdint>

namespace zest::cpu {

// y[M,N] = x[M,K] * w[N,K]^T (+ bias[N] when bias != nullptr). nn.Linear convention.
void linear(float* y, const float* x, const float* w, const float* bias, int64_t M, int64_t N, int64_t K);

// Dot product of two length-n vectors, fixed summation order.
float dot(const float* a, const float* b, int64_t n);

// RMSNorm over each row of x[rows, dim]: y = w * x / sqrt(mean(x^2) + eps). y may alias x.
void rmsnorm(float* y, const float* x, const float* w, int64_t rows, int64_t dim, float eps);

// LayerNorm over each row: y = (x - mean) / sqrt(var + eps) * w + b. y may alias x.
void layernorm(float* y, const float* x, const float* w, const float* b, int64_t rows, int64_t dim, float eps);

// x[i] += y[i].
void add_inplace(float* x, const float* y, int64_t n);

// out[r, i] = silu(gu[r, i]) * gu[r, I + i] for gu[rows, 2I] (gate columns first).
void silu_mul(float* out, const float* gu, int64_t rows, int64_t I);

// In-place activations.
void gelu_tanh_inplace(float* x, int64_t n);
void gelu_erf_inplace(float* x, int64_t n);

// In-place softmax of one row of length n (max-subtracted, f32).
void softmax_inplace(float* x, int64_t n);

// Rotate-half RoPE on x[rows, heads, head_dim] with per-row cos/sin tables [rows, head_dim/2]
// (angle j applies to dims j and j + head_dim/2).
void rope_rotate_half(float* x, const float* cos, const float* sin, int64_t rows, int64_t heads, int64_t head_dim);

}  // namespace zest::cpu
