// The FLUX.2 pipelines end to end against diffusers: the tiny klein and dev fixtures at seed 42,
// 3 steps, 32x48, through the C++ API and through the xdit binary.
#include <gtest/gtest.h>

#include <cmath>
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
#include "xdit/models/flux2/latents.h"
#include "xdit/models/flux2/pipeline.h"
#include "xdit/ops/ops.h"
#include "xdit/runtime/pipeline_registry.h"

namespace xdit {
namespace {

using flux2::Pipeline;
using flux2::Settings;
using testing::ReferenceFile;

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
  return c;
}

Tensor generate(const Pipeline& pipeline, const Call& call) {
  Progress quiet(true);
  return pipeline.generate({call.prompt}, {}, call.settings, quiet).images;
}

TEST(Flux2Pipeline, VariantsAndDefaults) {
  const Pipeline klein = Pipeline::open(testing::fixture_model_dir("flux2-klein").string());
  const Pipeline dev = Pipeline::open(testing::fixture_model_dir("flux2-dev").string());
  EXPECT_EQ(klein.variant(), flux2::Variant::KleinDistilled);
  EXPECT_EQ(dev.variant(), flux2::Variant::Dev);
  EXPECT_EQ(klein.latent_multiple(), 4);  // the tiny VAE scales by 2

  Progress quiet(true);
  RunOptions options;
  const Settings k = klein.settings_for(options, quiet);
  EXPECT_EQ(k.num_inference_steps, 4);
  EXPECT_FALSE(k.true_cfg);
  EXPECT_EQ(k.height, 64);  // the VAE config's sample_size (diffusers: default_sample_size 128 x the scale 2)
  const Settings d = dev.settings_for(options, quiet);
  EXPECT_EQ(d.num_inference_steps, 50);
  EXPECT_DOUBLE_EQ(d.guidance_scale, 4.0);
  EXPECT_FALSE(d.true_cfg);

  options.negative_prompts = {"blurry"};
  testing::expect_error<UsageError>([&] { klein.settings_for(options, quiet); }, {"--negative_prompt", "no CFG"});
  testing::expect_error<UsageError>([&] { dev.settings_for(options, quiet); }, {"--negative_prompt"});
}

TEST(Flux2Pipeline, TokenizerModelMaxLengthCapsTheDefaultSequenceLength) {
  Progress quiet(true);
  RunOptions options;
  const Pipeline klein = Pipeline::open(testing::fixture_model_dir("flux2-klein").string());
  EXPECT_EQ(klein.settings_for(options, quiet).max_sequence_length, 512);  // model_max_length 131072

  const std::filesystem::path folder = testing::scratch_folder("flux2_short_tokenizer") / "klein";
  std::filesystem::copy(testing::fixture_model_dir("flux2-klein"), folder, std::filesystem::copy_options::recursive);
  const std::filesystem::path config_path = folder / "tokenizer" / "tokenizer_config.json";
  nlohmann::json config = nlohmann::json::parse(testing::read_text(config_path));
  config["model_max_length"] = 64;
  testing::write_text(config_path, config.dump());
  const Pipeline short_tokenizer = Pipeline::open(folder.string());
  EXPECT_EQ(short_tokenizer.settings_for(options, quiet).max_sequence_length, 64);
  options.max_sequence_length = 100;
  EXPECT_EQ(short_tokenizer.settings_for(options, quiet).max_sequence_length, 100);
}

TEST(Flux2Pipeline, NoiseIsDiffusersNoise) {
  const ReferenceFile reference = ReferenceFile::load("flux2-klein");
  const Tensor expected = reference.tensor("pipeline.noise");  // [1, 96, 128], packed
  const auto generator = make_noise_generator(NoiseSource::TorchCpu, 42);
  const Tensor noise = flux2::pack_latents(generator->randn({1, 128, 8, 12}, DType::F32));
  EXPECT_EQ(testing::compare(noise, expected.to_doubles()).max_abs, 0.0);
}

TEST(Flux2Pipeline, KleinImageMatchesDiffusersInF32) {
  const ReferenceFile reference = ReferenceFile::load("flux2-klein");
  const Pipeline pipeline = Pipeline::open(reference.model_dir().string());
  const Tensor image = generate(pipeline, pipeline_call(reference, "pipeline", DType::F32));
  const Tensor expected = reference.tensor("pipeline.image");
  ASSERT_EQ(image.shape(), expected.shape());
  const double db = testing::psnr(image, expected);
  std::printf("klein f32 PSNR %.1f dB\n", db);
  EXPECT_GE(db, 45.0);
  EXPECT_MATCHES_FIXTURE(image, expected);
}

TEST(Flux2Pipeline, KleinBaseTrueCfgMatchesDiffusersInF32) {
  const ReferenceFile reference = ReferenceFile::load("flux2-klein");
  const Pipeline pipeline = Pipeline::open(reference.model_dir().string());
  Call call = pipeline_call(reference, "pipeline_cfg", DType::F32);
  ASSERT_FALSE(reference.sidecar().get_object("calls").get_object("pipeline_cfg").get_bool("is_distilled"));
  call.settings.true_cfg = true;  // the fixture ran the same weights as klein base
  const Tensor image = generate(pipeline, call);
  const Tensor expected = reference.tensor("pipeline_cfg.image");
  const double db = testing::psnr(image, expected);
  std::printf("klein base (CFG 4) f32 PSNR %.1f dB\n", db);
  EXPECT_GE(db, 45.0);
  // CFG changes the picture: the distilled image is far from it.
  EXPECT_LT(testing::psnr(reference.tensor("pipeline.image"), expected), 40.0);
}

TEST(Flux2Pipeline, DevImageMatchesDiffusersInF32) {
  const ReferenceFile reference = ReferenceFile::load("flux2-dev");
  const Pipeline pipeline = Pipeline::open(reference.model_dir().string());
  const Tensor image = generate(pipeline, pipeline_call(reference, "pipeline", DType::F32));
  const double db = testing::psnr(image, reference.tensor("pipeline.image"));
  std::printf("dev f32 PSNR %.1f dB\n", db);
  EXPECT_GE(db, 45.0);
}

TEST(Flux2Pipeline, Bf16ImagesStayCloseToTheF32Reference) {
  for (const char* family : {"flux2-klein", "flux2-dev"}) {
    SCOPED_TRACE(family);
    const ReferenceFile reference = ReferenceFile::load(family);
    const Pipeline pipeline = Pipeline::open(reference.model_dir().string());
    const Tensor image = generate(pipeline, pipeline_call(reference, "pipeline", DType::BF16));
    const double db = testing::psnr(image, reference.tensor("pipeline.image"));
    std::printf("%s bf16 PSNR %.1f dB\n", family, db);
    EXPECT_GE(db, 30.0);
  }
}

TEST(Flux2Pipeline, BadSettingsAreClearErrors) {
  const ReferenceFile reference = ReferenceFile::load("flux2-klein");
  const Pipeline pipeline = Pipeline::open(reference.model_dir().string());
  Call call = pipeline_call(reference, "pipeline", DType::F32);
  call.settings.width = 50;
  testing::expect_error<UsageError>([&] { generate(pipeline, call); }, {"32x50", "multiples of 4"});
  testing::expect_error([&] { Pipeline::open(testing::fixture_model_dir("z-image").string()); },
                        {"ZImagePipeline", "not a FLUX.2 pipeline"});
}

// ---- the xdit binary ----

std::string klein_command(const std::filesystem::path& out, const std::string& extra = "") {
  return "--model " + testing::fixture_model_dir("flux2-klein").string() +
         " --prompt 'A red fox jumps over a sleeping dog, photographed at golden hour.'" +
         " --height 32 --width 48 --num_inference_steps 3 --seed 42 --dtype f32 --output_directory " + out.string() +
         " --output_name fox " + extra;
}

TEST(Flux2Cli, WritesThePngOfTheFixtureImageTwiceIdentically) {
  ASSERT_NE(find_pipeline("Flux2KleinPipeline"), nullptr);
  const auto first = testing::scratch_folder("flux2_cli_first");
  const auto second = testing::scratch_folder("flux2_cli_second");
  const testing::ProcessResult run1 = testing::run_xdit(klein_command(first));
  ASSERT_EQ(run1.exit_code, 0) << run1.err;
  EXPECT_EQ(run1.out, (first / "fox.png").string() + "\n");
  const testing::ProcessResult run2 = testing::run_xdit(klein_command(second, "--quiet"));
  ASSERT_EQ(run2.exit_code, 0) << run2.err;
  EXPECT_EQ(run2.err, "");
  EXPECT_EQ(testing::read_text(first / "fox.png"), testing::read_text(second / "fox.png"));

  PngText text;
  const RgbImage png = read_png((first / "fox.png").string(), &text);
  const RgbImage expected = to_rgb8(ReferenceFile::load("flux2-klein").tensor("pipeline.image").select(0, 0));
  ASSERT_EQ(png.pixels.size(), expected.pixels.size());
  int worst = 0;
  for (size_t i = 0; i < png.pixels.size(); ++i) worst = std::max(worst, std::abs(png.pixels[i] - expected.pixels[i]));
  EXPECT_LE(worst, 1) << "8-bit pixels differ by more than one level from diffusers' image";
  std::map<std::string, std::string> fields(text.begin(), text.end());
  EXPECT_EQ(fields["prompt"], "A red fox jumps over a sleeping dog, photographed at golden hour.");
  EXPECT_EQ(fields["seed"], "42");
  EXPECT_EQ(fields["steps"], "3");
  EXPECT_EQ(fields["guidance_scale"], "none");  // klein distilled runs no guidance
  EXPECT_EQ(fields["size"], "48x32");
  EXPECT_EQ(fields["dtype"], "f32");
}

TEST(Flux2Cli, SeveralPromptsInBatches) {
  const auto single = testing::scratch_folder("flux2_cli_single");
  const auto batched = testing::scratch_folder("flux2_cli_batched");
  ASSERT_EQ(testing::run_xdit(klein_command(single, "--quiet")).exit_code, 0);
  const testing::ProcessResult run =
      testing::run_xdit(klein_command(batched, "--quiet --prompt 'a cat' --batch_size 2"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, (batched / "fox_0.png").string() + "\n" + (batched / "fox_1.png").string() + "\n");
  PngText text;
  read_png((batched / "fox_1.png").string(), &text);
  const std::map<std::string, std::string> fields(text.begin(), text.end());
  EXPECT_EQ(fields.at("prompt"), "a cat");
  // One generator draws the noise of the whole batch, as diffusers does: the first image is the
  // single run's (the batched GEMMs may round differently), the second one differs.
  const auto as_tensor = [](const RgbImage& image) {
    std::vector<float> values(image.pixels.begin(), image.pixels.end());
    return Tensor::from_floats(values, {image.height, image.width, 3});
  };
  const Tensor alone = as_tensor(read_png((single / "fox.png").string()));
  EXPECT_GE(testing::psnr(as_tensor(read_png((batched / "fox_0.png").string())), alone, 255.0), 45.0);
  EXPECT_LT(testing::psnr(as_tensor(read_png((batched / "fox_1.png").string())), alone, 255.0), 30.0);
}

TEST(Flux2Cli, BenchmarkModeWritesTimings) {
  const auto out = testing::scratch_folder("flux2_cli_timings");
  const testing::ProcessResult run =
      testing::run_xdit(klein_command(out, "--num_iterations 2 --warmup_calls 1 --quiet"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json timings = nlohmann::json::parse(testing::read_text(out / "timings.json"));
  EXPECT_EQ(timings["warmup_calls"], 1);
  EXPECT_GT(timings["time_to_first_image_s"].get<double>(), 0.0);
  EXPECT_GT(timings["peak_rss_bytes"].get<int64_t>(), 0);
  ASSERT_EQ(timings["iterations"].size(), 2u);
  for (const auto& iteration : timings["iterations"]) {
    EXPECT_EQ(iteration["step_s"].size(), 3u);
    EXPECT_GT(iteration["denoise_s"].get<double>(), 0.0);
    EXPECT_GE(iteration["total_s"].get<double>(), iteration["denoise_s"].get<double>());
  }
  EXPECT_GT(timings["median"]["step_s"].get<double>(), 0.0);
}

TEST(Flux2Cli, BadInputIsOneLine) {
  const auto out = testing::scratch_folder("flux2_cli_bad");
  testing::expect_one_error_line(testing::run_xdit(klein_command(out, "--height 40")), kExitUsageError,
                                 "--height 40");
  testing::expect_one_error_line(testing::run_xdit(klein_command(out, "--num_inference_steps 0")), kExitUsageError,
                                 "--num_inference_steps 0");
  testing::expect_one_error_line(testing::run_xdit(klein_command(out, "--num_frames 5")), kExitUsageError,
                                 "--num_frames: Flux2KleinPipeline does not take this flag");
  EXPECT_TRUE(std::filesystem::is_empty(out));
}

// A scratch copy of the klein fixture model, without the `drop` component folder when given.
std::filesystem::path broken_klein(const std::string& name, const std::string& drop = "") {
  const auto folder = testing::scratch_folder(name);
  std::filesystem::copy(testing::fixture_model_dir("flux2-klein"), folder, std::filesystem::copy_options::recursive);
  if (!drop.empty()) std::filesystem::remove_all(folder / drop);
  return folder;
}

std::string broken_command(const std::filesystem::path& model) {
  const auto out = testing::scratch_folder("flux2_cli_broken_out");
  return "--model " + model.string() + " --prompt fox --height 32 --width 48 --num_inference_steps 1 --quiet " +
         "--output_directory " + out.string();
}

TEST(Flux2Cli, BrokenModelFoldersAreOneLine) {
  const auto no_vae = broken_klein("flux2_no_vae", "vae");
  testing::expect_one_error_line(testing::run_xdit(broken_command(no_vae)), kExitRuntimeError, "vae");

  const auto weights_path = [](const std::filesystem::path& model) {
    return model / "transformer" / "diffusion_pytorch_model.safetensors";
  };
  const auto truncated = broken_klein("flux2_truncated");
  std::filesystem::resize_file(weights_path(truncated), std::filesystem::file_size(weights_path(truncated)) - 100);
  testing::expect_one_error_line(testing::run_xdit(broken_command(truncated)), kExitRuntimeError,
                                 "diffusion_pytorch_model.safetensors");

  const SafetensorsFile original = SafetensorsFile::open(weights_path(testing::fixture_model_dir("flux2-klein")).string());
  std::vector<std::pair<std::string, Tensor>> missing, reshaped;
  for (const std::string& tensor_name : original.names()) {
    const Tensor t = original.tensor(tensor_name);
    if (tensor_name != "proj_out.weight") missing.emplace_back(tensor_name, t);
    reshaped.emplace_back(tensor_name, tensor_name == "proj_out.weight" ? t.contiguous().view({t.numel()}) : t);
  }
  const auto without = broken_klein("flux2_missing_tensor");
  write_safetensors(weights_path(without).string(), missing);
  testing::expect_one_error_line(testing::run_xdit(broken_command(without)), kExitRuntimeError, "proj_out.weight");
  const auto wrong_shape = broken_klein("flux2_wrong_shape");
  write_safetensors(weights_path(wrong_shape).string(), reshaped);
  testing::expect_one_error_line(testing::run_xdit(broken_command(wrong_shape)), kExitRuntimeError, "proj_out.weight");
}

}  // namespace
}  // namespace xdit
