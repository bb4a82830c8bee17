// The op interface every device backend implements. Model code never calls a backend directly:
// it calls xdit::ops, which validates arguments once and dispatches on the tensor's device, so a
// backend may assume well-formed inputs (shapes, dtypes, devices already checked).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "xdit/core/tensor.h"

namespace xdit {

enum class GeluApproximation { Erf, Tanh };
enum class RopeStyle {
  Interleaved,  // rotates pairs (2k, 2k+1): the DiTs
  RotateHalf,   // rotates (k, k + D/2): the LLM text encoders
};
enum class BinaryOp { Add, Sub, Mul, Div };
enum class ReduceOp { Sum, Mean, AbsSum };

struct AttentionParams {
  float scale = 0.0f;       // 0 means 1/sqrt(head_dim)
  bool causal = false;      // query i sees keys j <= i + (Skv - Sq)
  Tensor key_padding_mask;  // optional [B, Skv] I32, nonzero = attend
  bool return_lse = false;
};

struct AttentionResult {
  Tensor out;  // [B, Sq, H, D], contiguous, q's dtype
  Tensor lse;  // [B, H, Sq] F32 natural-log sum-exp of the scaled scores; -inf where a row sees no key
};

struct Conv2dParams {
  std::array<int64_t, 2> stride{1, 1};
  std::array<int64_t, 2> padding{0, 0};
  std::array<int64_t, 2> dilation{1, 1};
  int64_t groups = 1;
};

struct CausalConv3dParams {
  std::array<int64_t, 3> stride{1, 1, 1};
  // Time is padded with 2*padding[0] frames at the front only (Wan's CausalConv3d), fewer when
  // cached frames from the previous chunk are given; height and width are padded symmetrically.
  std::array<int64_t, 3> padding{0, 0, 0};
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceType device_type() const = 0;
  virtual std::string name() const = 0;

  // Copies and layout. `dst` is preallocated with src's shape; both may be strided; dtypes convert.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  virtual Tensor concat(const std::vector<Tensor>& parts, int64_t dim) = 0;
  // `pads` follows torch.nn.functional.pad: (left, right) of the last dim first, then the one before.
  virtual Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, float value) = 0;

  // GEMM. matmul: [..., M, K] x [..., K, N] -> [..., M, N] with broadcast batch dims, any strides.
  virtual Tensor matmul(const Tensor& a, const Tensor& b) = 0;
  // linear: x [..., K] times weight [N, K]^T (+ bias [N]) -> [..., N] in x's dtype. An FP8 weight
  // carries weight_scale [N] F32 (real weight = fp8 value × scale of its row) and is dequantized
  // block by block inside the GEMM.
  virtual Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& weight_scale) = 0;

  // Scaled dot-product attention, blocked online softmax (never materialises Sq×Skv).
  // q [B, Sq, H, D]; k, v [B, Skv, Hkv, D] with H % Hkv == 0 (grouped-query); unit stride in D.
  virtual AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionParams& params) = 0;

  // Norms over the last dim (statistics in f32); weight/bias optional. group_norm: x [N, C, *].
  virtual Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps) = 0;
  virtual Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) = 0;
  virtual Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias,
                            float eps) = 0;

  // Rotary embedding: x [B, S, H, D]; cos, sin [S, D/2] F32, one angle per rotated pair.
  virtual Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeStyle style) = 0;

  // Activations. swiglu: [..., 2F] -> silu(x[..., :F]) * x[..., F:]. softmax over the last dim.
  virtual Tensor silu(const Tensor& x) = 0;
  virtual Tensor gelu(const Tensor& x, GeluApproximation approximation) = 0;
  virtual Tensor swiglu(const Tensor& x) = 0;
  virtual Tensor softmax(const Tensor& x) = 0;

  // Elementwise with numpy broadcasting; the result has a's (or x's) dtype, computed in f32.
  virtual Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) = 0;
  virtual Tensor scale(const Tensor& x, float factor) = 0;
  virtual Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale) = 0;  // x*(1+scale)+shift
  virtual Tensor gated_residual(const Tensor& x, const Tensor& y, const Tensor& gate) = 0;  // x + gate*y

  // Convolution and sampling. conv2d: x [N, C, H, W], weight [O, C/groups, kh, kw], bias [O].
  virtual Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& params) = 0;
  // causal_conv3d: x [N, C, T, H, W], weight [O, C, kt, kh, kw]; `cache` [N, C, Tc, H, W] optional
  // frames that precede x (they replace as much of the front time padding).
  virtual Tensor causal_conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& cache,
                               const CausalConv3dParams& params) = 0;
  // Repeats each of the trailing factors.size() dims by its factor.
  virtual Tensor upsample_nearest(const Tensor& x, const std::vector<int64_t>& factors) = 0;

  // Reductions over `dims` (empty = all), accumulated in f64, returned as F32.
  virtual Tensor reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) = 0;
  virtual Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) = 0;
};

// The backend for a device; throws NotSupported when that backend is not built in.
Backend& backend_for(Device device);
// Backends other than the CPU one register themselves at start-up.
void register_backend(DeviceType type, Backend* backend);

}  // namespace xdit
