// The backend-neutral vision encoder: the Qwen3-VL vision tower over a batch of preprocessed images,
// returning host f32 embeddings, DeepStack features and (when asked) the VisionZip score of every LLM
// token. Implemented by the CPU f32 tower (vision::VisionTower, scores with the accel functions) and by
// the CUDA bf16 tower (src/backend/cuda/vision_encoder.cu, scores with the device score kernel).
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

// Outputs of one forward kept in device memory (device encoders): bf16 tensors on the encoder's device,
// images in batch order; valid after the call returns (the encoder has synchronised).
struct DeviceEncoding {
  Tensor embeds;                  // [sum of merged tokens, out_hidden] bf16
  std::vector<Tensor> deepstack;  // same rows as embeds
  Tensor scores;                  // [sum of merged tokens] f32 VisionZip scores; undefined without a score layer
  std::vector<int64_t> tokens_per_image;
};

// One image's device rows for select_device (views, e.g. rows of a DeviceEncoding or cached entries).
struct DeviceImageRows {
  Tensor embeds;                  // [M, out_hidden] bf16
  std::vector<Tensor> deepstack;  // each [M, out_hidden] bf16
  Tensor scores;                  // [M] f32 (needed only when pruning)
};

// The kept rows of a request's images, concatenated in image order, in device memory.
struct DeviceSelection {
  std::vector<std::vector<int64_t>> kept;  // per image: kept merged-token indices, ascending
  Tensor embeds;                           // [sum kept, out_hidden] bf16
  std::vector<Tensor> deepstack;           // each [sum kept, out_hidden] bf16
};

// What select_device keeps: VisionZip's uniform or global budget on the scores (accel::select_vision_tokens
// without density weighting or contextual tokens); rate 0 and budget -1 keep every token.
struct DeviceSelectOptions {
  float rate = 0.f;
  bool global = false;
  int64_t budget = -1;
  int64_t min_tokens = 16;
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

  // Device encoders: whether the device-resident calls below are available.
  virtual bool device_resident() const { return false; }
  // As forward, but the outputs stay in device memory (no device-to-host copy).
  virtual Result<DeviceEncoding> forward_device(const PixelBatch& batch,
                                                std::optional<int64_t> score_layer = std::nullopt) const {
    (void)batch;
    (void)score_layer;
    return unsupported(std::string("the ") + backend_name() + " vision encoder keeps no outputs on a device");
  }
  // Scores -> selection -> gathers of the embeddings and every DeepStack feature with one index list, on the
  // device; the one device-to-host copy is the kept counts and indices.
  virtual Result<DeviceSelection> select_device(const std::vector<DeviceImageRows>& images,
                                                const DeviceSelectOptions& opt) const {
    (void)images;
    (void)opt;
    return unsupported(std::string("the ") + backend_name() + " vision encoder has no device selection");
  }
  // A device bf16 or f32 tensor as a host f32 tensor (device encoders).
  virtual Result<Tensor> to_host(const Tensor& device_rows) const {
    (void)device_rows;
    return unsupported(std::string("the ") + backend_name() + " vision encoder has no device tensors");
  }
};

// Reads one tower tensor by its name relative to the tower prefix (e.g. "blocks.0.attn.qkv.weight") with the
// expected shape, as CPU f32.
using VisionTensorSource =
    std::function<Result<Tensor>(const std::string& name, const std::vector<int64_t>& shape)>;

// The CPU f32 encoder of the tower under `prefix` (errors as VisionTower::load).
Result<std::unique_ptr<VisionEncoder>> make_cpu_vision_encoder(const io::SafeTensors& weights,
                                                               const io::VisionConfig& cfg,
                                                               const std::string& prefix = "model.visual.");

// The CUDA bf16 encoder: vision::make_cuda_vision_encoder (src/backend/cuda.h).

}  // namespace zest::vision
