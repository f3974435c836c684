// Small tensor helpers for binding checkpoint weights to the CPU model.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "io/safetensors.h"

namespace zest::model {

// Transposes a 2-D f32 CPU tensor [r, c] -> [c, r] (input-major expert matrices to nn.Linear layout).
Tensor transpose_2d(const Tensor& m);

}  // namespace zest::model
