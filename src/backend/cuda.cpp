// The checkpoint-reading halves of the CUDA factories (backend/cuda.h), the same with and without CUDA.
#include "backend/cuda.h"

namespace zest::model {

namespace {

// The first FP8 tensor among the decoder weights, or nullptr.
const io::TensorView* first_fp8(const DecoderWeights& w) {
  std::vector<const io::TensorView*> all = {&w.embed, &w.final_norm, &w.lm_head};
  for (const DecoderLayerWeights& L : w.layers) {
    for (const io::TensorView* t : {&L.q, &L.k, &L.v, &L.o, &L.router, &L.fused_gate_up, &L.fused_down}) all.push_back(t);
    for (const auto* list : {&L.gate, &L.up, &L.down})
      for (const io::TensorView& t : *list) all.push_back(&t);
  }
  for (const io::TensorView* t : all)
    if (t->data != nullptr && t->dtype == DType::F8E4M3) return t;
  return nullptr;
}

}  // namespace

Result<std::unique_ptr<TextDecoder>> make_cuda_decoder(const io::SafeTensors& st, const io::ModelConfig& cfg,
                                                       const DeviceDecodeOptions& opts) {
  ZEST_ASSIGN_OR_RETURN(DecoderWeights w, collect_decoder_weights(st, cfg));
  if (const io::TensorView* t = first_fp8(w)) {
    return unsupported("this is a block-wise FP8 checkpoint (quantization_config quant_method \"fp8\"; tensor '" +
                       t->name + "' is F8_E4M3) and the CUDA backend has no FP8 kernels yet; run it on the CPU " +
                       "backend (--device cpu), which dequantizes the weights to f32");
  }
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
