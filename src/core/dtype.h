// Element types and the scalar conversions between them (bf16/f16 <-> f32, round to nearest even;
// float8 e4m3fn <-> f32).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace zest {

// F8E4M3: float8_e4m3fn (safetensors "F8_E4M3"): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no
// infinities, S.1111.111 is NaN, largest finite value 448. Checkpoints store it with block scales
// (io::TensorView::scale); on its own it converts to the raw FP8 value.
enum class DType : uint8_t { F32, BF16, F16, I32, I64, U8, F8E4M3 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Rounds an f32 to the nearest bf16 value and back (what a bf16 tensor would hold).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
// f32 -> float8_e4m3fn, round to nearest even; magnitudes past the largest finite value (448) saturate to it (the
// format has no infinity), NaN -> 0x7f with the sign kept.
uint8_t f32_to_f8e4m3(float f);

// Exact float8_e4m3fn -> f32 (every FP8 value is an f32 value): subnormals m * 2^-9, normals
// (1 + m/8) * 2^(e-7), 0x7f / 0xff NaN (sign kept), 0x80 is -0.
inline float f8e4m3_to_f32(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exp = (v >> 3) & 0xfu, mant = v & 0x7u;
  uint32_t bits;
  if (exp == 0xfu && mant == 0x7u) {
    bits = sign | 0x7fc00000u;  // quiet NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 120u) << 23) | (mant << 20);  // rebias 7 -> 127
  } else if (mant != 0) {
    // Subnormal m * 2^-9: normalise the 3-bit mantissa into an f32 normal.
    int shift = 0;
    uint32_t m = mant;
    while ((m & 0x8u) == 0) {
      m <<= 1;
      ++shift;
    }
    bits = sign | ((121u - shift) << 23) | ((m & 0x7u) << 20);
  } else {
    bits = sign;  // +-0
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Converts n elements of `src` (dtype `t`) to f32.
void convert_to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace zest
