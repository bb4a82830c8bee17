#include "xdit/runtime/run_options.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>
#include <utility>

#include "xdit/runtime/pipeline_registry.h"

namespace xdit {
namespace {

// ---------------------------------------------------------------------------------------------
// Enumerated values: each flag's spellings, in the order --help lists them.

template <typename E>
using Choices = std::vector<std::pair<std::string, E>>;

const Choices<GemmQuantization> kGemmQuantizations = {{"none", GemmQuantization::None},
                                                      {"fp8", GemmQuantization::Fp8}};
const Choices<DeviceType> kDevices = {{"cpu", DeviceType::CPU}, {"cuda", DeviceType::CUDA}};
const Choices<DType> kDTypes = {{"bf16", DType::BF16}, {"f32", DType::F32}};
const Choices<NoiseRng> kNoiseRngs = {{"torch_cpu", NoiseRng::TorchCpu}, {"torch_cuda", NoiseRng::TorchCuda}};
const Choices<CacheMethod> kCacheMethods = {{"teacache", CacheMethod::TeaCache},
                                            {"fbcache", CacheMethod::FbCache},
                                            {"dbcache", CacheMethod::DbCache}};

// xDiT's attention backends (ANCHORS.md); "auto" picks the best one for the device.
const std::vector<std::string> kAttentionBackends = {"auto",      "sdpa",         "cudnn",           "flash",
                                                     "flash_3",   "flash_3_fp8",  "sage",            "aiter",
                                                     "aiter_fp8", "aiter_flydsl", "aiter_flydsl_fp8"};

std::string joined(const std::vector<std::string>& values, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i) out += separator;
    out += values[i];
  }
  return out;
}

template <typename E>
std::vector<std::string> spellings(const Choices<E>& choices) {
  std::vector<std::string> names;
  for (const auto& [name, value] : choices) names.push_back(name);
  return names;
}

template <typename E>
std::optional<std::string> spelling_of(const Choices<E>& choices, E value) {
  for (const auto& [name, choice] : choices) {
    if (choice == value) return name;
  }
  return std::nullopt;
}

template <typename E>
E choice_named(std::string_view flag, const std::string& value, const Choices<E>& choices) {
  for (const auto& [name, choice] : choices) {
    if (name == value) return choice;
  }
  throw UsageError(concat_message(flag, " ", value, ": expected one of ", joined(spellings(choices), ", ")));
}

// ---------------------------------------------------------------------------------------------
// What parses but is not built yet. One table, so each feature that lands removes its rows; the
// --help text and docs/cli.md read their "not supported yet" marks from here too.

struct UnsupportedUse {
  std::string_view flag;
  std::string_view values;  // which values are not supported, for the docs; empty: any use
  // The flag as the user wrote it ("--ulysses_degree 2", "--use_cfg_parallel"), if requested.
  std::function<std::optional<std::string>(const RunOptions&)> requested;
};

std::function<std::optional<std::string>(const RunOptions&)> above_one(int RunOptions::*field) {
  return [field](const RunOptions& o) -> std::optional<std::string> {
    if (o.*field > 1) return std::to_string(o.*field);
    return std::nullopt;
  };
}

std::function<std::optional<std::string>(const RunOptions&)> switched_on(bool RunOptions::*field) {
  return [field](const RunOptions& o) -> std::optional<std::string> {
    if (o.*field) return std::string();
    return std::nullopt;
  };
}

template <typename T>
std::function<std::optional<std::string>(const RunOptions&)> given(std::optional<T> RunOptions::*field) {
  return [field](const RunOptions& o) -> std::optional<std::string> {
    if (o.*field) return concat_message(*(o.*field));
    return std::nullopt;
  };
}

template <typename T>
std::function<std::optional<std::string>(const RunOptions&)> listed(std::vector<T> RunOptions::*field) {
  return [field](const RunOptions& o) -> std::optional<std::string> {
    if ((o.*field).empty()) return std::nullopt;
    std::ostringstream values;
    for (size_t i = 0; i < (o.*field).size(); ++i) values << (i ? " " : "") << (o.*field)[i];
    return values.str();
  };
}

template <typename T>
std::function<std::optional<std::string>(const RunOptions&)> equal_to(T RunOptions::*field, T value,
                                                                     std::string_view spelling) {
  return [field, value, spelling](const RunOptions& o) -> std::optional<std::string> {
    if (o.*field == value) return std::string(spelling);
    return std::nullopt;
  };
}

