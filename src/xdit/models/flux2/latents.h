// FLUX.2 latent plumbing between the transformer's token sequence and the VAE, as Flux2Pipeline
// and Flux2KleinPipeline do it:
//   decode: tokens [B, h*w, 4C] --unpack_latents_with_ids--> [B, 4C, h, w]
//           --batch_norm_denormalize--> --unpatchify_latents--> raw VAE latent [B, C, 2h, 2w]
//   encode: VAE posterior mean [B, C, 2h, 2w] --patchify_latents--> [B, 4C, h, w]
//           --batch_norm_normalize--> --pack_latents--> tokens [B, h*w, 4C]
// The BatchNorm statistics are the VAE's bn.running_mean / bn.running_var (AutoencoderKLFlux2)
// and its config's batch_norm_eps.
#pragma once

#include <cstdint>

#include "xdit/core/tensor.h"

namespace xdit::flux2 {

// _patchify_latents: [B, C, H, W] -> [B, 4C, H/2, W/2]; channel 4c + 2i + j holds pixel (i, j) of
// each 2x2 patch of channel c. H and W must be even.
Tensor patchify_latents(const Tensor& latents);
// _unpatchify_latents, the inverse: [B, 4C, h, w] -> [B, C, 2h, 2w].
Tensor unpatchify_latents(const Tensor& latents);

// _pack_latents: [B, C, H, W] -> [B, H*W, C], tokens in row-major order.
Tensor pack_latents(const Tensor& latents);
// _unpack_latents_with_ids: tokens [B, S, C] scattered to [B, C, height, width] by their position
// ids [B, S, 4] (integer, (t, h, w, l)); token s lands at (ids[s][1], ids[s][2]). Positions no
// token names stay zero. Throws naming the token whose position is outside the grid.
Tensor unpack_latents_with_ids(const Tensor& tokens, const Tensor& ids, int64_t height, int64_t width);

// (x - mean) / sqrt(var + eps) per channel of a patchified latent x [B, 4C, h, w].
Tensor batch_norm_normalize(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, double eps);
// x * sqrt(var + eps) + mean: the inverse, applied before unpatchify and decode.
Tensor batch_norm_denormalize(const Tensor& x, const Tensor& running_mean, const Tensor& running_var, double eps);

}  // namespace xdit::flux2
