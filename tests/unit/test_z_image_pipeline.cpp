// ZImagePipeline end to end against diffusers: the tiny Z-Image fixture at seed 42, 3 steps,
// 32x48, without guidance (Turbo) and with CFG 4 and cfg_normalization (base), through the C++
// API and through the xdit binary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/files.h"
#include "support/fixtures.h"
#include "support/reference.h"
#include "xdit/core/rng.h"
#include "xdit/io/png.h"
#include "xdit/models/z_image/pipeline.h"
#include "xdit/runtime/pipeline_registry.h"

namespace xdit {
namespace {

using testing::ReferenceFile;
using z_image::Pipeline;
using z_image::Settings;

struct Call {
  std::string prompt;
  Settings settings;
};

// The settings of a fixture's pipeline call (sidecar "calls.<name>") at the given dtype.
Call pipeline_call(const ReferenceFile& reference, const std::string& name, DType dtype) {
  const testing::FixtureCall call = testing::fixture_call(reference, name, dtype);
  Call c{call.prompt, {}};
  static_cast<ImageSettings&>(c.settings) = call.settings;
  c.settings.guidance_scale = call.guidance_scale;
  // diffusers' cfg_normalization=True is the factor 1.0.
  c.settings.cfg_normalization = call.json.get_bool("cfg_normalization", false) ? 1.0 : 0.0;
  return c;
}

Tensor generate(const Pipeline& pipeline, const Call& call) {
  Progress quiet(true);
  return pipeline.generate({call.prompt}, {}, call.settings, quiet).images;
}

Pipeline fixture_pipeline() { return Pipeline::open(testing::fixture_model_dir("z-image").string()); }

TEST(ZImagePipeline, TurboDefaultsAndCfgOptions) {
  const Pipeline pipeline = fixture_pipeline();
  EXPECT_EQ(pipeline.latent_multiple(), 4);  // the tiny VAE scales by 2

  RunOptions options;
  const Settings s = pipeline.settings_for(options);
  EXPECT_EQ(s.num_inference_steps, 8);
  EXPECT_DOUBLE_EQ(s.guidance_scale, 0.0);
  EXPECT_FALSE(s.cfg());
  EXPECT_EQ(s.height, 1024);
  EXPECT_EQ(s.width, 1024);
  EXPECT_EQ(s.max_sequence_length, 512);
  EXPECT_DOUBLE_EQ(s.cfg_normalization, 0.0);
  EXPECT_DOUBLE_EQ(s.cfg_truncation, 1.0);

  options.negative_prompts = {"blurry"};
  testing::expect_error<UsageError>([&] { pipeline.settings_for(options); }, {"--negative_prompt", "no CFG"});
  options.negative_prompts.clear();
  options.cfg_normalization = 1.0;
  testing::expect_error<UsageError>([&] { pipeline.settings_for(options); }, {"--cfg_normalization", "no CFG"});
  options.cfg_normalization.reset();
  options.cfg_truncation = 0.5;
  testing::expect_error<UsageError>([&] { pipeline.settings_for(options); }, {"--cfg_truncation", "no CFG"});

  options.guidance_scale = 4.0;
  options.negative_prompts = {"blurry"};
  options.cfg_normalization = 1.5;
  options.gemm_quantization = GemmQuantization::Fp8;
  options.use_fp8_text_encoder = true;
  const Settings base = pipeline.settings_for(options);
  EXPECT_TRUE(base.cfg());
  EXPECT_DOUBLE_EQ(base.cfg_normalization, 1.5);
  EXPECT_DOUBLE_EQ(base.cfg_truncation, 0.5);
  EXPECT_TRUE(base.fp8_transformer);
  EXPECT_TRUE(base.fp8_text_encoder);
}

TEST(ZImagePipeline, NoiseIsDiffusersNoise) {
  const ReferenceFile reference = ReferenceFile::load("z-image");
  const Tensor expected = reference.tensor("pipeline.noise");  // [1, 16, 16, 24] f32, unpacked
  const auto generator = make_noise_generator(NoiseSource::TorchCpu, 42);
  const Tensor noise = generator->randn({1, 16, 32 / 2, 48 / 2}, DType::F32);
  ASSERT_EQ(noise.shape(), expected.shape());
  EXPECT_EQ(testing::compare(noise, expected.to_doubles()).max_abs, 0.0);
}

TEST(ZImagePipeline, TurboImageMatchesDiffusersInF32) {
  const ReferenceFile reference = ReferenceFile::load("z-image");
  const Tensor image = generate(fixture_pipeline(), pipeline_call(reference, "pipeline", DType::F32));
  const Tensor expected = reference.tensor("pipeline.image");
  ASSERT_EQ(image.shape(), expected.shape());
  const double db = testing::psnr(image, expected);
  const testing::Comparison cmp = testing::compare(image, expected.to_doubles());
  std::printf("z-image f32 PSNR %.1f dB, max abs %.3g\n", db, cmp.max_abs);
  EXPECT_GE(db, 45.0);
  EXPECT_MATCHES_FIXTURE(image, expected);
}

// Base: CFG 4 against "" with the norm cap, as the fixture's pipeline_cfg call ran.
TEST(ZImagePipeline, CfgWithNormalizationMatchesDiffusersInF32) {
  const ReferenceFile reference = ReferenceFile::load("z-image");
  const Call call = pipeline_call(reference, "pipeline_cfg", DType::F32);
  ASSERT_TRUE(call.settings.cfg());
  ASSERT_DOUBLE_EQ(call.settings.cfg_normalization, 1.0);
  const Pipeline pipeline = fixture_pipeline();
  const Tensor image = generate(pipeline, call);
  const Tensor expected = reference.tensor("pipeline_cfg.image");
  const double db = testing::psnr(image, expected);
  const testing::Comparison cmp = testing::compare(image, expected.to_doubles());
  std::printf("z-image CFG 4 + normalization f32 PSNR %.1f dB, max abs %.3g\n", db, cmp.max_abs);
  EXPECT_GE(db, 45.0);
  EXPECT_MATCHES_FIXTURE(image, expected);
  // CFG changes the picture: the unguided image is far from it.
  EXPECT_LT(testing::psnr(reference.tensor("pipeline.image"), expected), 40.0);
  // The norm cap acts on this call: without it the picture is another one.
  Call uncapped = call;
  uncapped.settings.cfg_normalization = 0.0;
  EXPECT_LT(testing::psnr(generate(pipeline, uncapped), expected), 40.0);
}

// cfg_truncation above 1 never truncates, like the default 1.0; at 0 only the first step (whose
// (1000 - t) / 1000 is 0) runs CFG, which gives neither the guided nor the unguided image.
TEST(ZImagePipeline, CfgTruncation) {
  const ReferenceFile reference = ReferenceFile::load("z-image");
  const Pipeline pipeline = fixture_pipeline();
  Call call = pipeline_call(reference, "pipeline_cfg", DType::F32);
  const Tensor guided = generate(pipeline, call);
  call.settings.cfg_truncation = 2.0;
  EXPECT_EQ(testing::values(generate(pipeline, call)), testing::values(guided));
  call.settings.cfg_truncation = 0.0;
  const Tensor truncated = generate(pipeline, call);
  const double to_guided = testing::psnr(truncated, guided);
  const double to_unguided = testing::psnr(truncated, reference.tensor("pipeline.image"));
  std::printf("z-image cfg_truncation 0: PSNR %.1f dB to the guided image, %.1f dB to the unguided one\n", to_guided,
              to_unguided);
  EXPECT_LT(to_guided, 40.0);
  EXPECT_LT(to_unguided, 40.0);
}

TEST(ZImagePipeline, Bf16ImagesStayCloseToTheF32Reference) {
  const ReferenceFile reference = ReferenceFile::load("z-image");
  const Pipeline pipeline = fixture_pipeline();
  for (const char* name : {"pipeline", "pipeline_cfg"}) {
    SCOPED_TRACE(name);
    const Tensor image = generate(pipeline, pipeline_call(reference, name, DType::BF16));
    const double db = testing::psnr(image, reference.tensor(std::string(name) + ".image"));
    std::printf("z-image %s bf16 PSNR %.1f dB\n", name, db);
    EXPECT_GE(db, 30.0);
  }
}

// FP8 transformer and text encoder projections: the picture stays recognisably the same.
TEST(ZImagePipeline, Fp8StaysCloseToTheF32Reference) {
  const ReferenceFile reference = ReferenceFile::load("z-image");
  Call call = pipeline_call(reference, "pipeline", DType::BF16);
  call.settings.fp8_transformer = true;
  call.settings.fp8_text_encoder = true;
  const double db = testing::psnr(generate(fixture_pipeline(), call), reference.tensor("pipeline.image"));
  std::printf("z-image bf16 + fp8 PSNR %.1f dB\n", db);
  EXPECT_GE(db, 25.0);
}

TEST(ZImagePipeline, BadSettingsAreClearErrors) {
  const ReferenceFile reference = ReferenceFile::load("z-image");
  const Pipeline pipeline = fixture_pipeline();
  Call call = pipeline_call(reference, "pipeline", DType::F32);
  call.settings.width = 50;
  testing::expect_error<UsageError>([&] { generate(pipeline, call); }, {"32x50", "multiples of 4"});
  call = pipeline_call(reference, "pipeline", DType::F32);
  call.settings.num_inference_steps = 0;
  testing::expect_error([&] { generate(pipeline, call); }, {"num_inference_steps"});
  Progress quiet(true);
  call = pipeline_call(reference, "pipeline", DType::F32);
  testing::expect_error([&] { pipeline.generate({call.prompt}, {"blurry"}, call.settings, quiet); },
                        {"negative prompts need guidance_scale > 0"});
  testing::expect_error([&] { Pipeline::open(testing::fixture_model_dir("flux2-klein").string()); },
                        {"Flux2KleinPipeline", "not a Z-Image pipeline"});
}

// ---- the xdit binary ----

std::string fox_command(const std::filesystem::path& out, const std::string& extra = "") {
  return "--model " + testing::fixture_model_dir("z-image").string() +
         " --prompt 'A red fox jumps over a sleeping dog, photographed at golden hour.'" +
         " --height 32 --width 48 --num_inference_steps 3 --seed 42 --dtype f32 --output_directory " + out.string() +
         " --output_name fox " + extra;
}

// The largest difference, in 8-bit levels, between a PNG and a fixture image.
int worst_level_difference(const std::filesystem::path& png_path, const Tensor& expected_image) {
  const RgbImage png = read_png(png_path.string());
  const RgbImage expected = to_rgb8(expected_image.select(0, 0));
  EXPECT_EQ(png.pixels.size(), expected.pixels.size());
  int worst = 0;
  for (size_t i = 0; i < std::min(png.pixels.size(), expected.pixels.size()); ++i)
    worst = std::max(worst, std::abs(png.pixels[i] - expected.pixels[i]));
  return worst;
}

TEST(ZImageCli, WritesThePngsOfTheFixtureImages) {
  ASSERT_NE(find_pipeline("ZImagePipeline"), nullptr);
  const ReferenceFile reference = ReferenceFile::load("z-image");
  const auto turbo = testing::scratch_folder("z_image_cli_turbo");
  const testing::ProcessResult run = testing::run_xdit(fox_command(turbo));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, (turbo / "fox.png").string() + "\n");
  EXPECT_LE(worst_level_difference(turbo / "fox.png", reference.tensor("pipeline.image")), 1);

