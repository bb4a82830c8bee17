#include "xdit/layers/linear.h"

#include <string>

#include "xdit/core/error.h"
#include "xdit/io/safetensors.h"
#include "xdit/ops/ops.h"

namespace xdit {

void Linear::bind(WeightBinder& binder, std::string_view name, int64_t out_features, int64_t in_features,
                  bool has_bias) {
  // FP8 checkpoints carry scales this layer does not read yet; refusing them beats wrong outputs.
  const DTypeSet stored = {DType::F32, DType::BF16, DType::F16};
  const std::string base(name);
  binder.declare(base + ".weight", {out_features, in_features}, &weight, stored);
  if (has_bias) binder.declare(base + ".bias", {out_features}, &bias, stored);
}

Tensor Linear::operator()(const Tensor& x) const { return ops::linear(x, weight, bias, weight_scale); }

void Linear::quantize_fp8() {
  XDIT_CHECK(weight.defined(), "Linear::quantize_fp8: the weight is not bound");
  if (weight.dtype() == DType::F8E4M3 || weight.dtype() == DType::F8E5M2) return;
  ops::Fp8Weight q = ops::quantize_fp8_per_channel(weight);
  drop_file_pages(weight);  // the checkpoint's copy would otherwise stay resident beside the FP8 one
  weight = q.data;
  weight_scale = q.scale;
}

size_t Linear::weight_bytes() const {
  size_t bytes = weight.nbytes();
  if (bias.defined()) bytes += bias.nbytes();
  if (weight_scale.defined()) bytes += weight_scale.nbytes();
  return bytes;
}

}  // namespace xdit
