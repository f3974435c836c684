// Built instead of the CUDA library when ZEST_CUDA is off.
#include "kernels/backend.h"
#include "kernels/sere_calibration.h"

namespace zest::kernels {

bool cuda_available() { return false; }
Status cuda_init(int) { return unsupported("zest was built without CUDA (configure with -DZEST_CUDA=ON)"); }
std::string cuda_describe() { return "CUDA backend not built"; }

Result<std::unique_ptr<ExpertGram>> make_cuda_expert_gram(int64_t, int64_t, int64_t, int64_t) {
  return unsupported("zest was built without CUDA (configure with -DZEST_CUDA=ON), so SERE calibration runs on the CPU");
}

}  // namespace zest::kernels