const std::vector<UnsupportedUse>& unsupported_uses() {
  static const std::vector<UnsupportedUse> table = {
      {"--dataset_path", "", given(&RunOptions::dataset_path)},
      {"--ulysses_degree", "values above 1", above_one(&RunOptions::ulysses_degree)},
      {"--ring_degree", "values above 1", above_one(&RunOptions::ring_degree)},
      {"--use_cfg_parallel", "", switched_on(&RunOptions::use_cfg_parallel)},
      {"--pipefusion_parallel_degree", "values above 1", above_one(&RunOptions::pipefusion_parallel_degree)},
      {"--num_pipeline_patch", "", given(&RunOptions::num_pipeline_patch)},
      {"--attn_layer_num_for_pp", "", listed(&RunOptions::attn_layer_num_for_pp)},
      {"--data_parallel_degree", "values above 1", above_one(&RunOptions::data_parallel_degree)},
      {"--fully_shard_degree", "values above 1", above_one(&RunOptions::fully_shard_degree)},
      {"--fully_shard_components", "", listed(&RunOptions::fully_shard_components)},
      {"--memory_efficient_sharding", "", switched_on(&RunOptions::memory_efficient_sharding)},
      {"--memory_efficient_replicated_load", "", switched_on(&RunOptions::memory_efficient_replicated_load)},
      {"--use_fp8_comms", "", switched_on(&RunOptions::use_fp8_comms)},
      {"--attention_backend", "every value but auto",
       [](const RunOptions& o) -> std::optional<std::string> {
         if (o.attention_backend != "auto") return o.attention_backend;
         return std::nullopt;
       }},
      {"--use_torch_compile", "", switched_on(&RunOptions::use_torch_compile)},
      {"--cache_method", "", [](const RunOptions& o) { return spelling_of(kCacheMethods, o.cache_method); }},
      {"--cache_config", "", given(&RunOptions::cache_config)},
      {"--enable_tiling", "", switched_on(&RunOptions::enable_tiling)},
      {"--use_parallel_vae", "", switched_on(&RunOptions::use_parallel_vae)},
      {"--vae_tile_size_height", "", given(&RunOptions::vae_tile_size_height)},
      {"--vae_tile_size_width", "", given(&RunOptions::vae_tile_size_width)},
      {"--vae_tile_overlap_height", "", given(&RunOptions::vae_tile_overlap_height)},
      {"--vae_tile_overlap_width", "", given(&RunOptions::vae_tile_overlap_width)},
      {"--enable_model_cpu_offload", "", switched_on(&RunOptions::enable_model_cpu_offload)},
      {"--enable_group_cpu_offload", "", switched_on(&RunOptions::enable_group_cpu_offload)},
      {"--enable_sequential_cpu_offload", "", switched_on(&RunOptions::enable_sequential_cpu_offload)},
      {"--device", "cuda", equal_to(&RunOptions::device, DeviceType::CUDA, "cuda")},
      {"--rng", "torch_cuda", equal_to(&RunOptions::rng, NoiseRng::TorchCuda, "torch_cuda")},
  };
  return table;
}

// Flags that only some models take; PipelineSpec::model_flags lists the ones a pipeline takes.
struct ModelSpecificFlag {
  std::string_view flag;
  std::function<bool(const RunOptions&)> given;
};

const std::vector<ModelSpecificFlag>& model_specific_uses() {
  static const std::vector<ModelSpecificFlag> table = {
      {"--negative_prompt", [](const RunOptions& o) { return !o.negative_prompts.empty(); }},
      {"--num_frames", [](const RunOptions& o) { return o.num_frames.has_value(); }},
      {"--guidance_scale", [](const RunOptions& o) { return o.guidance_scale.has_value(); }},
      {"--guidance_scale_2", [](const RunOptions& o) { return o.guidance_scale_2.has_value(); }},
      {"--true_cfg_scale", [](const RunOptions& o) { return o.true_cfg_scale.has_value(); }},
      {"--cfg_normalization", [](const RunOptions& o) { return o.cfg_normalization.has_value(); }},
      {"--cfg_truncation", [](const RunOptions& o) { return o.cfg_truncation.has_value(); }},
      {"--flow_shift", [](const RunOptions& o) { return o.flow_shift.has_value(); }},
      {"--text_encoder_out_layers", [](const RunOptions& o) { return !o.text_encoder_out_layers.empty(); }},
  };
  return table;
}

std::string support_status(std::string_view flag) {
  for (const UnsupportedUse& use : unsupported_uses()) {
    if (use.flag != flag) continue;
    if (use.values.empty()) return "not supported yet";
    return concat_message("not supported yet: ", use.values);
  }
  return "supported";
}

// ---------------------------------------------------------------------------------------------
// The flag definitions. FlagSet registers each flag with CLI11 and records its FlagInfo, so
// --help, docs/cli.md and all_flag_names() come from the same lines.

class FlagSet {
 public:
  FlagSet(CLI::App& app, std::vector<FlagInfo>& infos) : app_(app), infos_(infos) {}

  void group(std::string name) { group_ = std::move(name); }

