// Device-side statistics for SERE calibration: every expert of one MoE layer run on a chunk of that layer's
// inputs, reduced to the pair statistic that accel::ExpertSimilarityAccumulator turns into a similarity.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"

namespace zest::kernels {

// One MoE layer's expert weights, bf16 in device memory: gate_up [E, 2I, H] (per expert I gate rows, then I up
// rows, each over H inputs) and down [E, H, I]. The engine fills it from the decoder's
// model::DeviceExpertWeights.
struct DeviceExpertWeights {
  const void* gate_up = nullptr;
  const void* down = nullptr;
  int64_t experts = 0, hidden = 0, inter = 0;
};

class ExpertGram {
 public:
  virtual ~ExpertGram() = default;
  // x: host f32 [n, hidden] (the layer's normalised MoE inputs), 1 <= n <= max_tokens. With
  // y_e[t] = down_e(silu(gate_e x_t) * up_e x_t) (x and the SiLU product rounded to bf16, f32 accumulation),
  // writes gram [E, E] f64 row-major, symmetric: sum_t <y_p[t], y_q[t]>, or with `cosine` sum_t of the
  // cosine of y_p[t] and y_q[t] (a zero vector contributes 0).
  virtual Status compute(const DeviceExpertWeights& w, const float* x, int64_t n, bool cosine,
                         std::vector<double>& gram) = 0;
};

// The CUDA implementation, sized for layers of `experts` x (hidden, inter) and chunks of up to max_tokens;
// kUnsupported without CUDA.
Result<std::unique_ptr<ExpertGram>> make_cuda_expert_gram(int64_t experts, int64_t hidden, int64_t inter,
                                                          int64_t max_tokens);

}  // namespace zest::kernels
