// Binding checkpoint tensors to model parameters by name, with shape checks, as f32 CPU tensors.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/safetensors.h"

namespace zest::model {

// Loads `name` as an f32 CPU tensor after checking its shape (kNotFound / kCorrupt with the name).
Result<Tensor> load_f32(const io::SafeTensors& st, const std::string& name, const std::vector<int64_t>& shape);

// Transposes a 2-D f32 CPU tensor [r, c] -> [c, r] (input-major expert matrices to nn.Linear layout).
Tensor transpose_2d(const Tensor& m);

}  // namespace zest::model
