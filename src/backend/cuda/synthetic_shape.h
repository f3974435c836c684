// The synthetic decoder's shapes (kernels/cuda/synthetic_decoder.h) from the one table of named model shapes
// (model::named_model_config), so that the kernel benchmarks and `zest serve --config NAME` run the same shapes.
// Defined only when zest is built with CUDA.
#pragma once
#include <string>

#include "core/status.h"
#include "io/config.h"
#include "kernels/cuda/synthetic_decoder.h"

namespace zest::cuda {

// The shape of a text config (num_experts 0: a dense SwiGLU MLP).
SyntheticConfig synthetic_config_of(const std::string& name, const io::TextConfig& t);
// A named shape (model::named_model_configs()); layers > 0 overrides the layer count. Unknown names -> kInvalidArgument.
Result<SyntheticConfig> synthetic_config(const std::string& name, int layers);

}  // namespace zest::cuda
