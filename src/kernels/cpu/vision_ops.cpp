#include "kernels/cpu/vision_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/thread_pool.h"
#include "kernels/cpu/ops.h"

namespace zest::cpu {

void segment_attention(float* out, const float* q, const float* k, const float* v, int64_t n, int64_t heads,
                       int64_t head_dim, float scale, float* lse) {
  constexpr int64_t kBlock = 64;
  const int64_t stride = heads * head_dim;
  parallel_for(heads * n, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> acc(head_dim);
    float scores[kBlock];
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t h = r / n, i = r % n;
      const float* qi = q + i * stride + h * head_dim;
      float m = -std::numeric_limits<float>::infinity();
      float sum = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
        const int64_t j1 = std::min(n, j0 + kBlock);
        float block_max = -std::numeric_limits<float>::infinity();
        for (int64_t j = j0; j < j1; ++j) {
          scores[j - j0] = dot(qi, k + j * stride + h * head_dim, head_dim) * scale;
          block_max = std::max(block_max, scores[j - j0]);
        }
        const float new_m = std::max(m, block_max);
        const float rescale = std::exp(m - new_m);  // 0 on the first block (m = -inf)
        sum *= rescale;
        for (int64_t d = 0; d < head_dim; ++d) acc[d] *= rescale;
        for (int64_t j = j0; j < j1; ++j) {
          const float p = std::exp(scores[j - j0] - new_m);
          sum += p;
          const float* vj = v + j * stride + h * head_dim;
          for (int64_t d = 0; d < head_dim; ++d) acc[d] += p * vj[d];
        }
        m = new_m;
      }
      float* o = out + i * stride + h * head_dim;
      const float inv = 1.0f / sum;
      for (int64_t d = 0; d < head_dim; ++d) o[d] = acc[d] * inv;
      if (lse != nullptr) lse[h * n + i] = m + std::log(sum);
    }
  });
}

}  // namespace zest::cpu