  void text(const std::string& name, std::string& field, const std::string& value, const std::string& meaning) {
    describe(app_.add_option(name, field), value, value, field, true, meaning);
  }

  template <typename T>
  void number(const std::string& name, T& field, const std::string& value, const std::string& meaning) {
    describe(app_.add_option(name, field), value, value, std::to_string(field), true, meaning);
  }

  // Unset until given; `default_value` says what unset means ("model default").
  template <typename T>
  void optional(const std::string& name, std::optional<T>& field, const std::string& value,
                const std::string& default_value, const std::string& meaning) {
    auto* option = app_.add_option_function<T>(name, [&field](const T& parsed) { field = parsed; });
    describe(option, value, value, default_value, false, meaning);
  }

  // Several values after one flag, or the flag repeated: `--prompt a b` or `--prompt a --prompt b`.
  template <typename T>
  void list(const std::string& name, std::vector<T>& field, const std::string& value,
            const std::string& default_value, const std::string& meaning) {
    auto* option = app_.add_option(name, field)
                       ->expected(1, CLI::detail::expected_max_vector_size)
                       ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
    describe(option, value, value + " ...", default_value, false, meaning);  // CLI11 adds the "..." itself
  }

  void switch_flag(const std::string& name, bool& field, const std::string& meaning) {
    describe(app_.add_flag(name, field), "", "", "off", false, meaning);
  }

  // A value read by `convert`, which throws UsageError naming the flag when the text is wrong.
  template <typename T>
  void converted(const std::string& name, T& field, const std::string& value, const std::string& default_value,
                 bool default_is_a_value, std::function<T(const std::string&)> convert, const std::string& meaning) {
    auto* option = app_.add_option_function<std::string>(
        name, [&field, convert](const std::string& text) { field = convert(text); });
    describe(option, value, value, default_value, default_is_a_value, meaning);
  }

  // The field's value when the flag is absent is its default; it need not be one of the choices.
  template <typename E>
  void choice(const std::string& name, E& field, const Choices<E>& choices, const std::string& meaning) {
    const std::optional<std::string> default_value = spelling_of(choices, field);
    converted<E>(name, field, joined(spellings(choices), "|"), default_value.value_or("none"),
                 default_value.has_value(),
                 [name, &choices](const std::string& text) { return choice_named(name, text, choices); }, meaning);
  }

 private:
  // `help_value` is the value label --help shows; `value` is the one docs/cli.md shows.
  void describe(CLI::Option* option, const std::string& help_value, const std::string& value,
                const std::string& default_value, bool default_is_a_value, const std::string& meaning) {
    const std::string name = option->get_name();
    FlagInfo info{group_, name, value, default_value, meaning, support_status(name)};
    std::string description = meaning;
    if (info.status != "supported") description += " [" + info.status + "]";
    option->group(group_)->description(description);
    if (!help_value.empty()) option->type_name(help_value);
    if (default_is_a_value) option->default_str(default_value);
    infos_.push_back(std::move(info));
  }

  CLI::App& app_;
  std::vector<FlagInfo>& infos_;
  std::string group_;
};

// torch.manual_seed takes -2^63 .. 2^64-1 and uses a negative seed's two's complement.
uint64_t seed_from_text(const std::string& text) {
  const char* begin = text.data();
  const char* end = begin + text.size();
  if (text.starts_with("-")) {
    int64_t negative = 0;
    const auto [stop, error] = std::from_chars(begin, end, negative);
    if (error == std::errc() && stop == end) return static_cast<uint64_t>(negative);
  } else {
    uint64_t seed = 0;
    const auto [stop, error] = std::from_chars(begin, end, seed);
    if (error == std::errc() && stop == end) return seed;
  }
  throw UsageError(concat_message("--seed ", text, ": expected an integer from -2^63 to 2^64-1"));
}

