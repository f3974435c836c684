#include "eval/score_layer.h"

#include <fstream>

#include <nlohmann/json.hpp>

namespace zest::eval {

Result<ScoreLayerChoice> choose_score_layer(const std::shared_ptr<engine::ModelBundle>& model, const EvalData& data,
                                            const engine::EngineOptions& engine_opts, const ScoreLayerOptions& opts) {
  if (!model->config.vision) return invalid_argument("choosing a VisionZip score block needs a vision model");
  if (!(opts.rate > 0 && opts.rate < 1)) return invalid_argument("the rate must be in (0, 1)");
  ScoreLayerChoice c;
  c.rate = opts.rate;
  c.items = static_cast<int64_t>(data.items.size());
  c.depth = model->config.vision->depth;
  const accel::VisionPruneOptions saved_prune = model->vision_prune;
  accel::VisionPruneOptions vp;
  vp.rate = opts.rate;
  vp.mode = accel::VisionPruneOptions::Mode::kGlobal;
  bool any_visual = false;
  for (int64_t layer = -1; layer >= -c.depth; --layer) {
    vp.score_layer = layer;
    model->vision_prune = vp;
    RunOptions ro = opts.run;
    ro.label = "score block " + std::to_string(layer);
    auto r = run_eval(model, data, engine_opts, ro);
    model->vision_prune = saved_prune;
    if (!r.ok()) return r.status().with_context("score block " + std::to_string(layer));
    BlockScore b;
    b.score_layer = layer;
    for (const ItemResult& it : r->items) {
      b.exact += it.exact;
      b.anls += it.anls;
      any_visual = any_visual || it.visual_tokens_before > it.visual_tokens_after;
    }
    if (!r->items.empty()) {
      b.exact /= static_cast<double>(r->items.size());
      b.anls /= static_cast<double>(r->items.size());
    }
    c.blocks.push_back(b);
  }
  if (!any_visual) return invalid_argument("no calibration item had visual tokens to prune: the data needs images");
  // Highest exact match, then ANLS; the later block (the first in this order) wins ties.
  const BlockScore* best = &c.blocks.front();
  for (const BlockScore& b : c.blocks)
    if (b.exact > best->exact || (b.exact == best->exact && b.anls > best->anls)) best = &b;
  c.score_layer = best->score_layer;
  return c;
}

Status write_score_layer(const std::string& file, const ScoreLayerChoice& c) {
  nlohmann::json blocks = nlohmann::json::array();
  for (const BlockScore& b : c.blocks)
    blocks.push_back({{"score_layer", b.score_layer}, {"exact", b.exact}, {"anls", b.anls}});
  const nlohmann::json j = {{"format", "zest-visionzip/1"}, {"score_layer", c.score_layer}, {"rate", c.rate},
                            {"items", c.items},           {"vision_depth", c.depth}, {"blocks", blocks}};
  std::ofstream f(file);
  if (!f) return not_found("cannot write '" + file + "'");
  f << j.dump(1) << "\n";
  if (!f) return not_found("cannot write '" + file + "'");
  return Status::ok();
}

}  // namespace zest::eval
