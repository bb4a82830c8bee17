// Rotary position ops: the multi-axis angle table (built on the host in f64) and its application.
#include <algorithm>
#include <cmath>
#include <vector>

#include "xdit/core/threading.h"
#include "xdit/ops/dispatch.h"
#include "xdit/ops/ops.h"

namespace xdit::ops {
namespace {

// Positions as f64, row-major [S, n_axes]; integers convert exactly.
std::vector<double> positions_f64(const Tensor& positions) {
  const Tensor dense = positions.contiguous();
  const size_t n = static_cast<size_t>(dense.numel());
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (dense.dtype()) {
      case DType::I64: out[i] = static_cast<double>(dense.data<int64_t>()[i]); break;
      case DType::I32: out[i] = static_cast<double>(dense.data<int32_t>()[i]); break;
      default: out[i] = static_cast<double>(dense.data<float>()[i]); break;
    }
  }
  return out;
}

}  // namespace

// Matches diffusers' get_1d_rotary_pos_embed(..., freqs_dtype=torch.float64) per axis (before its
// repeat_interleave): angle = pos * (1 / theta^(2i / d)) and its cos/sin in f64, then rounded to
// f32. Computing the angle in f32 would be off by ~1e-4 rad at positions in the thousands.
RopeTable rope_table(const Tensor& positions, const std::vector<int64_t>& axes_dim, double theta,
                     RopeAngle angle_precision) {
  check_dtype("rope_table", "positions", positions, {DType::I64, DType::I32, DType::F32});
  XDIT_CHECK(positions.device().type == DeviceType::CPU, "rope_table: positions must be on the CPU, got ",
             device_str(positions.device()));
  XDIT_CHECK(positions.dim() == 2, "rope_table: positions must be [S, n_axes], got shape ",
             shape_str(positions.shape()));
  const int64_t seq = positions.size(0), n_axes = positions.size(1);
  XDIT_CHECK(static_cast<int64_t>(axes_dim.size()) == n_axes, "rope_table: ", axes_dim.size(),
             " axis widths given for positions of shape ", shape_str(positions.shape()));
  XDIT_CHECK(std::isfinite(theta) && theta > 0, "rope_table: theta must be finite and > 0, got ", theta);

  std::vector<double> frequencies;  // D/2 entries, axis by axis
  std::vector<int64_t> axis_of;     // the positions column each entry reads
  for (int64_t a = 0; a < n_axes; ++a) {
    const int64_t width = axes_dim[a];
    XDIT_CHECK(width > 0 && width % 2 == 0, "rope_table: axis ", a, " has width ", width,
               ", expected a positive even number");
    for (int64_t i = 0; i < width / 2; ++i) {
      frequencies.push_back(1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(width)));
      axis_of.push_back(a);
    }
  }
  const int64_t half = static_cast<int64_t>(frequencies.size());
  const std::vector<double> pos = positions_f64(positions);

  RopeTable table{Tensor::empty({seq, half}, DType::F32), Tensor::empty({seq, half}, DType::F32)};
  float* cos_out = table.cos.data<float>();
  float* sin_out = table.sin.data<float>();
  parallel_for(seq, std::max<int64_t>(1, 1024 / std::max<int64_t>(half, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      for (int64_t k = 0; k < half; ++k) {
        const double angle = pos[s * n_axes + axis_of[k]] * frequencies[k];
        if (angle_precision == RopeAngle::RoundedToF32) {
          const float rounded = static_cast<float>(angle);
          cos_out[s * half + k] = std::cos(rounded);
          sin_out[s * half + k] = std::sin(rounded);
        } else {
          cos_out[s * half + k] = static_cast<float>(std::cos(angle));
          sin_out[s * half + k] = static_cast<float>(std::sin(angle));
        }
      }
    }
  });
  return table;
}

Tensor apply_rope(const Tensor& x, const RopeTable& table, RopeStyle style) {
  check_float("apply_rope", "x", x);
  XDIT_CHECK(x.dim() == 4, "apply_rope: x must be [B, S, H, D], got shape ", shape_str(x.shape()));
  const int64_t seq = x.size(1), head_dim = x.size(3);
  XDIT_CHECK(head_dim % 2 == 0, "apply_rope: head dim must be even, x has shape ", shape_str(x.shape()));
  for (const Tensor* t : {&table.cos, &table.sin}) {
    const char* name = t == &table.cos ? "cos" : "sin";
    check_dtype("apply_rope", name, *t, {DType::F32});
    XDIT_CHECK(t->dim() == 2 && t->size(0) == seq && t->size(1) == head_dim / 2, "apply_rope: ", name,
               " has shape ", shape_str(t->shape()), ", expected [S, D/2] = [", seq, ", ", head_dim / 2,
               "] for x of shape ", shape_str(x.shape()));
  }
  return backend_of("apply_rope", {&x, &table.cos, &table.sin}).apply_rope(x, table.cos, table.sin, style);
}

}  // namespace xdit::ops
