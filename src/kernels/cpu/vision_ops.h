// CPU f32 kernels used by the vision tower: segment attention with log-sum-exp output.
#pragma once
#include <cstdint>

namespace zest::cpu {

// Non-causal softmax attention inside one segment of n tokens. q, k, v are [n, heads, head_dim]
// (row stride heads * head_dim); out is [n, heads * head_dim]. scores = q.k * scale; the softmax
// runs online over key blocks (running max and sum). When lse != nullptr it receives, for each
// head h and query i, lse[h * n + i] = log(sum_j exp(score_ij)) (natural log, f32).
// Deterministic: each (head, query) row is reduced by one thread in a fixed order.
void segment_attention(float* out, const float* q, const float* k, const float* v, int64_t n, int64_t heads,
                       int64_t head_dim, float scale, float* lse);

}  // namespace zest::cpu
