// Built instead of src/backend/cuda when ZEST_CUDA is off.
#include "backend/cuda.h"

namespace zest::model {

Result<std::unique_ptr<TextDecoder>> create_cuda_decoder(const DecoderWeights&, const DeviceDecodeOptions&) {
  return unsupported("zest was built without CUDA (configure with -DZEST_CUDA=ON), so --device cuda is unavailable");
}

Result<std::string> cuda_ipc_export(const KvSnapshot&) {
  return unsupported("zest was built without CUDA: --kv-transfer cuda-ipc is unavailable");
}

Result<KvSnapshot> cuda_ipc_import(const std::string&, const KvSnapshot&) {
  return unsupported("zest was built without CUDA: --kv-transfer cuda-ipc is unavailable");
}

Result<std::unique_ptr<CommunicatorGroup>> create_nccl_group(const std::vector<int>&) {
  return unsupported("zest was built without CUDA: no NCCL communicators");
}

Result<std::unique_ptr<TextDecoder>> create_cuda_parallel_decoder(const DecoderWeights&, const ParallelOptions&,
                                                                  const DeviceDecodeOptions&,
                                                                  std::unique_ptr<CommunicatorGroup>) {
  return unsupported("zest was built without CUDA (configure with -DZEST_CUDA=ON), so --device cuda is unavailable");
}

}  // namespace zest::model

namespace zest::vision {

Result<std::unique_ptr<VisionEncoder>> create_cuda_vision_encoder(const io::VisionConfig&, const VisionTensorSource&) {
  return unsupported(
      "zest was built without CUDA (configure with -DZEST_CUDA=ON), so the CUDA vision tower is unavailable");
}

}  // namespace zest::vision
