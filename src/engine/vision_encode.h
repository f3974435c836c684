// Runs a request's images through preprocessing and the vision tower (with VisionZip when enabled).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include <nlohmann/json.hpp>

#include "accel/visionzip.h"
#include "core/status.h"
#include "core/tensor.h"
#include "engine/model_bundle.h"
#include "io/image.h"
#include "vision/preprocess.h"

namespace zest::engine {

struct EncodedImages {
  std::vector<std::pair<int64_t, int64_t>> merged_grids;  // (rows, cols) of merged tokens per image
  std::vector<std::vector<int64_t>> kept;  // per image: kept merged-token indices (ascending), all when unpruned
  Tensor embeds;                      // [sum kept, hidden]
  std::vector<Tensor> deepstack;      // each [sum kept, hidden]
  // Per image: a 64-bit key of what its rows depend on (decoded pixels and pixel budget, the request's resolved
  // VisionZip settings and, when a request-global budget prunes, every image of the request), for prefix caching.
  std::vector<uint64_t> image_keys;
  // Wall time of the cache misses' preprocessing, of the encoder forward (VisionZip scores included) and of
  // the cache bookkeeping, selection and gather.
  double preprocess_ms = 0, tower_ms = 0, select_ms = 0;
  double front_ms = 0;                // wall time of preprocessing + tower of the misses (overlapped when grouped)
  int64_t tower_forwards = 0;         // tower forwards run (groups of misses)
  int64_t cache_hits = 0;             // images served from the encoder cache
};

struct EncodeOptions {
  // Device encoders: images per tower forward when a request misses more (0 = all in one forward).
  int64_t group_images = 8;
  // Preprocess the next group on the worker threads while the tower runs the current one (results are the
  // same as without: each group is preprocessed and encoded the same way).
  bool overlap = true;
  // Polled before each tower forward: true stops the encoding with kResourceExhausted ("cancelled"), e.g.
  // when the client that asked for it has gone away. Empty = never.
  std::function<bool()> cancelled;
};

// Loads the vision tower of a VL model into model.vision on model.backend (the CUDA tower for kCuda, the
// CPU tower otherwise) and creates the encoder cache; no-op for text-only models.
Status load_vision_tower(ModelBundle& model);

// The request's pixel budget ("mm_processor_kwargs": min_pixels / max_pixels, positive integers, each at
// most `ceiling`, min <= max once merged with the model's), checked without touching an image. Errors name the
// field (kInvalidArgument).
Result<vision::PixelBudget> request_pixel_budget(const ModelBundle& model, const nlohmann::json& mm_kwargs,
                                                 int64_t ceiling);
// The request's VisionZip options: model.vision_prune overridden by the request's "vision_prune" object (rate,
// mode, budget, min_tokens, contextual, score_layer; null = the model's), validated (errors name the key).
Result<accel::VisionPruneOptions> request_vision_prune(const ModelBundle& model, const nlohmann::json& overrides);
// Ranges of VisionZip options and, for a vision model, the score layer against the tower's depth.
Status check_vision_prune(const ModelBundle& model, const accel::VisionPruneOptions& options);

// Preprocesses (one image per worker task) and encodes the images under the pixel budget and VisionZip options
// (both as parsed at the edge: request_pixel_budget, request_vision_prune).
Result<EncodedImages> encode_images(const ModelBundle& model, const std::vector<io::Image>& images,
                                    const vision::PixelBudget& budget, const accel::VisionPruneOptions& prune,
                                    const EncodeOptions& opts = {});

}  // namespace zest::engine