void add_run_flags(CLI::App& app, RunOptions& o, std::vector<FlagInfo>& infos) {
  FlagSet flags(app, infos);

  flags.group("Input and output");
  flags.optional("--model", o.model, "TEXT", "the bundled demo model",
                 "Local diffusers folder (model_index.json and component folders), or Hugging Face Hub repo id "
                 "(not supported yet)");
  flags.list("--prompt", o.prompts, "TEXT", "none", "Prompt; several values or repeated flags give one output each");
  flags.list("--negative_prompt", o.negative_prompts, "TEXT", "none",
             "Negative prompt: one for every prompt, or one per prompt");
  flags.optional("--height", o.height, "INT", "model default",
                 "Image height in pixels, a multiple of the model's spatial multiple");
  flags.optional("--width", o.width, "INT", "model default",
                 "Image width in pixels, a multiple of the model's spatial multiple");
  flags.optional("--num_frames", o.num_frames, "INT", "model default", "Video length in frames (video models)");
  flags.optional("--num_inference_steps", o.num_inference_steps, "INT", "model default", "Denoising steps");
  flags.optional("--guidance_scale", o.guidance_scale, "FLOAT", "model default",
                 "Guidance scale (classifier-free or distilled, as the model defines it)");
  flags.optional("--guidance_scale_2", o.guidance_scale_2, "FLOAT", "model default",
                 "Guidance scale of the second, low-noise transformer (models with two, e.g. Wan 2.2)");
  flags.optional("--true_cfg_scale", o.true_cfg_scale, "FLOAT", "model default",
                 "True classifier-free guidance scale (models that have it, e.g. Qwen-Image)");
  flags.optional("--cfg_normalization", o.cfg_normalization, "FLOAT", "off",
                 "CFG renormalisation (Z-Image): cap the guided prediction's norm at FLOAT times the "
                 "conditional one's; 0 is off");
  flags.optional("--cfg_truncation", o.cfg_truncation, "FLOAT", "1.0",
                 "CFG truncation (Z-Image): skip CFG at steps where 1 - sigma exceeds FLOAT");
  flags.optional("--flow_shift", o.flow_shift, "FLOAT", "model default",
                 "Shift of the flow-matching sigma schedule");
  flags.optional("--max_sequence_length", o.max_sequence_length, "INT", "model default",
                 "Longest prompt, in text-encoder tokens");
  flags.list("--text_encoder_out_layers", o.text_encoder_out_layers, "INT", "model default",
             "Text-encoder hidden states the transformer reads (0 = embeddings), as the diffusers argument");
  flags.converted<uint64_t>("--seed", o.seed, "INT", std::to_string(o.seed), true, seed_from_text,
                            "Seed of the initial noise; a seed gives the same noise as diffusers");
  flags.text("--output_directory", o.output_directory, "PATH", "Where images, videos and timings.json are written");
  flags.number("--batch_size", o.batch_size, "INT", "Prompts per pipeline call");
  flags.optional("--dataset_path", o.dataset_path, "PATH", "none",
                 "CSV file of prompts (a \"prompt\" column), run --batch_size at a time");

  flags.group("Benchmarking");
  flags.number("--num_iterations", o.num_iterations, "INT",
               "Timed runs of the pipeline; timings.json records each one and the median");
  flags.number("--warmup_calls", o.warmup_calls, "INT", "Untimed runs before the timed ones");

  flags.group("Parallelism");
  flags.number("--ulysses_degree", o.ulysses_degree, "INT",
               "Ulysses sequence-parallel degree (all-to-all around attention)");
  flags.number("--ring_degree", o.ring_degree, "INT", "Ring-attention sequence-parallel degree");
  flags.switch_flag("--use_cfg_parallel", o.use_cfg_parallel,
                    "Run the conditional and unconditional branches on two rank groups");
  flags.number("--pipefusion_parallel_degree", o.pipefusion_parallel_degree, "INT",
               "PipeFusion stages: transformer blocks split across ranks");
  flags.optional("--num_pipeline_patch", o.num_pipeline_patch, "INT", "automatic",
                 "Latent patches that flow through the PipeFusion stages");
  flags.list("--attn_layer_num_for_pp", o.attn_layer_num_for_pp, "INT", "even split",
             "Transformer blocks in each PipeFusion stage, one value per stage");
  flags.number("--data_parallel_degree", o.data_parallel_degree, "INT",
               "Rank groups that each generate different prompts");
  flags.number("--fully_shard_degree", o.fully_shard_degree, "INT",
               "FSDP: each of N ranks keeps 1/N of the weights (adds no ranks)");
  flags.list("--fully_shard_components", o.fully_shard_components, "TEXT", "the model's FSDP strategy",
             "Components to shard with FSDP, e.g. text_encoder");
  flags.switch_flag("--memory_efficient_sharding", o.memory_efficient_sharding,
                    "FSDP load: rank 0 reads each block and broadcasts it before sharding");
  flags.switch_flag("--memory_efficient_replicated_load", o.memory_efficient_replicated_load,
                    "Rank 0 reads each block and broadcasts it, so host memory holds one copy");
  flags.switch_flag("--use_fp8_comms", o.use_fp8_comms,
                    "Send the Ulysses all-to-all payload in FP8 with per-block scales");

  flags.group("Precision and kernels");
  flags.choice("--gemm_quantization", o.gemm_quantization, kGemmQuantizations,
               "Convert the transformer's linear weights to FP8 e4m3 at load");
  flags.switch_flag("--use_fp8_text_encoder", o.use_fp8_text_encoder,
                    "Convert the text encoder's linear weights to FP8 too (needs --gemm_quantization fp8)");
  flags.text("--attention_backend", o.attention_backend, "NAME",
             "Attention kernel: " + joined(kAttentionBackends, ", ") + "; auto picks the best for the device");
  flags.switch_flag("--use_torch_compile", o.use_torch_compile,
                    "Use the fused, graph-captured execution path (our counterpart of torch.compile)");

  flags.group("Caching");
  flags.choice("--cache_method", o.cache_method, kCacheMethods, "Reuse transformer outputs across steps");
  flags.optional("--cache_config", o.cache_config, "JSON", "the model's preset",
                 "Cache settings, a JSON object merged over the model's preset (needs --cache_method)");

  flags.group("VAE");
  flags.switch_flag("--enable_tiling", o.enable_tiling, "Decode the latents a tile at a time");
  flags.switch_flag("--use_parallel_vae", o.use_parallel_vae, "Split the VAE decode across ranks");
  flags.optional("--vae_tile_size_height", o.vae_tile_size_height, "INT", "model default",
                 "Tile height in output pixels (with --vae_tile_size_width and --enable_tiling)");
  flags.optional("--vae_tile_size_width", o.vae_tile_size_width, "INT", "model default",
                 "Tile width in output pixels (with --vae_tile_size_height and --enable_tiling)");
  flags.optional("--vae_tile_overlap_height", o.vae_tile_overlap_height, "INT", "model default",
                 "Overlap of vertically adjacent tiles in output pixels (with --vae_tile_overlap_width)");
  flags.optional("--vae_tile_overlap_width", o.vae_tile_overlap_width, "INT", "model default",
                 "Overlap of horizontally adjacent tiles in output pixels (with --vae_tile_overlap_height)");

  flags.group("Offload");
  flags.switch_flag("--enable_model_cpu_offload", o.enable_model_cpu_offload,
                    "Keep components in host memory and move each to the device while it runs");
  flags.switch_flag("--enable_group_cpu_offload", o.enable_group_cpu_offload,
                    "Move groups of transformer blocks to the device as they run");
  flags.switch_flag("--enable_sequential_cpu_offload", o.enable_sequential_cpu_offload,
                    "Move each layer to the device as it runs (least memory, slowest)");

  flags.group("Our own");
  flags.choice("--device", o.device, kDevices, "Device that runs the model");
  flags.choice("--dtype", o.dtype, kDTypes, "Activation dtype; f32 is for parity debugging");
  flags.choice("--rng", o.rng, kNoiseRngs,
               "Noise generator: torch's CPU or CUDA generator, seeded as diffusers seeds it");
  flags.optional("--output_name", o.output_name, "TEXT", "from the model and layout", "File name stem of the outputs");
  flags.switch_flag("--quiet", o.quiet, "No progress output");
}

