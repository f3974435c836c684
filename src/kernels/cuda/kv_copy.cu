#include "kernels/cuda/kv_copy.h"

#include <string>

namespace zest::cuda {
namespace {

// One CTA per (token, layer and K/V); 16-byte pieces when the row allows, else 2-byte elements.
template <typename Piece>
__global__ void kv_copy_kernel(Piece* cache, int64_t per_layer, const int32_t* table, int64_t tokens, int64_t block_size,
                               int64_t row, Piece* buffer, bool to_buffer) {
  const int64_t t = blockIdx.x;
  const int64_t lv = blockIdx.y;  // 2 * layer + (V ? 1 : 0)
  const int64_t slot = static_cast<int64_t>(table[t / block_size]) * block_size + t % block_size;
  Piece* c = cache + lv * per_layer + slot * row;
  Piece* b = buffer + (lv * tokens + t) * row;
  for (int64_t i = threadIdx.x; i < row; i += blockDim.x) {
    if (to_buffer) b[i] = c[i];
    else c[i] = b[i];
  }
}

}  // namespace

Status kv_copy_rows(uint16_t* cache, int64_t per_layer, int64_t layers, const int32_t* table, int64_t tokens,
                    int64_t block_size, int64_t row, uint16_t* buffer, bool to_buffer, cudaStream_t stream) {
  if (per_layer <= 0 || layers <= 0 || tokens <= 0 || block_size <= 0 || row <= 0)
    return invalid_argument("kv_copy_rows: sizes must be positive");
  if (tokens > INT32_MAX || 2 * layers > 65535) return invalid_argument("kv_copy_rows: too many tokens or layers");
  const dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(2 * layers));
  if (row % 8 == 0 && per_layer % 8 == 0) {
    kv_copy_kernel<uint4><<<grid, 64, 0, stream>>>(reinterpret_cast<uint4*>(cache), per_layer / 8, table, tokens,
                                                   block_size, row / 8, reinterpret_cast<uint4*>(buffer), to_buffer);
  } else {
    kv_copy_kernel<uint16_t><<<grid, 128, 0, stream>>>(cache, per_layer, table, tokens, block_size, row, buffer,
                                                       to_buffer);
  }
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return internal_error(std::string("kv_copy_rows: ") + cudaGetErrorString(e));
  return Status::ok();
}

}  // namespace zest::cuda
