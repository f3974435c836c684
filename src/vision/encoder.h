// The backend-neutral vision encoder: the Qwen3-VL vision tower over a batch of preprocessed images,
// returning host f32 embeddings, DeepStack features and (when asked) the VisionZip score of every LLM
// token. Implemented by the CPU f32 tower (vision::VisionTower, scores with the accel functions) and by
// the CUDA bf16 tower (src/kernels/cuda/vision_encoder.cu, scores with the device score kernel).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "vision/preprocess.h"

namespace zest::vision {

// What one forward over a batch returns, on the host, images in batch order.
struct VisionEncoding {
  Tensor embeds;                  // [sum of merged tokens, out_hidden] f32
  std::vector<Tensor> deepstack;  // one per deepstack_visual_indexes entry, same rows as embeds
  std::vector<int64_t> tokens_per_image;
  // Per image, one score per merged token: the attention its merge^2 patches receive inside their image
  // at the score layer (head-averaged softmax column sums, VisionZip). Empty when no score layer was given.
  std::vector<std::vector<float>> scores;
};

class VisionEncoder {
 public:
  virtual ~VisionEncoder() = default;
  // "cpu" or "cuda".
  virtual const char* backend_name() const = 0;
  virtual const io::VisionConfig& config() const = 0;
  // Encodes batch.pixel_values [sum of patches, in_channels * temporal_patch * patch^2] f32 for batch.grids;
  // score_layer (0-based block index < depth), when set, also scores every merged token. Safe to call from
  // several threads (a device encoder runs one call at a time).
  virtual Result<VisionEncoding> forward(const PixelBatch& batch,
                                         std::optional<int64_t> score_layer = std::nullopt) const = 0;
};

// Reads one tower tensor by its name relative to the tower prefix (e.g. "blocks.0.attn.qkv.weight") with the
// expected shape, as CPU f32.
using VisionTensorSource =
    std::function<Result<Tensor>(const std::string& name, const std::vector<int64_t>& shape)>;

// The CPU f32 encoder of the tower under `prefix` (errors as VisionTower::load).
Result<std::unique_ptr<VisionEncoder>> make_cpu_vision_encoder(const io::SafeTensors& weights,
                                                               const io::VisionConfig& cfg,
                                                               const std::string& prefix = "model.visual.");

// The CUDA bf16 encoder of the tower under `prefix` (weights uploaded to the current device); kUnsupported
// when zest was built without CUDA or no GPU is usable.
Result<std::unique_ptr<VisionEncoder>> make_cuda_vision_encoder(const io::SafeTensors& weights,
                                                                const io::VisionConfig& cfg,
                                                                const std::string& prefix = "model.visual.");

// Implemented by the CUDA backend (src/kernels/cuda/vision_encoder.cu) or its stub: builds the device
// encoder from tensors read through `source`.
Result<std::unique_ptr<VisionEncoder>> create_cuda_vision_encoder(const io::VisionConfig& cfg,
                                                                  const VisionTensorSource& source);

}  // namespace zest::vision
