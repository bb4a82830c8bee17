// The 2D KL VAE against diffusers on every family's tiny model: vae.decode of a raw latent and
// vae.encode's posterior (AutoencoderKLFlux2 for flux2-klein/flux2-dev, AutoencoderKL for z-image
// and sd35), in F32 and BF16; the Z-Image and SD3.5 pipelines' final decode; config, weight and
// input errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "support/fixtures.h"
#include "support/reference.h"
#include "xdit/io/diffusers.h"
#include "xdit/models/vae/autoencoder_kl.h"
#include "xdit/ops/ops.h"

namespace xdit {
namespace {

using testing::ReferenceFile;
using vae::AutoencoderKL;
using vae::AutoencoderKLConfig;

constexpr double kF32MaxAbs = 1e-4;  // relative to max |expected|
// BF16 relative L2 against the F32 reference. Measured: up to 1.2e-2 (decode) and 1.3e-2 (logvar),
// the same as diffusers' own bf16 VAE on these models (7.5e-3 to 1.28e-2); a wrong weight or a
// skipped block is off by far more than 2e-2.
constexpr double kBf16RelL2 = 2e-2;

const std::vector<std::string> kFamilies = {"flux2-klein", "flux2-dev", "z-image", "sd35"};

struct Family {
  std::string name;
  ReferenceFile reference;
  DiffusersRepo repo;

  explicit Family(const std::string& family)
      : name(family),
        reference(ReferenceFile::load(family)),
        repo(DiffusersRepo::open(testing::fixture_model_dir(family).string())) {}

  JsonConfig config() const { return repo.component_config("vae"); }
  AutoencoderKL load(DType dtype) const { return AutoencoderKL::load(*repo.component_weights("vae"), config(), dtype); }
};

void expect_f32_parity(const std::string& what, const Tensor& actual, const Tensor& expected) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  ASSERT_EQ(actual.dtype(), DType::F32) << what;
  const testing::Comparison c = testing::compare(actual, expected.to_doubles());
  std::printf("[ vae f32  ] %-28s max abs %.3g (max |expected| %.3g, rel L2 %.3g)\n", what.c_str(), c.max_abs,
              c.max_expected, c.rel_l2);
  EXPECT_FALSE(c.non_finite) << what << ": " << c.describe();
  EXPECT_LE(c.max_abs, kF32MaxAbs * c.max_expected) << what << ": " << c.describe();
}

void expect_bf16_close(const std::string& what, const Tensor& actual, const Tensor& expected) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  const testing::Comparison c = testing::compare(actual, expected.to_doubles());
  std::printf("[ vae bf16 ] %-28s rel L2 %.3g (max abs %.3g)\n", what.c_str(), c.rel_l2, c.max_abs);
  EXPECT_FALSE(c.non_finite) << what << ": " << c.describe();
  EXPECT_LE(c.rel_l2, kBf16RelL2) << what << ": " << c.describe();
}

class VaeParity : public ::testing::TestWithParam<std::string> {};

TEST_P(VaeParity, DecodeMatchesDiffusersInF32) {
  const Family family(GetParam());
  const AutoencoderKL vae = family.load(DType::F32);
  const Tensor image = vae.decode(family.reference.tensor("vae.decode.latent"));
  expect_f32_parity(family.name + " decode", image, family.reference.tensor("vae.decode.image"));
}

TEST_P(VaeParity, EncodeMatchesDiffusersInF32) {
  const Family family(GetParam());
  const AutoencoderKL vae = family.load(DType::F32);
  const AutoencoderKL::Posterior posterior = vae.encode(family.reference.tensor("vae.encode.image"));
  expect_f32_parity(family.name + " encode mean", posterior.mean, family.reference.tensor("vae.encode.mean"));
  expect_f32_parity(family.name + " encode logvar", posterior.logvar, family.reference.tensor("vae.encode.logvar"));
}

