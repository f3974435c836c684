// SERE (similarity-based expert re-routing) for batched MoE decode: the CPU re-routing of one
// layer's top-k routing for one step, and the streaming calibration of the expert-similarity
// matrix. Pure functions over plain row-major arrays; see docs/sere.md.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace zest::accel {

// The SERE setting: one type from the command line and the request's server down to the device's re-routing
// spec (model::RerouteSpec), with one default (off).
struct SereParams {
  int64_t primary = 0;     // S: the first S slots of every valid token form the primary set P; 0 (or >= top-k)
                           // turns re-routing off
  float threshold = 0.0f;  // rho: with rho > 0, a secondary expert whose best match in P has
                           // similarity < rho is kept (critical); rho = 0 re-routes all of them
  std::vector<float> layer_thresholds;  // optional rho per layer; empty = `threshold` in every layer
  bool enabled(int64_t top_k) const { return primary > 0 && primary < top_k; }
  float rho(int64_t layer) const {
    return layer_thresholds.empty() ? threshold : layer_thresholds[static_cast<size_t>(layer)];
  }
  // S >= 0, every rho finite, and layer_thresholds empty or one value per layer (kInvalidArgument naming it).
  Status validate(int64_t layers) const;
};

// Re-routing counters: of one sere_reroute call (steps = 1), or summed over the steps of a layer.
struct RerouteCounts {
  int64_t steps = 0;
  int64_t distinct_before = 0;  // distinct valid expert ids before re-routing
  int64_t distinct_after = 0;   // after (= |P| + critical when 0 < S < K)
  int64_t critical = 0;         // distinct secondary experts outside P that kept their id (best match below rho,
                                // or P empty)
  int64_t rerouted_slots = 0;   // (token, slot) pairs whose expert id was replaced
  int64_t slots = 0;            // (token, slot) pairs of the valid tokens
  RerouteCounts& operator+=(const RerouteCounts& o) {
    steps += o.steps;
    distinct_before += o.distinct_before;
    distinct_after += o.distinct_after;
    critical += o.critical;
    rerouted_slots += o.rerouted_slots;
    slots += o.slots;
    return *this;
  }
  RerouteCounts operator-(const RerouteCounts& o) const {
    return {steps - o.steps,       distinct_before - o.distinct_before, distinct_after - o.distinct_after,
            critical - o.critical, rerouted_slots - o.rerouted_slots,   slots - o.slots};
  }
};

// Re-routes one MoE layer's routing in place. ids [n_tokens, top_k] int32 and weights
// [n_tokens, top_k] f32 (renormalised) are in descending router-weight order per token. valid:
// one byte per token (0 = padding, left untouched and not part of P), or empty = all valid.
// sim: [n_experts, n_experts] f32 similarity, row u = expert being replaced.
// For each valid token, each slot k >= S whose expert u is valid and not in P becomes
// v* = argmax_{v in P} sim[u][v] (ties to the lowest v) unless rho > 0 and sim[u][v*] < rho.
// Ids < 0 or >= n_experts are left as they are and never join P. Weights are not changed, except
// that when a re-routed token ends up with the same expert in two slots, the later slot's weight
// is added to the first occurrence and the later slot becomes id -1 with weight 0 (the MoE layer
// skips id -1). S = 0 or S >= top_k leaves ids and weights bit-identical. Work O(E^2 + N*K).
// primary = S, threshold = rho (SereParams).
Result<RerouteCounts> sere_reroute(std::span<int32_t> ids, std::span<float> weights, int64_t n_tokens, int64_t top_k,
                                   std::span<const uint8_t> valid, std::span<const float> sim, int64_t n_experts,
                                   int64_t primary, float threshold);