// ---------------------------------------------------------------------------------------------
// The command line.

constexpr std::string_view kDescription =
    "xdit: runs diffusion transformers (a native engine that mirrors the xDiT runner)";

std::string help_footer() {
  return concat_message(
      "Flags are also accepted with dashes (--num-inference-steps) and as --flag=value.\n"
      "Flags marked [not supported yet] are recognised and rejected.\n"
      "Exit codes: ", kExitSuccess, " success, ", kExitRuntimeError, " runtime error, ", kExitUsageError,
      " usage error, ", kExitNotSupported, " not supported yet.");
}

// xDiT spells flags with underscores and also accepts dashes: rewrite the name part of every
// long flag (before any '=') to underscores. Tokens after a bare "--" are values.
std::vector<std::string> with_underscored_flags(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  bool only_values = false;
  for (const std::string& arg : args) {
    if (arg == "--") only_values = true;
    if (only_values || !arg.starts_with("--")) {
      out.push_back(arg);
      continue;
    }
    std::string flag = arg;
    const size_t name_end = std::min(flag.find('='), flag.size());
    std::replace(flag.begin() + 2, flag.begin() + static_cast<std::ptrdiff_t>(name_end), '-', '_');
    out.push_back(std::move(flag));
  }
  return out;
}

std::string flag_name(const std::string& token) { return token.substr(0, token.find('=')); }

// One line for arguments CLI11 did not expect, in the spelling the user typed.
std::string unexpected_arguments_message(const std::vector<std::string>& extras,
                                         const std::map<std::string, std::string>& typed_spelling) {
  if (extras.empty()) return "unexpected arguments";
  const std::string& first = extras.front();
  if (!first.starts_with("-")) return "unexpected argument " + first;
  const std::string name = flag_name(first);
  const auto typed = typed_spelling.find(name);
  return concat_message("unknown flag ", typed == typed_spelling.end() ? name : typed->second,
                        " (xdit --help lists the flags)");
}

// ---------------------------------------------------------------------------------------------
// Validation helpers: every message is "<flag> <value>: <what is wrong>".

template <typename T>
[[noreturn]] void reject(std::string_view flag, const T& value, std::string_view problem) {
  throw UsageError(concat_message(flag, " ", value, ": ", problem));
}

