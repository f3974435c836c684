// Built instead of the CUDA library when ZEST_CUDA is off.
#include "kernels/backend.h"
#include "kernels/sere_calibration.h"
#include "model/decoder.h"
#include "vision/encoder.h"

namespace zest::kernels {

bool cuda_available() { return false; }
Status cuda_init(int) { return unsupported("zest was built without CUDA (configure with -DZEST_CUDA=ON)"); }
std::string cuda_describe() { return "CUDA backend not built"; }

Result<std::unique_ptr<ExpertGram>> make_cuda_expert_gram(int64_t, int64_t, int64_t, int64_t) {
  return unsupported("zest was built without CUDA (configure with -DZEST_CUDA=ON), so SERE calibration runs on the CPU");
}

}  // namespace zest::kernels

namespace zest::model {

Result<std::unique_ptr<TextDecoder>> create_cuda_decoder(const DecoderWeights&) {
  return unsupported("zest was built without CUDA (configure with -DZEST_CUDA=ON), so --device cuda is unavailable");
}

}  // namespace zest::model

namespace zest::vision {

Result<std::unique_ptr<VisionEncoder>> create_cuda_vision_encoder(const io::VisionConfig&, const VisionTensorSource&) {
  return unsupported(
      "zest was built without CUDA (configure with -DZEST_CUDA=ON), so the CUDA vision tower is unavailable");
}

}  // namespace zest::vision