// Critical-expert protection, expressed as data so that every SERE path (sere_reroute on the host, the
// CUDA kernel, which applies the same rule) honours it unchanged: the row of each protected expert in one
// layer's similarity [n_experts, n_experts] gets -1 off the diagonal (it has no acceptable substitute),
// and a threshold of 0 becomes the smallest normal float so that the rho test runs. A protected expert
// outside P then always fails the test and keeps its id (counted as critical). The one side effect: in a
// layer with protected experts and rho = 0, an expert whose best substitute has similarity exactly 0 (or
// below) is kept too. kInvalidArgument for an id outside [0, n_experts) or a similarity of the wrong size.
Status protect_experts(std::span<float> sim, int64_t n_experts, std::span<const int32_t> protected_ids,
                       float& threshold);

// Forces expert `from` out of slots k >= first_slot of every token: such a slot becomes `to`, with the
// duplicate convention of sere_reroute (a second occurrence of `to` in the token folds its weight into the
// first and becomes id -1, weight 0). Returns the number of slots replaced. For ranking experts by the
// damage their re-routing does (engine::rank_protected_experts).
int64_t substitute_expert(std::span<int32_t> ids, std::span<float> weights, int64_t n_tokens, int64_t top_k,
                          int64_t n_experts, int32_t from, int32_t to, int64_t first_slot);

enum class SimilarityMetric {
  kFrobenius,  // 1 - ||A_p - A_q||_F / max_{p != q} ||A_p - A_q||_F over the whole [T, H] outputs
  kCosine,     // (1 + mean_t cos(A_p[t], A_q[t])) / 2; a zero row has cosine 0
  kLinearCka,  // ||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F), columns centred over tokens,
               // clamped to [0, 1]; 0 when an expert's centred output is all zero
};

// Streams the outputs of all experts on the same calibration tokens, chunk by chunk, and builds
// the [E, E] similarity matrix of one MoE layer (symmetric, diagonal 1). Accumulates in f64 and
// never holds more than one chunk: Frobenius keeps the E x E Gram matrix of the flattened
// outputs, cosine the E x E sum of per-token cosines, linear CKA the H-vector column sums and
// the H x H cross moments of every expert pair (E(E+1)/2 * H^2 doubles). Feeding the tokens in
// several chunks gives the same bits as one chunk.
class ExpertSimilarityAccumulator {
 public:
  // Fails when the state would exceed max_state_bytes (bytes).
  static Result<ExpertSimilarityAccumulator> create(int64_t n_experts, int64_t hidden,
                                                    SimilarityMetric metric,
                                                    int64_t max_state_bytes = int64_t{1} << 30);

  // Adds one chunk: outputs [n_experts, n_tokens, hidden] f32, expert e's output on token t.
  Status add_chunk(std::span<const float> outputs, int64_t n_tokens);
  // Adds one chunk's pair statistic computed elsewhere (a device backend): gram [n_experts, n_experts]
  // row-major, sum over the chunk's n_tokens tokens of <y_p, y_q> (frobenius) or of their cosine (cosine),
  // read on and above the diagonal. Linear CKA cannot be fed this way.
  Status add_gram(std::span<const double> gram, int64_t n_tokens);

  // The similarity matrix [n_experts, n_experts] f32, row-major; needs at least one token
  // (two for linear CKA).
  Result<std::vector<float>> similarity() const;

  int64_t tokens_seen() const { return tokens_; }
  int64_t n_experts() const { return experts_; }
  int64_t hidden() const { return hidden_; }
  SimilarityMetric metric() const { return metric_; }

 private:
  ExpertSimilarityAccumulator(int64_t e, int64_t h, SimilarityMetric m) : experts_(e), hidden_(h), metric_(m) {}

  int64_t experts_ = 0;
  int64_t hidden_ = 0;
  SimilarityMetric metric_ = SimilarityMetric::kFrobenius;
  int64_t tokens_ = 0;
  std::vector<double> pair_;   // [E, E]: Gram (Frobenius) or sum of cosines (cosine)
  std::vector<double> sums_;   // [E, H]: column sums (CKA)
  std::vector<double> cross_;  // per pair p <= q, [H, H]: sum_t A_p[t] A_q[t]^T (CKA)
};

}  // namespace zest::accel
