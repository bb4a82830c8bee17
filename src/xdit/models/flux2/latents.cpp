#include "xdit/models/flux2/latents.h"

#include <cmath>
#include <string>
#include <vector>

#include "xdit/core/error.h"
#include "xdit/ops/ops.h"

namespace xdit::flux2 {

namespace {

std::string describe(const Tensor& t) { return t.defined() ? shape_str(t.shape()) : std::string("undefined"); }

void check_nchw(const char* op, const Tensor& x) {
  XDIT_CHECK(x.defined() && x.dim() == 4, "flux2 ", op, ": expected latents [B, C, H, W], got ", describe(x));
}

// The BatchNorm statistics as [1, channels, 1, 1] tensors of x's dtype: the mean, and
// sqrt(var + eps) computed in f32 as the pipelines do before casting to the latents' dtype.
struct BatchNormScale {
  Tensor mean;
  Tensor std;
};

BatchNormScale batch_norm_scale(const char* op, const Tensor& x, const Tensor& running_mean, const Tensor& running_var,
                                double eps) {
  check_nchw(op, x);
  const int64_t channels = x.size(1);
  for (const Tensor* stat : {&running_mean, &running_var}) {
    XDIT_CHECK(stat->defined() && stat->dim() == 1 && stat->size(0) == channels, "flux2 ", op, ": BatchNorm ",
               stat == &running_mean ? "running_mean" : "running_var", " must be [", channels, "] for latents ",
               shape_str(x.shape()), ", got ", describe(*stat));
  }
  XDIT_CHECK(std::isfinite(eps) && eps >= 0, "flux2 ", op, ": batch_norm_eps must be finite and >= 0, got ", eps);
  std::vector<float> std_values = running_var.to_floats();
  for (float& v : std_values) {
    XDIT_CHECK(v >= 0, "flux2 ", op, ": BatchNorm running_var has a negative entry ", v);
    v = std::sqrt(v + static_cast<float>(eps));
  }
  const Shape shape{1, channels, 1, 1};
  return {running_mean.reshape(shape).to(x.dtype()), Tensor::from_floats(std_values, shape, x.dtype())};
}

}  // namespace

Tensor patchify_latents(const Tensor& latents) {
  check_nchw("patchify_latents", latents);
  const int64_t batch = latents.size(0), channels = latents.size(1), height = latents.size(2), width = latents.size(3);
  XDIT_CHECK(height % 2 == 0 && width % 2 == 0, "flux2 patchify_latents: height and width must be even, got ",
             shape_str(latents.shape()));
  const Tensor patches = latents.reshape({batch, channels, height / 2, 2, width / 2, 2});
  return ops::permute_copy(patches, {0, 1, 3, 5, 2, 4}).view({batch, channels * 4, height / 2, width / 2});
}

Tensor unpatchify_latents(const Tensor& latents) {
  check_nchw("unpatchify_latents", latents);
  const int64_t batch = latents.size(0), channels = latents.size(1), height = latents.size(2), width = latents.size(3);
  XDIT_CHECK(channels % 4 == 0, "flux2 unpatchify_latents: channels must be a multiple of 4 (2x2 patches), got ",
             shape_str(latents.shape()));
  const Tensor patches = latents.reshape({batch, channels / 4, 2, 2, height, width});
  return ops::permute_copy(patches, {0, 1, 4, 2, 5, 3}).view({batch, channels / 4, height * 2, width * 2});
}

Tensor pack_latents(const Tensor& latents) {
  check_nchw("pack_latents", latents);
  const int64_t batch = latents.size(0), channels = latents.size(1);
  return ops::permute_copy(latents.reshape({batch, channels, latents.size(2) * latents.size(3)}), {0, 2, 1});
}

Tensor unpack_latents_with_ids(const Tensor& tokens, const Tensor& ids, int64_t height, int64_t width) {
  XDIT_CHECK(tokens.defined() && tokens.dim() == 3, "flux2 unpack_latents_with_ids: expected tokens [B, S, C], got ",
             describe(tokens));
  const int64_t batch = tokens.size(0), seq = tokens.size(1), channels = tokens.size(2);
  XDIT_CHECK(ids.defined() && ids.dim() == 3 && ids.size(0) == batch && ids.size(1) == seq && ids.size(2) == 4,
             "flux2 unpack_latents_with_ids: expected ids [", batch, ", ", seq, ", 4] for tokens ",
             shape_str(tokens.shape()), ", got ", describe(ids));
  XDIT_CHECK(ids.dtype() == DType::I64 || ids.dtype() == DType::I32,
             "flux2 unpack_latents_with_ids: ids must be i64 or i32, got ", dtype_name(ids.dtype()));
  XDIT_CHECK(height > 0 && width > 0, "flux2 unpack_latents_with_ids: grid must be positive, got ", height, " x ",
             width);
  const Tensor positions = ids.to(DType::I64).contiguous();
  const int64_t* id = positions.data<int64_t>();
  Tensor grid = Tensor::zeros({batch, height * width, channels}, tokens.dtype(), tokens.device());
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) {
      const int64_t* pos = id + (b * seq + s) * 4;
      XDIT_CHECK(pos[1] >= 0 && pos[1] < height && pos[2] >= 0 && pos[2] < width,
                 "flux2 unpack_latents_with_ids: token ", s, " of batch ", b, " has position (h ", pos[1], ", w ",
                 pos[2], ") outside the ", height, " x ", width, " grid");
      grid.select(0, b).select(0, pos[1] * width + pos[2]).copy_from(tokens.select(0, b).select(0, s));
    }
  }
  return ops::permute_copy(grid.view({batch, height, width, channels}), {0, 3, 1, 2});
}

Tensor batch_norm_normalize(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, double eps) {
  const BatchNormScale bn = batch_norm_scale("batch_norm_normalize", x, running_mean, running_var, eps);
  return ops::div(ops::sub(x, bn.mean), bn.std);
}

Tensor batch_norm_denormalize(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, double eps) {
  const BatchNormScale bn = batch_norm_scale("batch_norm_denormalize", x, running_mean, running_var, eps);
  return ops::add(ops::mul(x, bn.std), bn.mean);
}

}  // namespace xdit::flux2