TEST_P(VaeParity, Bf16StaysCloseToTheF32Reference) {
  const Family family(GetParam());
  const AutoencoderKL vae = family.load(DType::BF16);
  const Tensor image = vae.decode(family.reference.tensor("vae.decode.latent"));
  EXPECT_EQ(image.dtype(), DType::BF16);
  expect_bf16_close(family.name + " decode", image, family.reference.tensor("vae.decode.image"));
  const AutoencoderKL::Posterior posterior = vae.encode(family.reference.tensor("vae.encode.image"));
  expect_bf16_close(family.name + " encode mean", posterior.mean, family.reference.tensor("vae.encode.mean"));
  expect_bf16_close(family.name + " encode logvar", posterior.logvar, family.reference.tensor("vae.encode.logvar"));
}

// Test names cannot hold '-': "flux2-klein" becomes flux2_klein.
std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}
INSTANTIATE_TEST_SUITE_P(Families, VaeParity, ::testing::ValuesIn(kFamilies), test_name);

// ZImagePipeline and StableDiffusion3Pipeline: latents / scaling_factor + shift_factor, decode,
// then VaeImageProcessor.postprocess to [0, 1].
TEST(VaePipelineDecode, ZImageAndSd35FinalImagesMatchDiffusers) {
  for (const std::string name : {"z-image", "sd35"}) {
    SCOPED_TRACE(name);
    const Family family(name);
    const AutoencoderKL vae = family.load(DType::F32);
    const AutoencoderKLConfig& c = vae.config();
    const Tensor latents = family.reference.tensor("pipeline.step2.latents");
    const Tensor shift = Tensor::full({1}, static_cast<float>(c.shift_factor), DType::F32);
    const Tensor raw = ops::add(ops::scale(latents, static_cast<float>(1.0 / c.scaling_factor)), shift);
    expect_f32_parity(name + " pipeline image", vae::to_unit_image(vae.decode(raw)),
                      family.reference.tensor("pipeline.image"));
  }
}