void require_at_least(std::string_view flag, int value, int minimum) {
  if (value < minimum) reject(flag, value, concat_message("must be at least ", minimum));
}

void require_at_least(std::string_view flag, const std::optional<int>& value, int minimum) {
  if (value) require_at_least(flag, *value, minimum);
}

void require_finite(std::string_view flag, const std::optional<double>& value) {
  if (value && !std::isfinite(*value)) reject(flag, *value, "must be a finite number");
}

// Height and width of a VAE tile setting come together, and only with --enable_tiling.
void check_tile_pair(const RunOptions& o, std::string_view height_flag, const std::optional<int>& height,
                     std::string_view width_flag, const std::optional<int>& width) {
  if (height && !width) reject(height_flag, *height, concat_message("needs ", width_flag, " too"));
  if (width && !height) reject(width_flag, *width, concat_message("needs ", height_flag, " too"));
  if (height && !o.enable_tiling) reject(height_flag, *height, "needs --enable_tiling");
}

void check_vae_tiles(const RunOptions& o) {
  check_tile_pair(o, "--vae_tile_size_height", o.vae_tile_size_height, "--vae_tile_size_width",
                  o.vae_tile_size_width);
  check_tile_pair(o, "--vae_tile_overlap_height", o.vae_tile_overlap_height, "--vae_tile_overlap_width",
                  o.vae_tile_overlap_width);
  require_at_least("--vae_tile_size_height", o.vae_tile_size_height, 1);
  require_at_least("--vae_tile_size_width", o.vae_tile_size_width, 1);
  require_at_least("--vae_tile_overlap_height", o.vae_tile_overlap_height, 0);
  require_at_least("--vae_tile_overlap_width", o.vae_tile_overlap_width, 0);
  if (o.vae_tile_overlap_height && o.vae_tile_size_height &&
      *o.vae_tile_overlap_height >= *o.vae_tile_size_height) {
    reject("--vae_tile_overlap_height", *o.vae_tile_overlap_height,
           concat_message("must be less than --vae_tile_size_height ", *o.vae_tile_size_height));
  }
  if (o.vae_tile_overlap_width && o.vae_tile_size_width && *o.vae_tile_overlap_width >= *o.vae_tile_size_width) {
    reject("--vae_tile_overlap_width", *o.vae_tile_overlap_width,
           concat_message("must be less than --vae_tile_size_width ", *o.vae_tile_size_width));
  }
}

void check_parallel_layout(const RunOptions& o) {
  require_at_least("--ulysses_degree", o.ulysses_degree, 1);
  require_at_least("--ring_degree", o.ring_degree, 1);
  require_at_least("--pipefusion_parallel_degree", o.pipefusion_parallel_degree, 1);
  require_at_least("--data_parallel_degree", o.data_parallel_degree, 1);
  require_at_least("--fully_shard_degree", o.fully_shard_degree, 1);
  require_at_least("--num_pipeline_patch", o.num_pipeline_patch, 1);
  for (int layers : o.attn_layer_num_for_pp) require_at_least("--attn_layer_num_for_pp", layers, 1);
  if (!o.attn_layer_num_for_pp.empty() &&
      static_cast<int>(o.attn_layer_num_for_pp.size()) != o.pipefusion_parallel_degree) {
    throw UsageError(concat_message("--attn_layer_num_for_pp: ", o.attn_layer_num_for_pp.size(),
                                    " values for --pipefusion_parallel_degree ", o.pipefusion_parallel_degree,
                                    "; give one per stage"));
  }
  if (o.memory_efficient_sharding && o.fully_shard_degree < 2) {
    throw UsageError("--memory_efficient_sharding: needs --fully_shard_degree above 1");
  }
  if (!o.fully_shard_components.empty() && o.fully_shard_degree < 2) {
    reject("--fully_shard_components", o.fully_shard_components.front(), "needs --fully_shard_degree above 1");
  }
  // PipeFusion moves activations point to point; there is no FP8 wire format for that.
  if (o.use_fp8_comms && o.pipefusion_parallel_degree > 1) {
    throw UsageError(concat_message("--use_fp8_comms: cannot be combined with --pipefusion_parallel_degree ",
                                    o.pipefusion_parallel_degree));
  }
}

