// Element types and their conversions. Every narrowing conversion rounds to nearest even;
// FP8 conversions saturate finite overflow and infinities to the largest finite value
// (the semantics of CUDA's __NV_SATFINITE), and keep NaN.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace xdit {

enum class DType : uint8_t { F32, BF16, F16, F8E4M3, F8E5M2, I32, I64 };

size_t dtype_size(DType dtype);
std::string_view dtype_name(DType dtype);          // "f32", "bf16", ...
DType dtype_from_name(std::string_view name);      // accepts our names; throws naming the input
bool is_floating(DType dtype);

// Bit-level scalar conversions.
inline float bits_to_f32(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

inline float bf16_to_f32(uint16_t h) { return bits_to_f32(static_cast<uint32_t>(h) << 16); }
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float f8e4m3_to_f32(uint8_t v);
uint8_t f32_to_f8e4m3(float f);
float f8e5m2_to_f32(uint8_t v);
uint8_t f32_to_f8e5m2(float f);

inline constexpr float kF8E4M3Max = 448.0f;
inline constexpr float kF8E5M2Max = 57344.0f;

// Converts n contiguous elements. Integer <-> float conversions truncate toward zero like C++.
void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n);

// Element i of a buffer, read as float / written from float (any floating or integer dtype).
float load_as_f32(const void* base, DType dtype, size_t i);
void store_from_f32(void* base, DType dtype, size_t i, float value);

// `value` rounded to a floating dtype and back, as a tensor of that dtype would hold it.
float round_to_dtype(float value, DType dtype);

// Tag types so templates can name the 16- and 8-bit storage types.
struct bf16_t { uint16_t bits; };
struct f16_t { uint16_t bits; };

}  // namespace xdit