  PngText text;
  read_png((turbo / "fox.png").string(), &text);
  const std::map<std::string, std::string> fields(text.begin(), text.end());
  EXPECT_EQ(fields.at("prompt"), "A red fox jumps over a sleeping dog, photographed at golden hour.");
  EXPECT_EQ(fields.at("pipeline"), "Z-Image");
  EXPECT_EQ(fields.at("steps"), "3");
  EXPECT_EQ(fields.at("guidance_scale"), "0");
  EXPECT_EQ(fields.at("size"), "48x32");
  EXPECT_EQ(fields.at("dtype"), "f32");

  const auto base = testing::scratch_folder("z_image_cli_cfg");
  const testing::ProcessResult cfg =
      testing::run_xdit(fox_command(base, "--guidance_scale 4 --cfg_normalization 1 --quiet"));
  ASSERT_EQ(cfg.exit_code, 0) << cfg.err;
  EXPECT_EQ(cfg.err, "");
  EXPECT_LE(worst_level_difference(base / "fox.png", reference.tensor("pipeline_cfg.image")), 1);
}

TEST(ZImageCli, BenchmarkModeWithFp8WritesTimings) {
  const auto out = testing::scratch_folder("z_image_cli_timings");
  const testing::ProcessResult run = testing::run_xdit(
      fox_command(out, "--dtype bf16 --gemm_quantization fp8 --use_fp8_text_encoder --num_iterations 2 "
                       "--warmup_calls 1 --quiet"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json timings = nlohmann::json::parse(testing::read_text(out / "timings.json"));
  ASSERT_EQ(timings["iterations"].size(), 2u);
  for (const auto& iteration : timings["iterations"]) {
    EXPECT_EQ(iteration["step_s"].size(), 3u);
    EXPECT_GT(iteration["text_encode_s"].get<double>(), 0.0);
    EXPECT_GT(iteration["vae_decode_s"].get<double>(), 0.0);
    EXPECT_GT(iteration["peak_rss_bytes_after"]["denoise"].get<int64_t>(), 0);
  }
  PngText text;
  read_png((out / "fox.png").string(), &text);
  const std::map<std::string, std::string> fields(text.begin(), text.end());
  EXPECT_EQ(fields.at("gemm_quantization"), "fp8");
  EXPECT_EQ(fields.at("dtype"), "bf16");
}

TEST(ZImageCli, BadInputIsOneLine) {
  const auto out = testing::scratch_folder("z_image_cli_bad");
  testing::expect_one_error_line(testing::run_xdit(fox_command(out, "--height 40")), kExitUsageError, "--height 40");
  testing::expect_one_error_line(testing::run_xdit(fox_command(out, "--num_inference_steps 0")), kExitUsageError,
                                 "--num_inference_steps 0");
  testing::expect_one_error_line(testing::run_xdit(fox_command(out, "--num_frames 5")), kExitUsageError,
                                 "--num_frames: ZImagePipeline does not take this flag");
  testing::expect_one_error_line(testing::run_xdit(fox_command(out, "--text_encoder_out_layers 1")), kExitUsageError,
                                 "--text_encoder_out_layers: ZImagePipeline does not take this flag");
  testing::expect_one_error_line(testing::run_xdit(fox_command(out, "--negative_prompt blurry")), kExitUsageError,
                                 "--negative_prompt has no effect");

  const auto no_vae = testing::scratch_folder("z_image_no_vae");
  std::filesystem::copy(testing::fixture_model_dir("z-image"), no_vae, std::filesystem::copy_options::recursive);
  std::filesystem::remove_all(no_vae / "vae");
  testing::expect_one_error_line(
      testing::run_xdit("--model " + no_vae.string() + " --prompt fox --height 32 --width 48 --num_inference_steps 1" +
                        " --quiet --output_directory " + out.string()),
      kExitRuntimeError, "vae");
  EXPECT_TRUE(std::filesystem::is_empty(out));
}

}  // namespace
}  // namespace xdit
