// The checkpoint-reading halves of the CUDA factories (backend/cuda.h), the same with and without CUDA.
#include "backend/cuda.h"

namespace zest::model {

Result<std::unique_ptr<TextDecoder>> make_cuda_decoder(const io::SafeTensors& st, const io::ModelConfig& cfg,
                                                       const DeviceDecodeOptions& opts, const ParallelOptions& parallel) {
  ZEST_ASSIGN_OR_RETURN(DecoderWeights w, collect_decoder_weights(st, cfg));
  if (parallel.tensor_parallel > 1 || parallel.expert_parallel) return create_cuda_parallel_decoder(w, parallel, opts);
  return create_cuda_decoder(w, opts);
}

}  // namespace zest::model

namespace zest::vision {

Result<std::unique_ptr<VisionEncoder>> make_cuda_vision_encoder(const io::SafeTensors& weights,
                                                                const io::VisionConfig& cfg,
                                                                const std::string& prefix) {
  return create_cuda_vision_encoder(
      cfg, [&](const std::string& name, const std::vector<int64_t>& shape) -> Result<Tensor> {
        ZEST_ASSIGN_OR_RETURN(io::TensorView v, weights.get(prefix + name, shape));
        return v.to_f32();
      });
}

}  // namespace zest::vision
