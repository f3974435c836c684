// NumPy .npy files (little-endian, C order): f32 / i32 / i64 arrays; reads format 1.0 and 2.0, writes 1.0.
#pragma once
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace zest::io {

// Writes a CPU tensor (F32, I32 or I64) as .npy, byte-identical to numpy.save; other dtypes -> kInvalidArgument.
Status write_npy(const std::string& file, const Tensor& t);
// Reads an .npy with dtype <f4, <f2, <i4 or <i8 into a CPU tensor of that dtype (f2 -> F32).
// Malformed or truncated files -> kCorrupt; other dtypes or Fortran order -> kUnsupported.
Result<Tensor> read_npy(const std::string& file);

}  // namespace zest::io
