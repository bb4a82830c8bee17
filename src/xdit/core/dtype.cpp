#include "xdit/core/dtype.h"

#include <cmath>

#include "xdit/core/error.h"

namespace xdit {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::F8E4M3: return 1;
    case DType::F8E5M2: return 1;
    case DType::I32: return 4;
    case DType::I64: return 8;
  }
  fail("invalid dtype value ", static_cast<int>(dtype));
}

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::F8E4M3: return "f8e4m3";
    case DType::F8E5M2: return "f8e5m2";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
  }
  fail("invalid dtype value ", static_cast<int>(dtype));
}

DType dtype_from_name(std::string_view name) {
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::F8E4M3, DType::F8E5M2, DType::I32, DType::I64}) {
    if (dtype_name(d) == name) return d;
  }
  fail("unknown dtype \"", name, "\" (expected f32, bf16, f16, f8e4m3, f8e5m2, i32 or i64)");
}

bool is_floating(DType dtype) { return dtype != DType::I32 && dtype != DType::I64; }

namespace {

// A small binary float format: sign, `exp_bits` exponent bits, `man_bits` mantissa bits.
struct MiniFloat {
  int exp_bits;
  int man_bits;
  int bias;
  uint32_t max_finite;  // magnitude bits of the largest finite value
  uint32_t inf;         // magnitude bits of infinity, 0 if the format has none
  uint32_t nan;         // magnitude bits of the canonical NaN
  bool saturate;        // finite overflow and infinities clamp to max_finite
  bool ieee_specials;   // all-ones exponent is inf/NaN (false for e4m3fn: only S.1111.111 is NaN)
};

constexpr MiniFloat kF16{5, 10, 15, 0x7bff, 0x7c00, 0x7e00, false, true};
constexpr MiniFloat kE4M3{4, 3, 7, 0x7e, 0, 0x7f, true, false};
constexpr MiniFloat kE5M2{5, 2, 15, 0x7b, 0x7c, 0x7e, true, true};

uint32_t encode(const MiniFloat& fmt, float f) {
  const uint32_t u = f32_to_bits(f);
  const uint32_t sign = (u >> 31) << (fmt.exp_bits + fmt.man_bits);
  const uint32_t exp32 = (u >> 23) & 0xffu;
  const uint32_t man32 = u & 0x7fffffu;
  if (exp32 == 0xffu) {
    if (man32 != 0) return sign | fmt.nan;
    return sign | (fmt.saturate ? fmt.max_finite : fmt.inf);
  }
  // f32 subnormals are far below half the smallest subnormal of every target format.
  if (exp32 == 0) return sign;

  const int e = static_cast<int>(exp32) - 127;
  const int emin = 1 - fmt.bias;
  const uint64_t m = man32 | 0x800000u;  // 24-bit significand 1.xxx
  // Keep man_bits fraction bits for normals; fewer below emin, where the spacing is fixed.
  const int shift = 23 - fmt.man_bits + (e < emin ? emin - e : 0);
  uint64_t q = 0;
  if (shift < 40) {
    q = m >> shift;
    const uint64_t rem = m & ((uint64_t{1} << shift) - 1);
    const uint64_t half = uint64_t{1} << (shift - 1);
    if (rem > half || (rem == half && (q & 1u))) ++q;
  }
  uint64_t magnitude;
  if (e < emin) {
    magnitude = q;  // a carry into bit man_bits correctly produces the smallest normal
  } else {
    // q is in [2^man_bits, 2^(man_bits+1)]; the carry case bumps the exponent through addition.
    magnitude = (static_cast<uint64_t>(e + fmt.bias) << fmt.man_bits) + (q - (uint64_t{1} << fmt.man_bits));
  }
  if (magnitude > fmt.max_finite) return sign | (fmt.saturate ? fmt.max_finite : fmt.inf);
  return sign | static_cast<uint32_t>(magnitude);
}

float decode(const MiniFloat& fmt, uint32_t v) {
  const uint32_t exp_mask = (1u << fmt.exp_bits) - 1;
  const uint32_t man_mask = (1u << fmt.man_bits) - 1;
  const bool negative = (v >> (fmt.exp_bits + fmt.man_bits)) & 1u;
  const uint32_t exp = (v >> fmt.man_bits) & exp_mask;
  const uint32_t man = v & man_mask;
  float result;
  if (fmt.ieee_specials && exp == exp_mask) {
    result = man == 0 ? INFINITY : NAN;
  } else if (!fmt.ieee_specials && exp == exp_mask && man == man_mask) {
    result = NAN;
  } else if (exp == 0) {
    result = std::ldexp(static_cast<float>(man), 1 - fmt.bias - fmt.man_bits);
  } else {
    result = std::ldexp(static_cast<float>(man | (man_mask + 1)), static_cast<int>(exp) - fmt.bias - fmt.man_bits);
  }
  return negative ? -result : result;
}

}  // namespace

