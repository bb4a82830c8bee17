#include "xdit/runtime/generation.h"

#include <algorithm>
#include <filesystem>
#include <iostream>

#include "xdit/core/error.h"

namespace xdit {
namespace {

std::string parallel_layout(const RunOptions& o) {
  return concat_message("ulysses=", o.ulysses_degree, " ring=", o.ring_degree,
                        " cfg_parallel=", o.use_cfg_parallel ? 1 : 0, " pipefusion=", o.pipefusion_parallel_degree,
                        " data_parallel=", o.data_parallel_degree);
}

std::string model_stem(const RunOptions& o) {
  if (o.output_name) return *o.output_name;
  const std::filesystem::path model = std::filesystem::path(o.model.value_or("demo")).lexically_normal();
  std::string name = (model.has_filename() ? model.filename() : model.parent_path().filename()).string();
  if (name.empty()) name = "image";
  return name;
}

}  // namespace

ImageSettings image_settings(const RunOptions& options, int64_t default_size, int64_t default_steps,
                             int64_t default_max_sequence_length) {
  ImageSettings s;
  s.height = options.height.value_or(static_cast<int>(default_size));
  s.width = options.width.value_or(static_cast<int>(default_size));
  s.num_inference_steps = options.num_inference_steps.value_or(static_cast<int>(default_steps));
  s.flow_shift = options.flow_shift;
  s.max_sequence_length = options.max_sequence_length.value_or(static_cast<int>(default_max_sequence_length));
  s.dtype = options.dtype;
  s.fp8_transformer = options.gemm_quantization == GemmQuantization::Fp8;
  s.fp8_text_encoder = options.use_fp8_text_encoder;
  s.seed = options.seed;
  s.rng = options.rng == NoiseRng::TorchCuda ? NoiseSource::TorchCuda : NoiseSource::TorchCpu;
  return s;
}

void check_image_size(const ImageSettings& s, int64_t multiple, const std::string& model_folder) {
  if (s.height % multiple != 0 || s.width % multiple != 0) {
    throw UsageError(concat_message("--height/--width ", s.height, "x", s.width, ": must be multiples of ", multiple,
                                    " for ", model_folder, " (the VAE's scale factor times the 2x2 patch)"));
  }
}

PngText image_metadata(const RunOptions& options, std::string_view pipeline, const ImageSettings& s,
                       std::optional<double> guidance_scale) {
  return {{"model", options.model.value_or("")},
          {"pipeline", std::string(pipeline)},
          {"steps", std::to_string(s.num_inference_steps)},
          {"guidance_scale", guidance_scale ? concat_message(*guidance_scale) : "none"},
          {"size", concat_message(s.width, "x", s.height)},
          {"dtype", std::string(dtype_name(s.dtype))},
          {"gemm_quantization", s.fp8_transformer ? "fp8" : "none"}};
}

std::vector<std::string> output_paths(const RunOptions& options, size_t count) {
  const std::filesystem::path folder(options.output_directory);
  const std::string stem = model_stem(options);
  std::vector<std::string> paths;
  for (size_t i = 0; i < count; ++i) {
    const std::string name = count == 1 ? stem + ".png" : concat_message(stem, "_", i, ".png");
    paths.push_back((folder / name).string());
  }
  return paths;
}

void run_image_generation(const RunOptions& options, const PngText& metadata, const GenerateImages& generate,
                          Progress& progress) {
  if (options.prompts.empty()) throw UsageError("--prompt: give at least one prompt");
  const size_t count = options.prompts.size();
  const auto negative_for = [&](size_t i) -> std::string {
    if (options.negative_prompts.empty()) return {};
    return options.negative_prompts.size() == 1 ? options.negative_prompts[0] : options.negative_prompts[i];
  };
  std::error_code error;
  std::filesystem::create_directories(options.output_directory, error);
  XDIT_CHECK(!error && std::filesystem::is_directory(options.output_directory), "--output_directory ",
             options.output_directory, ": cannot create the folder: ", error.message());

  const std::vector<std::string> paths = output_paths(options, count);
  const int calls = options.warmup_calls + options.num_iterations;
  const size_t batch = static_cast<size_t>(options.batch_size);
  std::vector<Tensor> images(count);
  std::vector<CallTimings> timed;
  CallTimings first_call;
  for (int call = 0; call < calls; ++call) {
    for (size_t begin = 0; begin < count; begin += batch) {
      const size_t end = std::min(count, begin + batch);
      std::vector<std::string> prompts(options.prompts.begin() + static_cast<std::ptrdiff_t>(begin),
                                       options.prompts.begin() + static_cast<std::ptrdiff_t>(end));
      std::vector<std::string> negatives;
      if (!options.negative_prompts.empty()) {
        for (size_t i = begin; i < end; ++i) negatives.push_back(negative_for(i));
      }
      const ImageBatch result = generate(prompts, negatives);
      XDIT_CHECK(result.images.dim() == 4 && result.images.size(0) == static_cast<int64_t>(end - begin),
                 "pipeline returned ", shape_str(result.images.shape()), " for ", end - begin, " prompts");
      if (call == 0 && begin == 0) first_call = result.timings;
      if (call >= options.warmup_calls) timed.push_back(result.timings);
      for (size_t i = begin; i < end; ++i) images[i] = result.images.select(0, static_cast<int64_t>(i - begin));
    }
  }

  for (size_t i = 0; i < count; ++i) {
    PngText text = {{"prompt", options.prompts[i]}, {"negative_prompt", negative_for(i)}};
    text.insert(text.end(), metadata.begin(), metadata.end());
    text.emplace_back("seed", std::to_string(options.seed));
    text.emplace_back("parallel", parallel_layout(options));
    text.emplace_back("version", concat_message("xdit ", XDIT_VERSION));
    write_png(paths[i], to_rgb8(images[i]), text);
    std::cout << paths[i] << std::endl;
  }
  if (calls > 1) {
    write_timings_json(options.output_directory, options.warmup_calls, first_call, timed);
    progress.message("timings: " + (std::filesystem::path(options.output_directory) / "timings.json").string());
  }
}

}  // namespace xdit
