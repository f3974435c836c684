// Backend selection: the CUDA backend is compiled in when ZEST_CUDA is on; this asks at run time.
#pragma once
#include <string>

#include "core/status.h"

namespace zest::kernels {

// True when zest was built with CUDA and a usable GPU is present.
bool cuda_available();
// Initialises the CUDA backend on `device` (allocator hooks, streams, cuBLASLt handle).
Status cuda_init(int device = 0);
// One line describing the GPU (name, SMs, memory), or why there is none.
std::string cuda_describe();

}  // namespace zest::kernels
