// FP8 (e4m3) helpers shared by the kernels that read block-wise FP8 weights (fp8.cu, moe_stream.cu).
#pragma once
#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace zest::cuda {

// Two e4m3 bytes (bytes b and b + 1 of w, selected by `sel`: 0x1404 for bytes 0-1, 0x3424 for bytes 2-3) as bf16x2,
// exactly: every e4m3 value (subnormals included) is a bf16 value.
__device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t w, uint32_t sel) {
  const uint32_t y = __byte_perm(w, 0u, sel);  // byte b at bits 15:8, byte b + 1 at bits 31:24
  // sign in place; exponent and mantissa (7 bits) at bf16 bits 10:4 (exponent field = e4m3 exponent, bias 7 not 127)
  const uint32_t r = (y & 0x80008000u) | ((y >> 4) & 0x07f007f0u);
  const uint32_t two120 = 0x7b807b80u;  // bf16 2^120, twice
  const __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&r),
                                   *reinterpret_cast<const __nv_bfloat162*>(&two120));
  return *reinterpret_cast<const uint32_t*>(&v);
}

// One 16-row x 64-column FP8 block as the bf16 A fragments of four mma.m16n8k16 k-steps, in the permutation of k the
// FP8 kernels share: lane (g, t) holds the 16 weight bytes at columns 16t .. 16t + 15 of rows g (lo) and g + 8 (hi);
// k-step j takes columns 16t + 4j .. 16t + 4j + 3 as the fragment's k pairs (2t, 2t + 1) and (2t + 8, 2t + 9).
// Converted once and used for every 8-token tile (the compiler does not merge the conversions of separate calls: they
// are inline assembly).
struct Fp8FragA {
  uint32_t r[4][4];  // [k-step j][a0 .. a3]
};
__device__ __forceinline__ Fp8FragA fp8_frag_a(const uint4& lo, const uint4& hi) {
  const uint32_t ra[4] = {lo.x, lo.y, lo.z, lo.w}, rb[4] = {hi.x, hi.y, hi.z, hi.w};
  Fp8FragA f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    f.r[j][0] = e4m3x2_bf16x2(ra[j], 0x1404);
    f.r[j][1] = e4m3x2_bf16x2(rb[j], 0x1404);
    f.r[j][2] = e4m3x2_bf16x2(ra[j], 0x3424);
    f.r[j][3] = e4m3x2_bf16x2(rb[j], 0x3424);
  }
  return f;
}

// c += the product of a block (fp8_frag_a) and one 8-token x 64-column bf16 block on tensor cores: the lane's token g
// holds the same 16 columns as its weight bytes (x: bf16 words 0-7). The sums are plain dot products.
__device__ __forceinline__ void mma_frag_k64(float (&c)[4], const Fp8FragA& f, const uint32_t (&x)[8]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) mma16816(c, f.r[j][0], f.r[j][1], f.r[j][2], f.r[j][3], x[2 * j], x[2 * j + 1]);
}

}  // namespace zest::cuda
