#include "vision/encoder.h"

#include <cmath>

#include "accel/visionzip.h"
#include "vision/tower.h"

namespace zest::vision {
namespace {

std::span<const float> span_of(const Tensor& t) { return {t.data<float>(), static_cast<size_t>(t.numel())}; }

// The f32 CPU tower; scores from its attention capture with accel::attention_received_scores.
class CpuVisionEncoder final : public VisionEncoder {
 public:
  explicit CpuVisionEncoder(VisionTower tower) : tower_(std::move(tower)) {}
  const char* backend_name() const override { return "cpu"; }
  const io::VisionConfig& config() const override { return tower_.config(); }

  Result<VisionEncoding> forward(const PixelBatch& batch, std::optional<int64_t> score_layer) const override {
    ZEST_ASSIGN_OR_RETURN(VisionOutput out, tower_.forward(batch.pixel_values, batch.grids, score_layer));
    VisionEncoding enc;
    enc.embeds = std::move(out.embeds);
    enc.deepstack = std::move(out.deepstack);
    enc.tokens_per_image = std::move(out.tokens_per_image);
    if (!score_layer) return enc;
    const AttentionCapture& cap = *out.attention;
    const int64_t heads = tower_.config().num_heads, hd = tower_.head_dim();
    const int64_t merge = tower_.config().spatial_merge_size;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (size_t i = 0; i < cap.q.size(); ++i) {
      const accel::AttentionShape shape{cap.q[i].dim(0), heads, hd};
      ZEST_ASSIGN_OR_RETURN(std::vector<float> a, accel::attention_received_scores(span_of(cap.q[i]), span_of(cap.k[i]),
                                                                                   span_of(cap.lse[i]), shape, scale));
      ZEST_ASSIGN_OR_RETURN(std::vector<float> s, accel::merge_group_scores(a, merge * merge));
      enc.scores.push_back(std::move(s));
    }
    return enc;
  }

 private:
  VisionTower tower_;
};

}  // namespace

Result<std::unique_ptr<VisionEncoder>> make_cpu_vision_encoder(const io::SafeTensors& weights,
                                                               const io::VisionConfig& cfg, const std::string& prefix) {
  ZEST_ASSIGN_OR_RETURN(VisionTower tower, VisionTower::load(weights, cfg, prefix));
  return std::unique_ptr<VisionEncoder>(std::make_unique<CpuVisionEncoder>(std::move(tower)));
}

}  // namespace zest::vision
