// What every image pipeline does around its own call: batching the prompts, warm-up and timed
// iterations, PNG files with their metadata, timings.json, and the paths printed on stdout.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <cstdint>
#include <optional>
#include <string_view>

#include "xdit/core/dtype.h"
#include "xdit/core/rng.h"
#include "xdit/core/tensor.h"
#include "xdit/io/png.h"
#include "xdit/runtime/progress.h"
#include "xdit/runtime/run_options.h"
#include "xdit/runtime/timings.h"

namespace xdit {

// What every image pipeline reads from the command line in the same way; a family's Settings
// extends it with its guidance options.
struct ImageSettings {
  int64_t height = 1024;
  int64_t width = 1024;
  int64_t num_inference_steps = 1;
  std::optional<double> flow_shift;  // replaces the family's shift or schedule
  int64_t max_sequence_length = 512;
  DType dtype = DType::BF16;
  bool fp8_transformer = false;
  bool fp8_text_encoder = false;
  uint64_t seed = 42;
  NoiseSource rng = NoiseSource::TorchCpu;
};

// The command line's values over the model's default size, steps and prompt length.
ImageSettings image_settings(const RunOptions& options, int64_t default_size, int64_t default_steps,
                             int64_t default_max_sequence_length);

// Throws a UsageError naming the size and the model folder unless both sides are multiples of `multiple`.
void check_image_size(const ImageSettings& settings, int64_t multiple, const std::string& model_folder);

// The PNG metadata of a run: model, pipeline, steps, guidance, size, dtype, weight format. A
// guidance_scale of nullopt (a model that runs no guidance, such as a distilled one) is "none".
PngText image_metadata(const RunOptions& options, std::string_view pipeline, const ImageSettings& settings,
                       std::optional<double> guidance_scale);

struct ImageBatch {
  Tensor images;  // [B, H, W, 3] F32 in [0, 1], one per prompt of the call
  CallTimings timings;
};

// One pipeline call: a batch of prompts and their negative prompts (empty, or one per prompt).
using GenerateImages =
    std::function<ImageBatch(const std::vector<std::string>& prompts, const std::vector<std::string>& negatives)>;

// Runs --warmup_calls untimed and --num_iterations timed passes over the prompts, --batch_size at
// a time; writes each prompt's PNG (from the last pass) with `metadata` plus the prompt, and, in
// benchmark mode (more than one call), timings.json. Prints each PNG's path on stdout.
// `metadata` holds what the pipeline resolved: model, steps, guidance, size, dtype.
void run_image_generation(const RunOptions& options, const PngText& metadata, const GenerateImages& generate,
                          Progress& progress);

// The PNG paths of a run with `count` prompts: <dir>/<stem>.png, or <stem>_<i>.png for several.
std::vector<std::string> output_paths(const RunOptions& options, size_t count);

}  // namespace xdit
