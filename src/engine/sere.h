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
#include "engine/request.h"
#include "model/decoder.h"

namespace zest::engine {

// The engine's SERE: the re-routing setting (S, rho) and where its data comes from.
struct SereOptions {
  accel::SereParams params;     // S (0 = off) and rho
  std::string similarity_file;  // default: <model dir>/sere_similarity.safetensors
  bool prefill = false;         // also re-route prefill steps
  std::string protected_file;   // per-layer experts never re-routed away (zest sere-protect); empty = none
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
  // Per-layer sums of both host and device re-routing (divide by steps for averages).
  std::vector<accel::RerouteCounts> layer_stats() const;

 private:
  SereOptions opts_;
  int64_t experts_ = 0;
  const model::TextDecoder* decoder_ = nullptr;
  std::vector<accel::RerouteCounts> device_base_;  // the decoder's device counters when this runtime was made
  model::RerouteSpec spec_;  // S, per-layer rho and similarity [E, E] (empty for dense layers)
  mutable std::mutex stats_mu_;  // stats are written on the engine thread and read by metrics readers
  mutable std::vector<accel::RerouteCounts> stats_;  // host re-routing only
  model::MoeHooks hooks_;
};

// The per-layer similarity [E, E] of a SERE similarity file (empty for dense layers), checked against the
// model (config hash, shapes); `file` empty = <model dir>/sere_similarity.safetensors.
Result<std::vector<std::vector<float>>> load_sere_similarity(const ModelBundle& model, const std::string& file);

// Critical-expert protection (docs/sere.md §4): experts ranked by the damage of re-routing them away.
struct ProtectOptions {
  std::string similarity_file;  // as SereOptions::similarity_file
  int64_t per_layer = 4;        // experts protected per layer (the highest KL ones with KL > 0)
  bool progress = true;         // progress line on stderr
};

struct ProtectedExperts {
  int64_t tokens = 0;                         // calibration positions the KL is averaged over
  std::vector<std::vector<double>> kl;        // [layer][expert] mean KL(teacher || substituted); empty for dense layers
  std::vector<std::vector<int32_t>> experts;  // [layer] protected ids, highest KL first
};

// For every MoE layer l and every expert e that the prompts route to in a secondary slot (slot >= 1): runs the
// prompts with e forced out of the secondary slots of layer l to its most similar other expert (per the
// similarity file; substitution as accel::substitute_expert), and averages over all prompt positions the KL
// divergence of the next-token distribution from the unmodified run's. Experts never routed there score 0
// without a run. One forward per prompt and (layer, routed expert); the teacher's probabilities of all
// positions are kept in memory (4 * positions * vocab bytes).
Result<ProtectedExperts> rank_protected_experts(const ModelBundle& model, const std::vector<Prompt>& prompts,
                                                const ProtectOptions& opts);
// Writes the ranking as JSON: {"format": "zest-sere-protected/1", "config_hash", "tokens",
// "protected": [[ids] per layer], "kl": [[KL per expert] per layer]}.
Status write_protected_experts(const std::string& file, const ModelBundle& model, const ProtectedExperts& p);
// Reads the "protected" lists of such a file ([layer] -> ids), checked against the model.
Result<std::vector<std::vector<int32_t>>> load_protected_experts(const std::string& file, const ModelBundle& model);

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

// Reads calibration text files in order and tokenizes them as plain text (special-token strings stay
// text), stopping once max_tokens ids are read; returns at most max_tokens ids.
Result<std::vector<int32_t>> calibration_tokens(const ModelBundle& model, const std::vector<std::string>& files,
                                                int64_t max_tokens);

// Runs the model over the calibration text; at every MoE layer runs every expert on that layer's real
// inputs chunk by chunk and accumulates the similarity; writes `layers.{l}.similarity` [E, E] f32
// with metadata (metric, tokens, config_hash). Returns the output path.
Result<std::string> calibrate_sere(const ModelBundle& model, const CalibrationOptions& opts);

}  // namespace zest::engine
