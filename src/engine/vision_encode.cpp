#include "engine/vision_encode.h"

#include <cmath>
#include <cstring>
#include <numeric>

#include "accel/visionzip.h"
#include "core/timer.h"
#include "vision/preprocess.h"
#include "vision/tower.h"

namespace zest::engine {
namespace {

using nlohmann::json;

Result<vision::PixelBudget> pixel_budget(const json& kw) {
  vision::PixelBudget b;
  if (kw.is_null()) return b;
  for (const auto& [key, v] : kw.items()) {
    if (key != "min_pixels" && key != "max_pixels")
      return invalid_argument("mm_processor_kwargs: unknown key '" + key + "' (min_pixels, max_pixels)");
    if (!v.is_number_integer() || v.get<int64_t>() <= 0)
      return invalid_argument("mm_processor_kwargs." + key + " must be a positive integer");
    (key == "min_pixels" ? b.min_pixels : b.max_pixels) = v.get<int64_t>();
  }
  return b;
}

// The request's VisionZip options: the model defaults overridden by the request's "vision_prune" object.
Status prune_options(const ModelBundle& m, const json& o, accel::VisionPruneOptions& p, int64_t& layer) {
  p = m.vision_prune;
  layer = m.vision_score_layer;
  if (!o.is_null()) {
    for (const auto& [key, v] : o.items()) {
      const std::string f = "vision_prune." + key;
      if (key == "rate" || key == "contextual") {
        if (!v.is_number()) return invalid_argument(f + " must be a number");
        const double x = v.get<double>();
        if (!(x >= 0.0 && x < (key == "rate" ? 1.0000001 : 1.0))) return invalid_argument(f + " is out of range");
        (key == "rate" ? p.rate : p.contextual) = static_cast<float>(x);
      } else if (key == "mode") {
        if (!v.is_string() || (v != "uniform" && v != "global"))
          return invalid_argument(f + " must be \"uniform\" or \"global\"");
        p.mode = v == "uniform" ? accel::VisionPruneOptions::Mode::kUniform : accel::VisionPruneOptions::Mode::kGlobal;
      } else if (key == "budget" || key == "min_tokens" || key == "score_layer") {
        if (!v.is_number_integer()) return invalid_argument(f + " must be an integer");
        const int64_t x = v.get<int64_t>();
        if (key == "budget") {
          if (x < -1) return invalid_argument(f + " must be >= 0 (or -1 for none)");
          p.budget = x;
        } else if (key == "min_tokens") {
          if (x < 1) return invalid_argument(f + " must be >= 1");
          p.min_tokens = x;
        } else {
          layer = x;
        }
      } else {
        return invalid_argument("vision_prune: unknown key '" + key +
                                "' (rate, mode, budget, min_tokens, contextual, score_layer)");
      }
    }
  }
  const int64_t depth = m.config.vision->depth;
  if (layer < 0) layer += depth;
  if (layer < 0 || layer >= depth)
    return invalid_argument("vision score layer out of range: the tower has " + std::to_string(depth) + " blocks");
  return Status::ok();
}

}  // namespace

Status load_vision_tower(ModelBundle& model) {
  if (!model.config.vision) return Status::ok();
  ZEST_ASSIGN_OR_RETURN(vision::VisionTower tower, vision::VisionTower::load(model.weights, *model.config.vision));
  model.vision = std::make_shared<vision::VisionTower>(std::move(tower));
  return Status::ok();
}

Result<EncodedImages> encode_images(const ModelBundle& model, const std::vector<io::Image>& images,
                                    const json& mm_kwargs, const json& prune) {
  if (!model.vision) return invalid_argument("this model takes no images (it has no vision tower)");
  EncodedImages enc;
  ZEST_ASSIGN_OR_RETURN(vision::PixelBudget budget, pixel_budget(mm_kwargs));
  accel::VisionPruneOptions popt;
  int64_t layer = 0;
  ZEST_RETURN_IF_ERROR(prune_options(model, prune, popt, layer));
  const bool pruning = popt.rate > 0.0f || popt.budget >= 0;

  double t0 = now_ms();
  ZEST_ASSIGN_OR_RETURN(vision::PixelBatch batch, vision::preprocess_images(images, model.preprocessor, budget));
  enc.preprocess_ms = now_ms() - t0;
  t0 = now_ms();
  ZEST_ASSIGN_OR_RETURN(vision::VisionOutput out,
                        model.vision->forward(batch.pixel_values, batch.grids,
                                              pruning ? std::optional<int64_t>(layer) : std::nullopt));
  enc.tower_ms = now_ms() - t0;

  const int64_t merge = model.config.vision->spatial_merge_size;
  for (const vision::GridTHW& g : batch.grids) enc.merged_grids.emplace_back(g.t * g.h / merge, g.w / merge);
  const int64_t D = out.embeds.dim(1);
  if (!pruning) {
    for (int64_t n : out.tokens_per_image) {
      enc.kept.emplace_back(n);
      std::iota(enc.kept.back().begin(), enc.kept.back().end(), 0);
    }
    enc.embeds = out.embeds;
    enc.deepstack = out.deepstack;
    return enc;
  }

  // VisionZip: attention-received scores per image, then one selection over the request.
  t0 = now_ms();
  const auto& cap = *out.attention;
  const int64_t heads = model.config.vision->num_heads, hd = model.vision->head_dim();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> scores;
  for (size_t i = 0; i < images.size(); ++i) {
    const accel::AttentionShape shape{cap.q[i].dim(0), heads, hd};
    ZEST_ASSIGN_OR_RETURN(std::vector<float> a,
                          accel::attention_received_scores({cap.q[i].data<float>(), static_cast<size_t>(cap.q[i].numel())},
                                                           {cap.k[i].data<float>(), static_cast<size_t>(cap.k[i].numel())},
                                                           {cap.lse[i].data<float>(), static_cast<size_t>(cap.lse[i].numel())},
                                                           shape, scale));
    ZEST_ASSIGN_OR_RETURN(std::vector<float> s, accel::merge_group_scores(a, merge * merge));
    scores.insert(scores.end(), s.begin(), s.end());
  }
  const std::span<const float> emb_all{out.embeds.data<float>(), static_cast<size_t>(out.embeds.numel())};
  ZEST_ASSIGN_OR_RETURN(auto plan, accel::plan_vision_tokens(scores, out.tokens_per_image,
                                                             popt.contextual > 0 ? emb_all : std::span<const float>{},
                                                             popt.contextual > 0 ? D : 0, popt));
  // Gather (or merge) the rows of the main embeddings and every deepstack feature.
  int64_t total = 0;
  for (const auto& toks : plan) total += static_cast<int64_t>(toks.size());
  enc.embeds = Tensor::empty({total, D});
  for (size_t l = 0; l < out.deepstack.size(); ++l) enc.deepstack.push_back(Tensor::empty({total, D}));
  int64_t src = 0, dst = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const int64_t M = out.tokens_per_image[i];
    auto gather = [&](const Tensor& from, Tensor& to) -> Status {
      ZEST_ASSIGN_OR_RETURN(std::vector<float> rows,
                            accel::build_merged_rows({from.data<float>() + src * D, static_cast<size_t>(M * D)}, D, plan[i]));
      std::memcpy(to.data<float>() + dst * D, rows.data(), rows.size() * sizeof(float));
      return Status::ok();
    };
    ZEST_RETURN_IF_ERROR(gather(out.embeds, enc.embeds));
    for (size_t l = 0; l < out.deepstack.size(); ++l) ZEST_RETURN_IF_ERROR(gather(out.deepstack[l], enc.deepstack[l]));
    enc.kept.push_back(accel::token_positions(plan[i]));
    src += M;
    dst += static_cast<int64_t>(plan[i].size());
  }
  enc.select_ms = now_ms() - t0;
  return enc;
}

}  // namespace zest::engine
