// Every hand-made bad file, reached through the xdit binary, gives one error line naming the file
// and a non-zero exit: no crash, no hang, no partial output.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/files.h"
#include "xdit/runtime/run_options.h"

namespace xdit {
namespace {

namespace fs = std::filesystem;
using testing::expect_one_error_line;
using testing::run_xdit;
using testing::scratch_folder;
using testing::write_text;

const fs::path kBadFiles = fs::path(XDIT_SOURCE_DIR) / "tests" / "bad_files";

std::vector<fs::path> files_in(const fs::path& folder) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(folder)) files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

// A diffusers folder whose transformer weights are `weights`.
fs::path model_with_weights(const fs::path& weights) {
  const fs::path model = scratch_folder("model_" + weights.stem().string());
  write_text(model / "model_index.json",
             R"({"_class_name": "Flux2KleinPipeline", "transformer": ["diffusers", "Flux2Transformer2DModel"]})");
  fs::create_directories(model / "transformer");
  write_text(model / "transformer" / "config.json", "{}");
  fs::copy_file(weights, model / "transformer" / "diffusion_pytorch_model.safetensors");
  return model;
}

TEST(CliBadInput, EveryBadSafetensorsFileIsOneErrorLine) {
  const std::vector<fs::path> files = files_in(kBadFiles / "safetensors");
  ASSERT_GE(files.size(), 20u);
  for (const fs::path& bad : files) {
    SCOPED_TRACE(bad.filename().string());
    const fs::path model = model_with_weights(bad);
    expect_one_error_line(run_xdit("info " + model.string()), kExitRuntimeError,
                          "transformer/diffusion_pytorch_model.safetensors");
  }
}

TEST(CliBadInput, BadModelIndexIsOneErrorLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"transformer": ["diffusers", "X"]})", "_class_name"},                 // missing field
      {R"({"_class_name": 3})", "_class_name"},                                  // ill-typed field
      {R"({"_class_name": "P", "vae": ["diffusers", "AutoencoderKL"]})", "vae"},  // missing folder
      {R"({"_class_name": "P",)", "model_index.json"},                           // truncated JSON
  };
  for (const auto& [index, fragment] : cases) {
    SCOPED_TRACE(index);
    const fs::path model = scratch_folder("bad_index");
    write_text(model / "model_index.json", index);
    expect_one_error_line(run_xdit("info " + model.string()), kExitRuntimeError, fragment);
    expect_one_error_line(run_xdit("--model " + model.string() + " --prompt p"), kExitRuntimeError, fragment);
  }
}

TEST(CliBadInput, UnknownFlagsAndOutOfRangeValuesAreUsageErrors) {
  expect_one_error_line(run_xdit("--not-a-flag 1"), kExitUsageError, "--not-a-flag");
  expect_one_error_line(run_xdit("--num_inference_steps 0"), kExitUsageError, "--num_inference_steps");
  expect_one_error_line(run_xdit("--ulysses_degree 0"), kExitUsageError, "--ulysses_degree");
  expect_one_error_line(run_xdit("--height -16"), kExitUsageError, "--height");
  expect_one_error_line(run_xdit("--seed 1e400"), kExitUsageError, "--seed");
  expect_one_error_line(run_xdit("--guidance_scale nan"), kExitUsageError, "--guidance_scale");
}

}  // namespace
}  // namespace xdit
