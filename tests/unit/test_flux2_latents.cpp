// FLUX.2 latent plumbing: the pipelines' final decode (unpack by ids, BatchNorm denormalise,
// unpatchify, VAE decode, postprocess) against Flux2KleinPipeline / Flux2Pipeline images, the
// index maps of patchify and pack, their inverses, and bad shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "support/fixtures.h"
#include "support/reference.h"
#include "xdit/io/diffusers.h"
#include "xdit/models/flux2/latents.h"
#include "xdit/models/flux2/position_ids.h"
#include "xdit/models/vae/autoencoder_kl.h"

namespace xdit {
namespace {

using testing::random_tensor;
using testing::values;

double psnr_unit_range(const std::vector<double>& actual, const std::vector<double>& expected) {
  double squared = 0;
  for (size_t i = 0; i < actual.size(); ++i) squared += (actual[i] - expected[i]) * (actual[i] - expected[i]);
  const double mse = squared / static_cast<double>(actual.size());
  return mse == 0 ? INFINITY : 10.0 * std::log10(1.0 / mse);
}

TEST(Flux2Latents, FinalDecodeMatchesThePipelineImage) {
  for (const std::string family : {"flux2-klein", "flux2-dev"}) {
    SCOPED_TRACE(family);
    const testing::ReferenceFile reference = testing::ReferenceFile::load(family);
    const DiffusersRepo repo = DiffusersRepo::open(testing::fixture_model_dir(family).string());
    const vae::AutoencoderKL vae =
        vae::AutoencoderKL::load(*repo.component_weights("vae"), repo.component_config("vae"), DType::F32);

    // 32x48 pixels: the tiny VAE scales by 2, so the latent is 16x24 and the token grid 8x12.
    const Tensor tokens = reference.tensor("pipeline.step2.latents");
    ASSERT_EQ(tokens.shape(), (Shape{1, 96, 128}));
    const flux2::LatentGrid grid{8, 12};
    const Tensor ids = flux2::prepare_latent_ids(1, grid);
    const Tensor patched =
        flux2::batch_norm_denormalize(flux2::unpack_latents_with_ids(tokens, ids, 8, 12), vae.batch_norm_mean(),
                                      vae.batch_norm_var(), vae.config().batch_norm_eps);
    const Tensor latent = flux2::unpatchify_latents(patched);
    ASSERT_EQ(latent.shape(), (Shape{1, 32, 16, 24}));
    const Tensor image = vae::to_unit_image(vae.decode(latent));

    const Tensor expected = reference.tensor("pipeline.image");
    ASSERT_EQ(image.shape(), expected.shape());
    const std::vector<double> want = expected.to_doubles();
    const testing::Comparison c = testing::compare(image, want);
    const double psnr = psnr_unit_range(values(image), want);
    std::printf("[ flux2 latents ] %s image: PSNR %.1f dB, max abs %.3g (max |expected| %.3g)\n", family.c_str(), psnr,
                c.max_abs, c.max_expected);
    EXPECT_GE(psnr, 45.0);
    EXPECT_LE(c.max_abs, 1e-4 * c.max_expected) << c.describe();
  }
}

TEST(Flux2Latents, PatchifyGathersEach2x2PatchIntoFourChannels) {
  const Tensor x = random_tensor({2, 3, 4, 6}, DType::F32, 1);
  const Tensor p = flux2::patchify_latents(x);
  ASSERT_EQ(p.shape(), (Shape{2, 12, 2, 3}));
  const std::vector<double> xv = values(x), pv = values(p);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t i = 0; i < 2; ++i)
        for (int64_t j = 0; j < 2; ++j)
          for (int64_t y = 0; y < 2; ++y)
            for (int64_t w = 0; w < 3; ++w) {
              const double patched = pv[((b * 12 + 4 * c + 2 * i + j) * 2 + y) * 3 + w];
              const double pixel = xv[((b * 3 + c) * 4 + 2 * y + i) * 6 + 2 * w + j];
              ASSERT_EQ(patched, pixel) << "b " << b << " c " << c << " i " << i << " j " << j;
            }
  EXPECT_EQ(values(flux2::unpatchify_latents(p)), xv);
}

TEST(Flux2Latents, PatchifyAcceptsStridedInputAndBf16) {
  const Tensor x = random_tensor({1, 4, 6, 8}, DType::BF16, 2);
  const Tensor strided = testing::in_layout(x, testing::Layout::Transposed);
  const Tensor p = flux2::patchify_latents(strided);
  EXPECT_EQ(p.dtype(), DType::BF16);
  EXPECT_EQ(values(p), values(flux2::patchify_latents(x)));
  EXPECT_EQ(values(flux2::unpatchify_latents(p)), values(x));
}

TEST(Flux2Latents, PackOrdersTokensRowMajorAndUnpackInvertsIt) {
  const Tensor x = random_tensor({2, 5, 3, 4}, DType::F32, 3);
  const Tensor tokens = flux2::pack_latents(x);
  ASSERT_EQ(tokens.shape(), (Shape{2, 12, 5}));
  const std::vector<double> xv = values(x), tv = values(tokens);
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < 5; ++c)
      for (int64_t s = 0; s < 12; ++s) ASSERT_EQ(tv[(b * 12 + s) * 5 + c], xv[(b * 5 + c) * 12 + s]);
  const Tensor ids = flux2::prepare_latent_ids(2, {3, 4});
  EXPECT_EQ(values(flux2::unpack_latents_with_ids(tokens, ids, 3, 4)), xv);
}

