#include "engine/vision_encode.h"

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <numeric>
#include <optional>
#include <thread>

#include "accel/visionzip.h"
#include "backend/cuda.h"
#include "engine/encoder_cache.h"
#include "core/timer.h"
#include "vision/encoder.h"
#include "vision/preprocess.h"

namespace zest::engine {
namespace {

using nlohmann::json;

Result<vision::PixelBudget> pixel_budget(const json& kw) {
  vision::PixelBudget b;
  if (kw.is_null()) return b;
  if (!kw.is_object()) return invalid_argument("'mm_processor_kwargs' must be an object");
  for (const auto& [key, v] : kw.items()) {
    if (key != "min_pixels" && key != "max_pixels")
      return invalid_argument("'mm_processor_kwargs' has the unsupported key '" + key + "' (min_pixels, max_pixels)");
    if (!v.is_number_integer() || v.get<int64_t>() <= 0)
      return invalid_argument("'mm_processor_kwargs' " + key + " must be a positive integer");
    (key == "min_pixels" ? b.min_pixels : b.max_pixels) = v.get<int64_t>();
  }
  return b;
}

// The score block in [0, depth): negative counts from the end of the tower.
Result<int64_t> resolve_score_layer(int64_t layer, int64_t depth) {
  const int64_t r = layer < 0 ? layer + depth : layer;
  if (r < 0 || r >= depth)
    return invalid_argument("vision score layer " + std::to_string(layer) + " is out of range: the tower has " +
                            std::to_string(depth) + " blocks");
  return r;
}

}  // namespace

Result<vision::PixelBudget> request_pixel_budget(const ModelBundle& model, const json& mm_kwargs, int64_t ceiling) {
  ZEST_ASSIGN_OR_RETURN(vision::PixelBudget b, pixel_budget(mm_kwargs));
  for (const auto& [key, v] : {std::pair{"min_pixels", b.min_pixels}, std::pair{"max_pixels", b.max_pixels}})
    if (v && *v > ceiling)
      return invalid_argument("'mm_processor_kwargs' " + std::string(key) + " = " + std::to_string(*v) +
                              " is above this server's limit of " + std::to_string(ceiling) +
                              " pixels per image (--mm-max-pixels)");
  const int64_t lo = b.min_pixels.value_or(model.preprocessor.min_pixels);
  const int64_t hi = b.max_pixels.value_or(model.preprocessor.max_pixels);
  if (lo > hi)
    return invalid_argument("'mm_processor_kwargs' min_pixels (" + std::to_string(lo) + ") is above max_pixels (" +
                            std::to_string(hi) + ")");
  return b;
}

Status check_vision_prune(const ModelBundle& model, const accel::VisionPruneOptions& p) {
  if (!(p.rate >= 0.0f && p.rate <= 1.0f)) return invalid_argument("VisionZip rate must be in [0, 1]");
  if (!(p.contextual >= 0.0f && p.contextual < 1.0f)) return invalid_argument("VisionZip contextual must be in [0, 1)");
  if (p.budget < -1) return invalid_argument("VisionZip budget must be >= 0 (or -1 for none)");
  if (p.min_tokens < 1) return invalid_argument("VisionZip min_tokens must be >= 1");
  if (!std::isfinite(p.density_gamma)) return invalid_argument("VisionZip density gamma must be finite");
  if (model.config.vision) ZEST_RETURN_IF_ERROR(resolve_score_layer(p.score_layer, model.config.vision->depth).status());
  return Status::ok();
}

Result<accel::VisionPruneOptions> request_vision_prune(const ModelBundle& model, const json& o) {
  accel::VisionPruneOptions p = model.vision_prune;
  if (o.is_null()) return p;
  if (!o.is_object()) return invalid_argument("'vision_prune' must be an object");
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
        p.score_layer = x;
      }
    } else {
      return invalid_argument("vision_prune: unknown key '" + key +
                              "' (rate, mode, budget, min_tokens, contextual, score_layer)");
    }
  }
  if (model.config.vision) {
    auto layer = resolve_score_layer(p.score_layer, model.config.vision->depth);
    if (!layer.ok()) return invalid_argument("vision_prune.score_layer: " + layer.status().message());
  }
  return p;
}

