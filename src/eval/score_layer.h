// VisionZip's score block, chosen per model: the vision block whose received attention keeps answers best when
// the images of a calibration set are pruned at a given rate (zest calibrate-visionzip). The choice is written to
// MODEL/visionzip.json, which ModelBundle::load reads as the model's default score block.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/model_bundle.h"
#include "eval/dataset.h"
#include "eval/runner.h"

namespace zest::eval {

struct ScoreLayerOptions {
  double rate = 0.4;        // VisionZip rate the blocks are compared at (global budget)
  RunOptions run;           // batch, max tokens, progress
};

struct BlockScore {
  int64_t score_layer = 0;  // counted from the end (-1 = last block)
  double exact = 0, anls = 0;  // mean over the calibration items (0-1)
};

struct ScoreLayerChoice {
  double rate = 0;
  int64_t items = 0;
  int64_t depth = 0;
  std::vector<BlockScore> blocks;  // -1, -2, ..., -depth
  int64_t score_layer = 0;         // the best: highest exact match, then ANLS, then the later block
};

// Runs the data once per vision block with pruning at opts.rate and picks the best block. The model's VisionZip
// defaults are restored afterwards. Needs a vision model and data with images.
Result<ScoreLayerChoice> choose_score_layer(const std::shared_ptr<engine::ModelBundle>& model, const EvalData& data,
                                            const engine::EngineOptions& engine_opts, const ScoreLayerOptions& opts);

// {"format": "zest-visionzip/1", "score_layer", "rate", "items", "vision_depth", "blocks": [{score_layer, exact,
// anls}]}.
Status write_score_layer(const std::string& file, const ScoreLayerChoice& c);

}  // namespace zest::eval