TEST(Flux2Latents, UnpackPlacesTokensByTheirIdsAndZeroFillsTheRest) {
  // Two tokens in reverse order on a 2x2 grid: (h 1, w 0) then (h 0, w 1).
  const std::vector<float> token_values = {1, 2, 3, 4, 5, 6};  // [1, 2 tokens, 3 channels]
  const Tensor tokens = Tensor::from_floats(token_values, {1, 2, 3});
  const std::vector<int64_t> id_values = {0, 1, 0, 0, 0, 0, 1, 0};
  const Tensor ids = Tensor::from_ints(id_values, {1, 2, 4}, DType::I32);
  const Tensor grid = flux2::unpack_latents_with_ids(tokens, ids, 2, 2);
  ASSERT_EQ(grid.shape(), (Shape{1, 3, 2, 2}));
  // Channel c over (h, w) in row-major order: (0,0) empty, (0,1) token 1, (1,0) token 0, (1,1) empty.
  EXPECT_EQ(values(grid), (std::vector<double>{0, 4, 1, 0, 0, 5, 2, 0, 0, 6, 3, 0}));
}

TEST(Flux2Latents, BatchNormFollowsThePipelineFormulaAndInverts) {
  const Tensor x = random_tensor({2, 8, 3, 5}, DType::F32, 4, -3.0f, 3.0f);
  const Tensor mean = random_tensor({8}, DType::F32, 5);
  const Tensor var = random_tensor({8}, DType::F32, 6, 0.0f, 4.0f);
  const double eps = 1e-4;
  const Tensor denormalized = flux2::batch_norm_denormalize(x, mean, var, eps);
  const std::vector<double> xv = values(x), dv = values(denormalized);
  const std::vector<float> mv = mean.to_floats(), vv = var.to_floats();
  for (size_t i = 0; i < xv.size(); ++i) {
    const size_t c = (i / 15) % 8;
    const float std = std::sqrt(vv[c] + static_cast<float>(eps));
    const double expected = static_cast<double>(static_cast<float>(xv[i]) * std) + mv[c];
    ASSERT_NEAR(dv[i], expected, 1e-6 * (1 + std::fabs(expected))) << i;  // f32 rounding, with or without FMA
  }
  const testing::Comparison round_trip =
      testing::compare(flux2::batch_norm_normalize(denormalized, mean, var, eps), xv);
  EXPECT_LE(round_trip.max_abs, 1e-5) << round_trip.describe();
}

TEST(Flux2Latents, RejectsBadShapes) {
  const Tensor odd = Tensor::zeros({1, 4, 5, 6}, DType::F32);
  testing::expect_error([&] { flux2::patchify_latents(odd); }, {"patchify_latents", "even", "[1, 4, 5, 6]"});
  testing::expect_error(
      [&] {
        flux2::patchify_latents(Tensor::zeros({4, 6, 6}, DType::F32));
      },
      {"patchify_latents", "[4, 6, 6]"});
  testing::expect_error(
      [&] {
        flux2::unpatchify_latents(Tensor::zeros({1, 6, 2, 2}, DType::F32));
      },
      {"unpatchify_latents", "multiple of 4", "[1, 6, 2, 2]"});
  testing::expect_error([&] { flux2::pack_latents(Tensor::zeros({1, 4, 2}, DType::F32)); }, {"pack_latents"});

  const Tensor tokens = Tensor::zeros({1, 6, 8}, DType::F32);
  testing::expect_error(
      [&] {
        flux2::unpack_latents_with_ids(tokens, flux2::prepare_latent_ids(1, {2, 2}), 2, 3);
      },
      {"unpack_latents_with_ids", "[1, 6, 4]", "[1, 4, 4]"});
  testing::expect_error(
      [&] {
        flux2::unpack_latents_with_ids(tokens, flux2::prepare_latent_ids(1, {2, 3}), 2, 2);
      },
      {"token 2", "w 2", "2 x 2 grid"});
  testing::expect_error(
      [&] {
        flux2::unpack_latents_with_ids(tokens, Tensor::zeros({1, 6, 4}, DType::F32), 2, 3);
      },
      {"ids must be i64 or i32", "f32"});

  const Tensor x = Tensor::zeros({1, 8, 2, 2}, DType::F32);
  const Tensor stats = Tensor::full({8}, 1.0f, DType::F32);
  testing::expect_error([&] { flux2::batch_norm_denormalize(x, Tensor::zeros({4}, DType::F32), stats, 1e-4); },
                        {"running_mean", "[8]", "[4]"});
  testing::expect_error([&] { flux2::batch_norm_normalize(x, stats, Tensor::full({8}, -1.0f, DType::F32), 1e-4); },
                        {"running_var", "negative"});
  testing::expect_error([&] { flux2::batch_norm_normalize(x, stats, stats, -1.0); }, {"batch_norm_eps"});
}

}  // namespace
}  // namespace xdit