Status load_vision_tower(ModelBundle& model) {
  if (!model.config.vision) return Status::ok();
  ZEST_ASSIGN_OR_RETURN(std::unique_ptr<vision::VisionEncoder> encoder,
                        model.backend == model::Backend::kCuda
                            ? vision::make_cuda_vision_encoder(model.weights, *model.config.vision)
                            : vision::make_cpu_vision_encoder(model.weights, *model.config.vision));
  model.vision = std::move(encoder);
  model.encoder_cache = std::make_shared<EncoderCache>();
  return Status::ok();
}

Result<EncodedImages> encode_images(const ModelBundle& model, const std::vector<io::Image>& images,
                                    const vision::PixelBudget& budget, const accel::VisionPruneOptions& popt,
                                    const EncodeOptions& opts) {
  if (!model.vision) return invalid_argument("this model takes no images (it has no vision tower)");
  EncodedImages enc;
  ZEST_RETURN_IF_ERROR(check_vision_prune(model, popt));
  ZEST_ASSIGN_OR_RETURN(const int64_t layer, resolve_score_layer(popt.score_layer, model.config.vision->depth));
  const bool pruning = popt.rate > 0.0f || popt.budget >= 0;
  const int64_t merge = model.config.vision->spatial_merge_size;

  // Per image: the cached tower output, or a miss to encode now.
  const int64_t min_px = budget.min_pixels.value_or(model.preprocessor.min_pixels);
  const int64_t max_px = budget.max_pixels.value_or(model.preprocessor.max_pixels);
  std::vector<std::shared_ptr<const CachedImage>> per_image(images.size());
  std::vector<uint64_t> keys(images.size());
  std::vector<size_t> misses;
  for (size_t i = 0; i < images.size(); ++i) keys[i] = image_cache_key(images[i], min_px, max_px);
  {
    // Prefix-cache keys: the encoder-cache key (pixels, pixel budget) folded with the pruning that picks and
    // merges the image's rows; a request-global budget makes each image's rows depend on all of them.
    auto fold = [](uint64_t h, uint64_t v) {
      h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
      h *= 0xff51afd7ed558ccdULL;
      return h ^ (h >> 33);
    };
    auto bits = [](float f) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      return static_cast<uint64_t>(u);
    };
    uint64_t prune_key = fold(0x7a65737450727531ULL, pruning ? 1 : 0);
    if (pruning) {
      for (uint64_t v : {bits(popt.rate), static_cast<uint64_t>(popt.mode), static_cast<uint64_t>(popt.budget),
                         static_cast<uint64_t>(popt.min_tokens), bits(popt.contextual),
                         static_cast<uint64_t>(popt.density), bits(popt.density_gamma), static_cast<uint64_t>(layer)})
        prune_key = fold(prune_key, v);
      if (popt.mode == accel::VisionPruneOptions::Mode::kGlobal)
        for (uint64_t k : keys) prune_key = fold(prune_key, k);
    }
    for (uint64_t k : keys) enc.image_keys.push_back(fold(prune_key, k));
  }
  for (size_t i = 0; i < images.size(); ++i) {
    auto hit = model.encoder_cache ? model.encoder_cache->get(keys[i]) : nullptr;
    if (hit && (!pruning || hit->score_layer == layer)) {
      per_image[i] = std::move(hit);
      ++enc.cache_hits;
    } else {
      misses.push_back(i);
    }
  }

  // Device-resident encoders keep the tower outputs, the cache entries and the selected rows on the device;
  // VisionZip with contextual tokens or density weighting takes the host path below.
  const bool device = model.vision->device_resident();
  const bool device_select =
      device && popt.contextual == 0 && (popt.density == accel::DensityMeasure::kNone || popt.density_gamma == 0);
  if (!misses.empty()) {
    const std::optional<int64_t> score_layer = pruning ? std::optional<int64_t>(layer) : std::nullopt;
    // Groups of misses, one tower forward each (device encoders, many images): while the tower runs group g,
    // a producer thread preprocesses group g + 1 on the worker threads.
    const size_t G = device && opts.group_images > 0 ? static_cast<size_t>(opts.group_images) : misses.size();
    std::vector<std::vector<size_t>> groups;
    for (size_t at = 0; at < misses.size(); at += G)
      groups.emplace_back(misses.begin() + at, misses.begin() + std::min(misses.size(), at + G));
    struct Prepared {
      Result<vision::PixelBatch> batch = internal_error("not prepared");
      double ms = 0;
    };
    std::vector<Prepared> prepared(groups.size());
    auto prepare = [&](size_t g) {
      const double t = now_ms();
      if (groups.size() == 1 && misses.size() == images.size()) {
        prepared[g].batch = vision::preprocess_images_parallel(images, model.preprocessor, budget);
      } else {
        std::vector<io::Image> todo;
        for (size_t i : groups[g]) todo.push_back(images[i]);
        prepared[g].batch = vision::preprocess_images_parallel(todo, model.preprocessor, budget);
      }
      prepared[g].ms = now_ms() - t;
    };
    std::mutex mu;
    std::condition_variable cv;
    size_t ready = 0;
    std::thread producer;
    const bool overlap = opts.overlap && groups.size() > 1;
    if (overlap)
      producer = std::thread([&] {
        for (size_t g = 0; g < groups.size(); ++g) {
          prepare(g);
          std::lock_guard<std::mutex> l(mu);
          ready = g + 1;
          cv.notify_one();
        }
      });
    const double t_front = now_ms();
    Status failed = Status::ok();
    for (size_t g = 0; g < groups.size() && failed.is_ok(); ++g) {
      if (overlap) {
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return ready > g; });
      } else {
        prepare(g);
      }
      enc.preprocess_ms += prepared[g].ms;
      if (!prepared[g].batch.ok()) {
        failed = prepared[g].batch.status();
        break;
      }
      if (opts.cancelled && opts.cancelled()) {
        failed = resource_exhausted("the request was cancelled before its images were encoded");
        break;
      }
      const vision::PixelBatch& batch = *prepared[g].batch;
      double t0 = now_ms();
      vision::VisionEncoding out;
      vision::DeviceEncoding dout;
      Status st = Status::ok();
      if (device) {
        auto r = model.vision->forward_device(batch, score_layer);
        if (r.ok()) dout = std::move(r).value();
        st = r.status();
      } else {
        auto r = model.vision->forward(batch, score_layer);
        if (r.ok()) out = std::move(r).value();
        st = r.status();
      }
      enc.tower_ms += now_ms() - t0;
      if (!st.is_ok()) {
        failed = st;
        break;
      }
      t0 = now_ms();
      int64_t row = 0;
      for (size_t m = 0; m < groups[g].size(); ++m) {
        auto e = std::make_shared<CachedImage>();
        const vision::GridTHW& gr = batch.grids[m];
        e->grid_t = gr.t;
        e->grid_h = gr.h;
        e->grid_w = gr.w;
        if (device) {
          // Views of the forward's device tensors (the entries share their storage).
          const int64_t M = dout.tokens_per_image[m];
          e->embeds = dout.embeds.rows(row, row + M);
          for (const Tensor& ds : dout.deepstack) e->deepstack.push_back(ds.rows(row, row + M));
          if (pruning) {
            e->device_scores = dout.scores.rows(row, row + M);
            e->score_layer = layer;
          }
          row += M;
        } else {
          const int64_t M = out.tokens_per_image[m];
          e->embeds = out.embeds.rows(row, row + M).clone();
          for (const Tensor& ds : out.deepstack) e->deepstack.push_back(ds.rows(row, row + M).clone());
          if (pruning) {
            // VisionZip: the attention each patch receives inside its image, summed per merged token.
            e->scores = std::move(out.scores[m]);
            e->score_layer = layer;
          }
          row += M;
        }
        if (model.encoder_cache) model.encoder_cache->put(keys[groups[g][m]], e);
        per_image[groups[g][m]] = std::move(e);
      }
      prepared[g].batch = internal_error("consumed");  // frees the group's pixel_values
      enc.select_ms += now_ms() - t0;
    }
    if (producer.joinable()) producer.join();
    enc.front_ms = now_ms() - t_front;
    enc.tower_forwards = static_cast<int64_t>(groups.size());
    ZEST_RETURN_IF_ERROR(failed);
  }

  if (device_select) {
    // Scores -> selection -> one gather of the embeddings and DeepStack rows, on the device.
    const double t0 = now_ms();
    std::vector<vision::DeviceImageRows> rows;
    for (const auto& e : per_image) {
      enc.merged_grids.emplace_back(e->grid_t * e->grid_h / merge, e->grid_w / merge);
      rows.push_back({e->embeds, e->deepstack, e->device_scores});
    }
    vision::DeviceSelectOptions so;
    if (pruning) {
      so.rate = popt.rate;
      so.global = popt.mode == accel::VisionPruneOptions::Mode::kGlobal;
      so.budget = popt.budget;
      so.min_tokens = popt.min_tokens;
    }
    ZEST_ASSIGN_OR_RETURN(vision::DeviceSelection sel, model.vision->select_device(rows, so));
    enc.kept = std::move(sel.kept);
    enc.embeds = std::move(sel.embeds);
    enc.deepstack = std::move(sel.deepstack);
    enc.select_ms += now_ms() - t0;
    return enc;
  }
  if (device) {
    // Host selection (contextual tokens, density weighting) over device entries: host copies of them.
    for (auto& e : per_image) {
      if (e->embeds.device() == Device::CPU) continue;
      auto h = std::make_shared<CachedImage>(*e);
      ZEST_ASSIGN_OR_RETURN(h->embeds, model.vision->to_host(e->embeds));
      for (size_t l = 0; l < e->deepstack.size(); ++l) {
        ZEST_ASSIGN_OR_RETURN(h->deepstack[l], model.vision->to_host(e->deepstack[l]));
      }
      if (e->device_scores.defined()) {
        ZEST_ASSIGN_OR_RETURN(Tensor sc, model.vision->to_host(e->device_scores));
        h->scores.assign(sc.data<float>(), sc.data<float>() + sc.numel());
      }
      e = std::move(h);
    }
  }

  const double t0 = now_ms();
  std::vector<int64_t> tokens_per_image;
  for (const auto& e : per_image) {
    enc.merged_grids.emplace_back(e->grid_t * e->grid_h / merge, e->grid_w / merge);
    tokens_per_image.push_back(e->embeds.dim(0));
  }
  const int64_t D = per_image.front()->embeds.dim(1);
  const size_t n_ds = per_image.front()->deepstack.size();
  std::vector<std::vector<accel::VisionToken>> plan(per_image.size());
  if (pruning) {
    std::vector<float> scores, emb_all;
    for (const auto& e : per_image) {
      scores.insert(scores.end(), e->scores.begin(), e->scores.end());
      if (popt.contextual > 0) emb_all.insert(emb_all.end(), e->embeds.data<float>(), e->embeds.data<float>() + e->embeds.numel());
    }
    ZEST_ASSIGN_OR_RETURN(plan, accel::plan_vision_tokens(scores, tokens_per_image, emb_all,
                                                          popt.contextual > 0 ? D : 0, popt));
  } else {
    for (size_t i = 0; i < per_image.size(); ++i)
      for (int64_t j = 0; j < tokens_per_image[i]; ++j) plan[i].push_back({j, false, {}});
  }
  // Gather (or merge) the rows of the main embeddings and every deepstack feature.
  int64_t total = 0;
  for (const auto& toks : plan) total += static_cast<int64_t>(toks.size());
  enc.embeds = Tensor::empty({total, D});
  for (size_t l = 0; l < n_ds; ++l) enc.deepstack.push_back(Tensor::empty({total, D}));
  int64_t dst = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const CachedImage& e = *per_image[i];
    const int64_t M = tokens_per_image[i];
    auto gather = [&](const Tensor& from, Tensor& to) -> Status {
      ZEST_ASSIGN_OR_RETURN(std::vector<float> rows,
                            accel::build_merged_rows({from.data<float>(), static_cast<size_t>(M * D)}, D, plan[i]));
      std::memcpy(to.data<float>() + dst * D, rows.data(), rows.size() * sizeof(float));
      return Status::ok();
    };
    ZEST_RETURN_IF_ERROR(gather(e.embeds, enc.embeds));
    for (size_t l = 0; l < n_ds; ++l) ZEST_RETURN_IF_ERROR(gather(e.deepstack[l], enc.deepstack[l]));
    enc.kept.push_back(accel::token_positions(plan[i]));
    dst += static_cast<int64_t>(plan[i].size());
  }
  enc.select_ms += now_ms() - t0;
  return enc;
}

}  // namespace zest::engine
