// The CPU backend: oneDNN for GEMM and convolution, own kernels (OpenMP, AVX-512 through the
// compiler) for attention, norms, RoPE and elementwise work. Each op family lives in its own
// file in this folder.
#pragma once

#include "xdit/backend/backend.h"

namespace xdit {

class CpuBackend final : public Backend {
 public:
  DeviceType device_type() const override { return DeviceType::CPU; }
  std::string name() const override { return "cpu"; }

  void copy(const Tensor& src, const Tensor& dst) override;
  Tensor concat(const std::vector<Tensor>& parts, int64_t dim) override;
  Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, float value) override;

  Tensor matmul(const Tensor& a, const Tensor& b) override;
  Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& weight_scale) override;

  AttentionResult attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params) override;

  Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps) override;
  Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps) override;
  Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias, float eps) override;

  Tensor apply_rope(const Tensor& x, const Tensor& cos, const Tensor& sin, RopeStyle style) override;

  Tensor silu(const Tensor& x) override;
  Tensor gelu(const Tensor& x, GeluApproximation approximation) override;
  Tensor swiglu(const Tensor& x) override;
  Tensor softmax(const Tensor& x) override;

  Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) override;
  Tensor scale(const Tensor& x, float factor) override;
  Tensor modulate(const Tensor& x, const Tensor& shift, const Tensor& scale) override;
  Tensor gated_residual(const Tensor& x, const Tensor& y, const Tensor& gate) override;

  Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& params) override;
  Tensor causal_conv3d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& cache,
                       const CausalConv3dParams& params) override;
  Tensor upsample_nearest(const Tensor& x, const std::vector<int64_t>& factors) override;

  Tensor reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) override;
  Tensor var(const Tensor& x, const std::vector<int64_t>& dims, int64_t correction, bool keepdim) override;
};

CpuBackend& cpu_backend();

}  // namespace xdit