float f16_to_f32(uint16_t h) { return decode(kF16, h); }
uint16_t f32_to_f16(float f) { return static_cast<uint16_t>(encode(kF16, f)); }
float f8e4m3_to_f32(uint8_t v) { return decode(kE4M3, v); }
uint8_t f32_to_f8e4m3(float f) { return static_cast<uint8_t>(encode(kE4M3, f)); }
float f8e5m2_to_f32(uint8_t v) { return decode(kE5M2, v); }
uint8_t f32_to_f8e5m2(float f) { return static_cast<uint8_t>(encode(kE5M2, f)); }

float round_to_dtype(float value, DType dtype) {
  XDIT_CHECK(is_floating(dtype), "round_to_dtype: ", dtype_name(dtype), " is not a floating dtype");
  alignas(8) unsigned char storage[8];
  store_from_f32(storage, dtype, 0, value);
  return load_as_f32(storage, dtype, 0);
}

float load_as_f32(const void* base, DType dtype, size_t i) {
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::F8E4M3: return f8e4m3_to_f32(static_cast<const uint8_t*>(base)[i]);
    case DType::F8E5M2: return f8e5m2_to_f32(static_cast<const uint8_t*>(base)[i]);
    case DType::I32: return static_cast<float>(static_cast<const int32_t*>(base)[i]);
    case DType::I64: return static_cast<float>(static_cast<const int64_t*>(base)[i]);
  }
  fail("invalid dtype value ", static_cast<int>(dtype));
}

void store_from_f32(void* base, DType dtype, size_t i, float value) {
  switch (dtype) {
    case DType::F32: static_cast<float*>(base)[i] = value; return;
    case DType::BF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(value); return;
    case DType::F16: static_cast<uint16_t*>(base)[i] = f32_to_f16(value); return;
    case DType::F8E4M3: static_cast<uint8_t*>(base)[i] = f32_to_f8e4m3(value); return;
    case DType::F8E5M2: static_cast<uint8_t*>(base)[i] = f32_to_f8e5m2(value); return;
    case DType::I32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(value); return;
    case DType::I64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(value); return;
  }
  fail("invalid dtype value ", static_cast<int>(dtype));
}

namespace {

template <typename Src, typename Dst, typename Fn>
void convert_loop(const void* src, void* dst, size_t n, Fn fn) {
  const Src* s = static_cast<const Src*>(src);
  Dst* d = static_cast<Dst*>(dst);
#pragma omp parallel for schedule(static) if (n > (size_t{1} << 16))
  for (size_t i = 0; i < n; ++i) d[i] = fn(s[i]);
}

}  // namespace

void convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, size_t n) {
  if (n == 0) return;  // empty tensors may have null data pointers
  if (src_dtype == dst_dtype) {
    std::memcpy(dst, src, n * dtype_size(src_dtype));
    return;
  }
  // Fast paths for the conversions on hot paths; everything else goes through f32 or integers.
  if (src_dtype == DType::BF16 && dst_dtype == DType::F32) {
    convert_loop<uint16_t, float>(src, dst, n, bf16_to_f32);
    return;
  }
  if (src_dtype == DType::F32 && dst_dtype == DType::BF16) {
    convert_loop<float, uint16_t>(src, dst, n, f32_to_bf16);
    return;
  }
  if (src_dtype == DType::I64 && dst_dtype == DType::I32) {
    convert_loop<int64_t, int32_t>(src, dst, n, [](int64_t v) { return static_cast<int32_t>(v); });
    return;
  }
  if (src_dtype == DType::I32 && dst_dtype == DType::I64) {
    convert_loop<int32_t, int64_t>(src, dst, n, [](int32_t v) { return static_cast<int64_t>(v); });
    return;
  }
  if (!is_floating(src_dtype) && !is_floating(dst_dtype)) {
    fail("unreachable integer conversion ", dtype_name(src_dtype), " -> ", dtype_name(dst_dtype));
  }
#pragma omp parallel for schedule(static) if (n > (size_t{1} << 16))
  for (size_t i = 0; i < n; ++i) store_from_f32(dst, dst_dtype, i, load_as_f32(src, src_dtype, i));
}

}  // namespace xdit
