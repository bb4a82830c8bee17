// FLUX.2 position ids: the (T, H, W, L) coordinates Flux2Pipeline builds for the 4-axis RoPE.
// Text tokens are (0, 0, 0, l), the image being generated is (0, h, w, 0) row-major over the
// latent grid, and reference images (editing) are (T, h, w, 0) with T = 10, 20, ... per image.
#pragma once

#include <cstdint>
#include <vector>

#include "xdit/core/tensor.h"

namespace xdit::flux2 {

// The patchified latent grid of one image: tokens = height * width.
struct LatentGrid {
  int64_t height = 0;
  int64_t width = 0;
};

// Flux2Pipeline._prepare_text_ids: [batch, length, 4] I64, row l = (0, 0, 0, l).
Tensor prepare_text_ids(int64_t batch, int64_t length);

// Flux2Pipeline._prepare_latent_ids: [batch, height * width, 4] I64, row h * width + w = (0, h, w, 0).
Tensor prepare_latent_ids(int64_t batch, LatentGrid grid);

// Flux2Pipeline._prepare_image_ids: the reference images' ids, image i at time offset
// scale * (i + 1), concatenated in order: [1, sum of height * width, 4] I64.
Tensor prepare_image_ids(const std::vector<LatentGrid>& images, int64_t scale = 10);

}  // namespace xdit::flux2
