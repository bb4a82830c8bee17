// What every image pipeline does around its own call: batching the prompts, warm-up and timed
// iterations, PNG files with their metadata, timings.json, and the paths printed on stdout.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "xdit/core/tensor.h"
#include "xdit/io/png.h"
#include "xdit/runtime/progress.h"
#include "xdit/runtime/run_options.h"
#include "xdit/runtime/timings.h"

namespace xdit {

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