void check_inputs(const RunOptions& o) {
  require_at_least("--height", o.height, 1);
  require_at_least("--width", o.width, 1);
  require_at_least("--num_frames", o.num_frames, 1);
  require_at_least("--num_inference_steps", o.num_inference_steps, 1);
  require_at_least("--max_sequence_length", o.max_sequence_length, 1);
  for (int layer : o.text_encoder_out_layers) {
    if (layer < 0) reject("--text_encoder_out_layers", layer, "must be 0 or above");
  }
  require_finite("--guidance_scale", o.guidance_scale);
  require_finite("--guidance_scale_2", o.guidance_scale_2);
  require_finite("--true_cfg_scale", o.true_cfg_scale);
  require_finite("--cfg_normalization", o.cfg_normalization);
  require_finite("--cfg_truncation", o.cfg_truncation);
  if (o.cfg_normalization && *o.cfg_normalization < 0) {
    reject("--cfg_normalization", *o.cfg_normalization, "must be 0 or above");
  }
  require_finite("--flow_shift", o.flow_shift);
  if (o.flow_shift && *o.flow_shift <= 0) reject("--flow_shift", *o.flow_shift, "must be above 0");
  require_at_least("--batch_size", o.batch_size, 1);
  require_at_least("--num_iterations", o.num_iterations, 1);
  require_at_least("--warmup_calls", o.warmup_calls, 0);
  if (o.negative_prompts.size() > 1 && o.negative_prompts.size() != o.prompts.size()) {
    throw UsageError(concat_message("--negative_prompt: ", o.negative_prompts.size(), " values for ",
                                    o.prompts.size(), " prompts; give one for all, or one per prompt"));
  }
  if (o.output_directory.empty()) reject("--output_directory", "\"\"", "must not be empty");
  if (o.output_name && (o.output_name->empty() || o.output_name->find('/') != std::string::npos)) {
    reject("--output_name", concat_message("\"", *o.output_name, "\""), "must be a file name without '/'");
  }
}

void check_kernels_and_cache(const RunOptions& o) {
  if (std::find(kAttentionBackends.begin(), kAttentionBackends.end(), o.attention_backend) ==
      kAttentionBackends.end()) {
    reject("--attention_backend", o.attention_backend, "expected one of " + joined(kAttentionBackends, ", "));
  }
  if (o.use_fp8_text_encoder && o.gemm_quantization != GemmQuantization::Fp8) {
    throw UsageError("--use_fp8_text_encoder: needs --gemm_quantization fp8");
  }
  if (o.cache_config) {
    nlohmann::json config;
    try {
      config = nlohmann::json::parse(*o.cache_config);
    } catch (const nlohmann::json::parse_error& e) {
      reject("--cache_config", *o.cache_config, concat_message("not valid JSON (", e.what(), ")"));
    }
    if (!config.is_object()) reject("--cache_config", *o.cache_config, "must be a JSON object");
    if (o.cache_method == CacheMethod::None) reject("--cache_config", *o.cache_config, "needs --cache_method");
  }
}

// ---------------------------------------------------------------------------------------------
// Markdown.

std::string markdown_cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

CliCommand parse_command_line(int argc, const char* const* argv) {
  const std::vector<std::string> typed(argv + std::min(argc, 1), argv + argc);
  const std::vector<std::string> args = with_underscored_flags(typed);
  std::map<std::string, std::string> typed_spelling;
  for (size_t i = 0; i < args.size(); ++i) typed_spelling.emplace(flag_name(args[i]), flag_name(typed[i]));

  CliCommand command;
  CLI::App app{std::string(kDescription), "xdit"};
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.get_formatter()->column_width(44);
  app.footer(help_footer());
  app.set_help_flag();  // re-added below so it is listed last, with --version

  std::vector<FlagInfo> infos;
  add_run_flags(app, command.options, infos);
  bool show_version = false;
  bool show_markdown = false;
  app.set_help_flag("-h,--help", "Print this help and exit")->group("Our own");
  app.add_flag("--version", show_version, "Print the version and exit")->group("Our own");
  app.add_flag("--help_markdown", show_markdown, "Print the flag reference in Markdown")->group("");

  CLI::App* info = app.add_subcommand("info", "Describe a diffusers model folder and exit");
  info->add_option("folder", command.info_path, "The diffusers folder (holding model_index.json)")->required();
  CLI::App* serve = app.add_subcommand("serve", "HTTP server [not supported yet]");
  serve->allow_extras();

  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    command.kind = CliCommand::Kind::Help;
    command.text = app.help();
    return command;
  } catch (const CLI::ExtrasError&) {
    throw UsageError(unexpected_arguments_message(app.remaining(true), typed_spelling));
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }

  if (show_version) {
    command.kind = CliCommand::Kind::Version;
    command.text = concat_message("xdit ", XDIT_VERSION, "\n");
  } else if (show_markdown) {
    command.kind = CliCommand::Kind::Help;
    command.text = cli_reference_markdown();
  } else if (serve->parsed()) {
    throw NotSupported("xdit serve");
  } else if (info->parsed()) {
    command.kind = CliCommand::Kind::Info;
  } else {
    validate_run_options(command.options);
  }
  return command;
}