TEST(VaeConfig, ReadsTheTinyConfigs) {
  const AutoencoderKLConfig klein = AutoencoderKLConfig::from_json(Family("flux2-klein").config());
  EXPECT_EQ(klein.class_name, "AutoencoderKLFlux2");
  EXPECT_TRUE(klein.has_batch_norm());
  EXPECT_EQ(klein.block_out_channels, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(klein.decoder_block_out_channels, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(klein.latent_channels, 32);
  EXPECT_EQ(klein.layers_per_block, 1);
  EXPECT_EQ(klein.norm_num_groups, 4);
  EXPECT_TRUE(klein.use_quant_conv);
  EXPECT_TRUE(klein.use_post_quant_conv);
  EXPECT_DOUBLE_EQ(klein.batch_norm_eps, 1e-4);
  EXPECT_EQ(klein.spatial_scale(), 2);
  EXPECT_EQ(klein.sample_size, 64);

  const AutoencoderKLConfig sd35 = AutoencoderKLConfig::from_json(Family("sd35").config());
  EXPECT_EQ(sd35.class_name, "AutoencoderKL");
  EXPECT_FALSE(sd35.has_batch_norm());
  EXPECT_EQ(sd35.latent_channels, 16);
  EXPECT_FALSE(sd35.use_quant_conv);
  EXPECT_FALSE(sd35.use_post_quant_conv);
  EXPECT_DOUBLE_EQ(sd35.scaling_factor, 1.5305);
  EXPECT_DOUBLE_EQ(sd35.shift_factor, 0.0609);
}

TEST(VaeConfig, FillsTheClassDefaults) {
  const AutoencoderKLConfig flux2 =
      AutoencoderKLConfig::from_json(JsonConfig::parse(R"({"_class_name": "AutoencoderKLFlux2"})", "flux2 vae"));
  EXPECT_EQ(flux2.block_out_channels, (std::vector<int64_t>{128, 256, 512, 512}));
  EXPECT_EQ(flux2.layers_per_block, 2);
  EXPECT_EQ(flux2.latent_channels, 32);
  EXPECT_EQ(flux2.norm_num_groups, 32);
  EXPECT_EQ(flux2.spatial_scale(), 8);
  EXPECT_FALSE(flux2.sample_size);  // unset: the pipeline falls back to diffusers' default size
  const AutoencoderKLConfig kl =
      AutoencoderKLConfig::from_json(JsonConfig::parse(R"({"_class_name": "AutoencoderKL"})", "kl vae"));
  EXPECT_EQ(kl.latent_channels, 4);
  EXPECT_DOUBLE_EQ(kl.scaling_factor, 0.18215);
  EXPECT_DOUBLE_EQ(kl.shift_factor, 0.0);
}

// The tiny `family` VAE config with `field` replaced by `value` (JSON text).
JsonConfig edited_config(const std::string& family, const std::string& field, const std::string& value) {
  nlohmann::json json = Family(family).config().json();
  json[field] = nlohmann::json::parse(value);
  return JsonConfig(json, "vae/config.json");
}

TEST(VaeConfig, RefusesUnsupportedOptionsNamingTheField) {
  const struct {
    std::string family, field, value, fragment;
  } cases[] = {
      {"sd35", "_class_name", R"("AutoencoderKLWan")", "AutoencoderKLWan"},
      {"sd35", "act_fn", R"("gelu")", "only \"silu\""},
      {"sd35", "up_block_types", R"(["UpDecoderBlock2D", "AttnUpDecoderBlock2D"])", "AttnUpDecoderBlock2D"},
      {"sd35", "down_block_types", R"(["DownEncoderBlock2D"])", "1 entries"},
      {"sd35", "block_out_channels", R"([16, 18])", "18 channels"},
      {"sd35", "latents_mean", R"([0.1, 0.2])", "not supported"},
      {"sd35", "scaling_factor", "0", "must not be 0"},
      {"sd35", "layers_per_block", "0", "must be > 0"},
      {"sd35", "sample_size", "0", "must be positive"},
      {"flux2-klein", "patch_size", "[1, 1]", "[2, 2]"},
      {"flux2-klein", "decoder_block_out_channels", "[16, 16, 16]", "as many levels"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.field);
    testing::expect_error([&] { AutoencoderKLConfig::from_json(edited_config(c.family, c.field, c.value)); },
                          {"vae/config.json", c.field, c.fragment});
  }
}

// The tiny model's weights as an in-memory source, with `drop` left out and `replace` swapped in.
TensorMap edited_weights(const Family& family, const std::string& drop, const std::string& replace = {},
                         const Tensor& replacement = {}) {
  const auto source = family.repo.component_weights("vae");
  TensorMap map("edited vae weights");
  for (const std::string& name : source->names()) {
    if (name == drop) continue;
    map.add(name, name == replace ? replacement : source->tensor(name));
  }
  return map;
}

TEST(VaeWeights, ReportsMissingAndMisshapenTensorsByName) {
  const Family family("flux2-klein");
  const JsonConfig config = family.config();
  testing::expect_error(
      [&] {
        AutoencoderKL::load(edited_weights(family, "decoder.mid_block.attentions.0.to_q.weight"), config, DType::F32);
      },
      {"decoder.mid_block.attentions.0.to_q.weight", "missing"});
  testing::expect_error([&] { AutoencoderKL::load(edited_weights(family, "bn.running_var"), config, DType::F32); },
                        {"bn.running_var", "missing"});
  const Tensor wrong = Tensor::zeros({16, 16, 1, 1}, DType::F32);
  testing::expect_error(
      [&] {
        AutoencoderKL::load(edited_weights(family, "", "encoder.down_blocks.0.downsamplers.0.conv.weight", wrong),
                            config, DType::F32);
      },
      {"encoder.down_blocks.0.downsamplers.0.conv.weight", "[16, 16, 3, 3]"});
  const Tensor negative = Tensor::full({128}, -1.0f, DType::F32);
  testing::expect_error(
      [&] { AutoencoderKL::load(edited_weights(family, "", "bn.running_var", negative), config, DType::F32); },
      {"bn.running_var", "negative"});
  // An AutoencoderKL config over FLUX.2 weights: bn.* and the quant convs are then unexpected.
  testing::expect_error([&] { AutoencoderKL::load(edited_weights(family, ""), Family("sd35").config(), DType::F32); },
                        {"bn.running_mean"});
}

TEST(VaeWeights, HoldsTheWeightsInTheComputeDtype) {
  const Family family("flux2-klein");
  const AutoencoderKL f32 = family.load(DType::F32);
  const AutoencoderKL bf16 = family.load(DType::BF16);
  ASSERT_TRUE(f32.batch_norm_mean().defined());
  EXPECT_EQ(bf16.batch_norm_mean().dtype(), DType::F32);
  EXPECT_EQ(bf16.batch_norm_var().shape(), (Shape{128}));
  const size_t bn_bytes = 2 * 128 * 4;
  EXPECT_EQ(f32.weight_bytes() - bn_bytes, 2 * (bf16.weight_bytes() - bn_bytes));
  EXPECT_FALSE(Family("sd35").load(DType::F32).batch_norm_mean().defined());
  testing::expect_error([&] { family.load(DType::F16); }, {"compute dtype", "f16"});
}

TEST(VaeInputs, RejectsWrongShapes) {
  const Family family("z-image");
  const AutoencoderKL vae = family.load(DType::F32);
  testing::expect_error(
      [&] {
        vae.decode(Tensor::zeros({1, 32, 6, 8}, DType::F32));
      },
      {"decode", "[B, 16, H, W]", "[1, 32, 6, 8]"});
  testing::expect_error([&] { vae.decode(Tensor::zeros({16, 6, 8}, DType::F32)); }, {"decode", "[16, 6, 8]"});
  testing::expect_error(
      [&] {
        vae.encode(Tensor::zeros({1, 4, 12, 16}, DType::F32));
      },
      {"encode", "[B, 3, H, W]", "[1, 4, 12, 16]"});
  testing::expect_error([&] { vae::to_unit_image(Tensor::zeros({3, 12, 16}, DType::F32)); }, {"to_unit_image"});
}

// Upsample2D runs as a 2x2 phase conv plus an interleave: it must equal nearest x2 then the 3x3
// conv on any shape, borders included.
TEST(VaeUpsample, PhaseConvEqualsNearestUpsampleThenConv) {
  vae::Upsample2D up;
  up.conv.weight = testing::random_tensor({6, 6, 3, 3}, DType::F32, 1);
  up.conv.bias = testing::random_tensor({6}, DType::F32, 2);
  up.conv.padding = 1;
  up.fold_weights();
  EXPECT_EQ(up.phase_conv.weight.shape(), (Shape{24, 6, 2, 2}));
  const Tensor x = testing::random_tensor({2, 6, 5, 7}, DType::F32, 3);
  const Tensor expected = up.conv(ops::upsample_nearest(x, {2, 2}));
  const Tensor actual = up.forward(x);
  ASSERT_EQ(actual.shape(), (Shape{2, 6, 10, 14}));
  const testing::Comparison c = testing::compare(actual, expected.to_doubles());
  EXPECT_LE(c.max_abs, 1e-5 * c.max_expected) << c.describe();
}

TEST(VaeImage, ToUnitImageRescalesClampsAndMovesChannelsLast) {
  const std::vector<float> values = {-3.0f, -1.0f, 0.0f, 0.5f, 1.0f, 2.0f};
  const Tensor decoded = Tensor::from_floats(values, {1, 3, 1, 2});  // channel c holds values[2c], values[2c+1]
  const Tensor image = vae::to_unit_image(decoded);
  ASSERT_EQ(image.shape(), (Shape{1, 1, 2, 3}));
  EXPECT_EQ(testing::values(image), (std::vector<double>{0.0, 0.5, 1.0, 0.0, 0.75, 1.0}));
}

}  // namespace
}  // namespace xdit
