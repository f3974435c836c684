// SERE in the engine: loads the per-layer expert similarity, re-routes each MoE layer's top-k during
// decode steps (and prefill when asked), and keeps per-layer statistics; plus the calibration that
// writes the similarity file.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "accel/sere.h"
#include "core/status.h"
#include "engine/model_bundle.h"
#include "model/qwen3.h"

namespace zest::engine {

struct SereOptions {
  int64_t primary = 0;          // S; 0 (or >= top-k) turns re-routing off
  float threshold = 0.0f;       // rho
  std::vector<float> layer_thresholds;  // optional per-layer rho (overrides threshold)
  std::string similarity_file;  // default: <model dir>/sere_similarity.safetensors
  bool prefill = false;         // also re-route prefill steps
  bool enabled() const { return primary > 0; }
};

// Per-layer sums over the steps that re-routed (divide by steps for averages).
struct SereLayerStats {
  int64_t steps = 0;
  double distinct_before = 0, distinct_after = 0, critical = 0, rerouted_slots = 0, slots = 0;
};

class SereRuntime {
 public:
  // Loads and checks the similarity file against the model (layers, experts, config hash). The runtime
  // reads the statistics of model.decoder(): the model must outlive it.
  static Result<std::unique_ptr<SereRuntime>> create(const ModelBundle& model, const SereOptions& opts);
  // Hooks for one step, or null when this step is not re-routed.
  const model::MoeHooks* hooks(bool decode_only) const;
  // {"experts_per_layer_before": [...], "experts_per_layer_after": [...], "critical_per_layer": [...],
  //  "rerouted_share_per_layer": [...], "steps": n, ...}, averaged over re-routed steps (host re-routing
  // and the decoder's own device re-routing together).
  nlohmann::json stats_json() const;
  // Per-layer sums of both host and device re-routing.
  std::vector<SereLayerStats> layer_stats() const;

 private:
  SereOptions opts_;
  int64_t experts_ = 0;
  const model::TextDecoder* decoder_ = nullptr;
  std::vector<model::RerouteCounts> device_base_;  // the decoder's device counters when this runtime was made
  model::RerouteSpec spec_;  // primary, per-layer rho and similarity [E, E] (empty for dense layers)
  mutable std::mutex stats_mu_;  // stats are written on the engine thread and read by metrics readers
  mutable std::vector<SereLayerStats> stats_;  // host re-routing only
  model::MoeHooks hooks_;
};

// A stable hash of the config fields that decide the experts' shapes and count (hex string).
std::string sere_config_hash(const io::ModelConfig& cfg);

struct CalibrationOptions {
  std::vector<std::string> text_files;
  int64_t max_tokens = 4096;  // calibration tokens in total
  int64_t chunk_tokens = 256; // tokens per forward chunk (and per expert evaluation)
  accel::SimilarityMetric metric = accel::SimilarityMetric::kFrobenius;
  std::string out_file;       // default: <model dir>/sere_similarity.safetensors
  bool progress = true;       // progress bar on stderr
};

// Runs the model over the calibration text; at every MoE layer runs every expert on that layer's real
// inputs chunk by chunk and accumulates the similarity; writes `layers.{l}.similarity` [E, E] f32
// with metadata (metric, tokens, config_hash). Returns the output path.
Result<std::string> calibrate_sere(const ModelBundle& model, const CalibrationOptions& opts);

}  // namespace zest::engine
