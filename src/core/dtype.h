// Element types and the scalar conversions between them (bf16/f16 <-> f32, round to nearest even).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace zest {

enum class DType : uint8_t { F32, BF16, F16, I32, I64, U8 };

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

// Converts n elements of `src` (dtype `t`) to f32.
void convert_to_f32(DType t, const void* src, float* dst, size_t n);

}  // namespace zest
