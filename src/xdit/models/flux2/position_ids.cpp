#include "xdit/models/flux2/position_ids.h"

#include "xdit/core/error.h"

namespace xdit::flux2 {

namespace {

void check_grid(const char* what, LatentGrid grid) {
  XDIT_CHECK(grid.height > 0 && grid.width > 0, "flux2 ", what, ": latent grid must be positive, got ", grid.height,
             " x ", grid.width);
}

// Appends the rows (t, h, w, 0) of one grid, row-major, to `ids`.
void append_grid(std::vector<int64_t>& ids, int64_t t, LatentGrid grid) {
  for (int64_t h = 0; h < grid.height; ++h) {
    for (int64_t w = 0; w < grid.width; ++w) ids.insert(ids.end(), {t, h, w, 0});
  }
}

}  // namespace

Tensor prepare_text_ids(int64_t batch, int64_t length) {
  XDIT_CHECK(batch > 0 && length > 0, "flux2 prepare_text_ids: batch and length must be positive, got ", batch, " and ",
             length);
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(batch * length * 4));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t l = 0; l < length; ++l) ids.insert(ids.end(), {0, 0, 0, l});
  }
  return Tensor::from_ints(ids, {batch, length, 4});
}

Tensor prepare_latent_ids(int64_t batch, LatentGrid grid) {
  XDIT_CHECK(batch > 0, "flux2 prepare_latent_ids: batch must be positive, got ", batch);
  check_grid("prepare_latent_ids", grid);
  std::vector<int64_t> ids;
  ids.reserve(static_cast<size_t>(batch * grid.height * grid.width * 4));
  for (int64_t b = 0; b < batch; ++b) append_grid(ids, 0, grid);
  return Tensor::from_ints(ids, {batch, grid.height * grid.width, 4});
}

Tensor prepare_image_ids(const std::vector<LatentGrid>& images, int64_t scale) {
  XDIT_CHECK(!images.empty(), "flux2 prepare_image_ids: no reference images");
  XDIT_CHECK(scale > 0, "flux2 prepare_image_ids: scale must be positive, got ", scale);
  std::vector<int64_t> ids;
  for (size_t i = 0; i < images.size(); ++i) {
    check_grid("prepare_image_ids", images[i]);
    append_grid(ids, scale * static_cast<int64_t>(i + 1), images[i]);
  }
  const int64_t tokens = static_cast<int64_t>(ids.size()) / 4;
  return Tensor::from_ints(ids, {1, tokens, 4});
}

}  // namespace xdit::flux2
