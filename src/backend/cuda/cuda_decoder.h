// What the CUDA text decoder (cuda_decoder.cu, model::TextDecoder on the zest CUDA kernels) tells tests about
// itself. Defined only when zest is built with CUDA.
#pragma once
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/decoder.h"
#include "model/kv_cache.h"

namespace zest::cuda {

// Changes how a CUDA text decoder runs its next decode steps (tests compare graph replays with eager steps on one
// decoder); kInvalidArgument for another decoder or a cap below 1.
Status set_decode_options(const model::TextDecoder& dec, const model::DeviceDecodeOptions& opts);
// CUDA graph launches of decode steps by the CUDA text decoder in this process (model::DeviceDecodeOptions::graphs),
// for tests that check a replay happened.
int64_t decode_graph_launches();
// CUDA graphs of decode steps captured (and instantiated) by the CUDA text decoder in this process.
int64_t decode_graph_captures();
// The whole device KV cache of a CUDA text decoder, bf16 bits: per layer K then V, each [blocks, 16, kv_heads,
// head_dim] (for tests).
Status decode_kv_cache_copy(const model::PagedKVCache& cache, std::vector<uint16_t>* out);

}  // namespace zest::cuda
