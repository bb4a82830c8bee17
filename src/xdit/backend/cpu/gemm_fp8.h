// FP8 (e4m3 / e5m2) weights on the CPU: per-output-channel quantization, fast dequantization,
// and the linear layer that dequantizes its weight block by block inside the GEMM.
#pragma once

#include <cstdint>

#include "xdit/core/tensor.h"

namespace xdit::cpu {

// dst[i] = fp8 value of src[i] × scale, exactly rounded to f32 / to bf16 (round to nearest even,
// bit-identical to xdit::f32_to_bf16). fp8 is F8E4M3 or F8E5M2; NaN codes give NaN.
void dequantize_fp8(const uint8_t* src, DType fp8, float scale, float* dst, int64_t n);
void dequantize_fp8(const uint8_t* src, DType fp8, float scale, uint16_t* dst_bf16, int64_t n);

// dst[i] = the fp8 encoding of src[i] / scale (saturating, round to nearest even), bit-identical
// to xdit::f32_to_f8e4m3 / f32_to_f8e5m2 of the f32 quotient.
void quantize_fp8(const float* src, float scale, DType fp8, uint8_t* dst, int64_t n);

// Quantizes each row of weight [N, K] (F32, BF16 or F16, any strides) into data [N, K] (fp8,
// contiguous) with scale[n] = max|W[n, :]| / fp8 max (1 for an all-zero row) in scale [N] F32.
// Throws when a row holds a non-finite value.
void quantize_fp8_rows(const Tensor& weight, const Tensor& data, const Tensor& scale);

// out[..., N] = x[..., K] · (fp8 weight[N, K] × scale[N])^T (+ bias[N]), x F32 or BF16. The
// weight is converted a block of rows at a time into a panel of x's dtype that stays in cache,
// each block's GEMM writes its own output columns, and the whole dequantized weight never exists.
void fp8_linear(const Tensor& x, const Tensor& weight, const Tensor& scale, const Tensor& bias, const Tensor& out);

}  // namespace xdit::cpu
