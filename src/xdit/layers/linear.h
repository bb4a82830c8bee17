// Linear: the one place that knows how a projection's weight is stored (as loaded, or FP8 e4m3
// with per-output-channel scales). Model code declares and calls it by its diffusers name.
#pragma once

#include <cstdint>
#include <string_view>

#include "xdit/core/tensor.h"
#include "xdit/io/weights.h"

namespace xdit {

struct Linear {
  Tensor weight;        // [out, in]: the run dtype, or F8E4M3 after quantize_fp8()
  Tensor bias;          // [out], undefined when the layer has none
  Tensor weight_scale;  // [out] F32 per-channel scales while the weight is FP8, else undefined

  // Declares `<name>.weight` [out, in] and, when `has_bias`, `<name>.bias` [out].
  void bind(WeightBinder& binder, std::string_view name, int64_t out_features, int64_t in_features,
            bool has_bias);

  // y = x W^T + b over the last dimension of x.
  Tensor operator()(const Tensor& x) const;

  // Replaces the weight by FP8 e4m3 with per-output-channel scales (after the binder's finish()).
  void quantize_fp8();

  int64_t in_features() const { return weight.size(1); }
  int64_t out_features() const { return weight.size(0); }
  size_t weight_bytes() const;  // weight, bias and scales as held now
};

}  // namespace xdit
