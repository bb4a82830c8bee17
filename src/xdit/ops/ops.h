// The op vocabulary model code calls. Each function validates its arguments (shapes, dtypes,
// devices) with errors that name the op and the shapes at fault, then dispatches to the backend
// of the inputs' device. Floating inputs may be F32 or BF16 (F16 where noted); results keep the
// dtype of the main input unless stated.
#pragma once

#include <cstdint>
#include <vector>

#include "xdit/backend/backend.h"
#include "xdit/core/tensor.h"

namespace xdit::ops {

// ---- Shape ops (shape.cpp)
Tensor concat(const std::vector<Tensor>& parts, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);  // views
Tensor permute_copy(const Tensor& x, const std::vector<int64_t>& order);  // contiguous result
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, float value = 0.0f);  // torch F.pad order
Tensor upsample_nearest(const Tensor& x, const std::vector<int64_t>& factors);

// ---- Linear algebra (linear.cpp)
Tensor matmul(const Tensor& a, const Tensor& b);  // batched with broadcast; bmm is the 3-D case
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, const Tensor& weight_scale = {});

// Per-output-channel FP8 quantization of a [N, K] weight: scale[n] = max|W[n,:]| / fp8 max.
struct Fp8Weight {
  Tensor data;   // [N, K] F8E4M3 (or F8E5M2)
  Tensor scale;  // [N] F32
};
Fp8Weight quantize_fp8_per_channel(const Tensor& weight, DType fp8_dtype = DType::F8E4M3);

// ---- Attention (attention.cpp)
AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params = {});

// ---- Norms (norm.cpp)
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps);
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps);
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias, float eps);

// ---- Positions (rope.cpp)
struct RopeTable {
  Tensor cos;  // [S, D/2] F32
  Tensor sin;  // [S, D/2] F32
};
// How rope_table rounds: F64 takes cos/sin of the f64 angle (FLUX.2, the text encoders);
// RoundedToF32 rounds the f64 angle to f32 first and takes cos/sin in f32, as torch.polar on an
// f32 angle table does (Z-Image, Qwen-Image).
enum class RopeAngle { F64, RoundedToF32 };
// Multi-axis RoPE angles computed in f64: positions [S, n_axes] (I64, I32 or F32), axes_dim
// the rotary width of each axis (even, summing to D). Axis a contributes axes_dim[a]/2 angles
// pos * theta^(-2i/axes_dim[a]), in axis order.
RopeTable rope_table(const Tensor& positions, const std::vector<int64_t>& axes_dim, double theta,
                     RopeAngle angle = RopeAngle::F64);
Tensor apply_rope(const Tensor& x, const RopeTable& table, RopeStyle style);

// ---- Activations (activation.cpp)
Tensor silu(const Tensor& x);
Tensor gelu(const Tensor& x, GeluApproximation approximation = GeluApproximation::Erf);
Tensor swiglu(const Tensor& x);
Tensor softmax(const Tensor& x);

// ---- Elementwise (elementwise.cpp)
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, float factor);
Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale);
Tensor gated_residual(const Tensor& x, const Tensor& y, const Tensor& gate);

// ---- Convolution (conv.cpp)
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, const Conv2dParams& params = {});
Tensor causal_conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, const Tensor& cache = {},
                     const CausalConv3dParams& params = {});

// ---- Reductions (reduce.cpp): F32 results, accumulated in f64. dims empty = all.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor l1_norm(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);  // sum of |x|

}  // namespace xdit::ops
