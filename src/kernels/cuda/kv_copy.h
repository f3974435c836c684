// Rows of a paged bf16 KV cache to and from a token-ordered buffer (prefill/decode disaggregation copies a prompt's
// K/V out of one cache and into another).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "core/status.h"

namespace zest::cuda {

// The cache holds, per layer, its K rows then its V rows: cache + (2 * layer + v) * per_layer elements start
// [num_blocks * block_size][row] (row = kv heads * head size elements); token t of a sequence sits in block
// table[t / block_size] (table in device memory), slot t % block_size. The buffer holds [layers][2][tokens][row].
// to_buffer: cache -> buffer (gather), else buffer -> cache (scatter). Runs on `stream`; kInvalidArgument for
// non-positive sizes.
Status kv_copy_rows(uint16_t* cache, int64_t per_layer, int64_t layers, const int32_t* table, int64_t tokens,
                    int64_t block_size, int64_t row, uint16_t* buffer, bool to_buffer, cudaStream_t stream);

}  // namespace zest::cuda