RunOptions parse_run_options(int argc, const char* const* argv) {
  CliCommand command = parse_command_line(argc, argv);
  if (command.kind != CliCommand::Kind::Generate) {
    throw UsageError("expected a generation command line (flags only, no subcommand, --help or --version)");
  }
  return std::move(command.options);
}

void validate_run_options(const RunOptions& options) {
  check_inputs(options);
  check_parallel_layout(options);
  check_kernels_and_cache(options);
  check_vae_tiles(options);
}

std::vector<std::string> model_specific_flags() {
  std::vector<std::string> names;
  for (const ModelSpecificFlag& flag : model_specific_uses()) names.emplace_back(flag.flag);
  return names;
}

void validate_for_pipeline(const RunOptions& options, const PipelineSpec& spec) {
  const int multiple = spec.spatial_multiple;
  const auto check = [&](std::string_view flag, const std::optional<int>& value) {
    if (value && *value % multiple != 0) {
      reject(flag, *value, concat_message("must be a multiple of ", multiple, " for ", spec.pipeline_class));
    }
  };
  check("--height", options.height);
  check("--width", options.width);
  for (const ModelSpecificFlag& use : model_specific_uses()) {
    if (!use.given(options)) continue;
    if (std::find(spec.model_flags.begin(), spec.model_flags.end(), use.flag) == spec.model_flags.end()) {
      throw UsageError(concat_message(use.flag, ": ", spec.pipeline_class, " does not take this flag"));
    }
  }
}

void reject_unsupported(const RunOptions& options) {
  for (const UnsupportedUse& use : unsupported_uses()) {
    const std::optional<std::string> value = use.requested(options);
    if (!value) continue;
    throw NotSupported(value->empty() ? std::string(use.flag) : concat_message(use.flag, " ", *value));
  }
}

std::vector<FlagInfo> flag_reference() {
  CLI::App app;
  RunOptions options;
  std::vector<FlagInfo> infos;
  add_run_flags(app, options, infos);
  return infos;
}

std::vector<std::string> all_flag_names() {
  std::vector<std::string> names;
  for (const FlagInfo& flag : flag_reference()) names.push_back(flag.name);
  return names;
}

std::vector<std::string> attention_backend_names() { return kAttentionBackends; }

std::string cli_reference_markdown() {
  std::ostringstream md;
  md << "# The xdit command line\n\n"
     << "<!-- Generated by `xdit --help-markdown`; tests/unit/test_cli.cpp checks that this file matches it. -->\n\n"
     << "```\n"
     << "xdit [flags]                 generate images or videos\n"
     << "xdit info <diffusers folder> describe a model folder\n"
     << "xdit --help | --version\n"
     << "```\n\n"
     << "The flags follow the xDiT runner. Every flag is accepted with underscores (`--num_inference_steps`, "
     << "as xDiT spells it) and with dashes (`--num-inference-steps`), as `--flag value` or `--flag=value`. "
     << "Given twice, a flag keeps its last value, except the list flags (`TEXT ...`, `INT ...`), which "
     << "collect every value. Unknown flags are errors. A flag whose status is \"not supported yet\" is "
     << "recognised and rejected when it asks for that behaviour; it is never silently ignored.\n\n"
     << "The pipeline is chosen by the `_class_name` in the model folder's `model_index.json` (`xdit info` shows "
     << "it). A class that no model family registers is rejected as not supported yet, and height and width must "
     << "be multiples of the pipeline's spatial multiple.\n";

  std::string group;
  for (const FlagInfo& flag : flag_reference()) {
    if (flag.group != group) {
      group = flag.group;
      md << "\n## " << group << "\n\n"
         << "| Flag | Value | Default | Meaning | Status |\n"
         << "|---|---|---|---|---|\n";
    }
    md << "| `" << flag.name << "` | " << markdown_cell(flag.value) << " | " << markdown_cell(flag.default_value)
       << " | " << markdown_cell(flag.meaning) << " | " << flag.status << " |\n";
  }

  md << "\n## Exit codes\n\n"
     << "Errors are printed as one line on stderr, `xdit: error: <what is wrong>`.\n\n"
     << "| Code | Meaning |\n"
     << "|---|---|\n"
     << "| " << kExitSuccess << " | success |\n"
     << "| " << kExitRuntimeError << " | runtime error: a file is missing or unreadable, a model fails to load |\n"
     << "| " << kExitUsageError
     << " | usage error: unknown flag, bad value, flags that contradict each other or the model |\n"
     << "| " << kExitNotSupported << " | the command line is valid but asks for something not supported yet |\n";
  return md.str();
}

int exit_code_for(const std::exception& error) {
  if (dynamic_cast<const NotSupported*>(&error)) return kExitNotSupported;
  if (dynamic_cast<const UsageError*>(&error)) return kExitUsageError;
  return kExitRuntimeError;
}

}  // namespace xdit
