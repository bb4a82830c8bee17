// RunOptions: the xdit command line (DESIGN.md section 1) as a struct, its parser and its checks.
// Flags are spelled as xDiT spells them; docs/cli.md is generated from the same definitions.
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "xdit/core/dtype.h"
#include "xdit/core/error.h"
#include "xdit/core/tensor.h"

namespace xdit {

struct PipelineSpec;

// A command line that cannot be right: unknown flag, bad value, flags that contradict each other.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& message) : Error(message) {}
};

enum class GemmQuantization { None, Fp8 };

// Which generator draws the initial noise: torch's CPU mt19937 or its CUDA Philox.
enum class NoiseRng { TorchCpu, TorchCuda };

enum class CacheMethod { None, TeaCache, FbCache, DbCache };

struct RunOptions {
  // Input and output. Unset optionals mean "the model's default".
  std::optional<std::string> model;  // local diffusers folder or Hub repo id; unset: the demo model
  std::vector<std::string> prompts;  // one image (or video) per prompt
  std::vector<std::string> negative_prompts;
  std::optional<int> height;
  std::optional<int> width;
  std::optional<int> num_frames;
  std::optional<int> num_inference_steps;
  std::optional<double> guidance_scale;
  std::optional<double> guidance_scale_2;
  std::optional<double> true_cfg_scale;
  std::optional<double> cfg_normalization;  // Z-Image: cap |guided| at this times |conditional|
  std::optional<double> cfg_truncation;     // Z-Image: no CFG once (1 - sigma) exceeds this
  std::optional<double> flow_shift;
  std::optional<int> max_sequence_length;
  std::vector<int> text_encoder_out_layers;  // hidden states the text encoder hands on; empty: the model's
  uint64_t seed = 42;
  std::string output_directory = ".";
  int batch_size = 1;
  std::optional<std::string> dataset_path;

  // Benchmarking.
  int num_iterations = 1;
  int warmup_calls = 0;

  // Parallelism.
  int ulysses_degree = 1;
  int ring_degree = 1;
  bool use_cfg_parallel = false;
  int pipefusion_parallel_degree = 1;
  std::optional<int> num_pipeline_patch;
  std::vector<int> attn_layer_num_for_pp;
  int data_parallel_degree = 1;
  int fully_shard_degree = 1;
  std::vector<std::string> fully_shard_components;
  bool memory_efficient_sharding = false;
  bool memory_efficient_replicated_load = false;
  bool use_fp8_comms = false;

  // Precision and kernels.
  GemmQuantization gemm_quantization = GemmQuantization::None;
  bool use_fp8_text_encoder = false;
  std::string attention_backend = "auto";
  bool use_torch_compile = false;  // here: the fused / graph-captured execution path

  // Caching.
  CacheMethod cache_method = CacheMethod::None;
  std::optional<std::string> cache_config;  // JSON object text, merged over the model's preset

  // VAE. Tile sizes and overlaps are in output pixels.
  bool enable_tiling = false;
  bool use_parallel_vae = false;
  std::optional<int> vae_tile_size_height;
  std::optional<int> vae_tile_size_width;
  std::optional<int> vae_tile_overlap_height;
  std::optional<int> vae_tile_overlap_width;

  // Offload.
  bool enable_model_cpu_offload = false;
  bool enable_group_cpu_offload = false;
  bool enable_sequential_cpu_offload = false;

  // Our own.
  DeviceType device = DeviceType::CPU;
  DType dtype = DType::BF16;
  NoiseRng rng = NoiseRng::TorchCpu;
  std::optional<std::string> output_name;  // file name stem of the outputs
  bool quiet = false;
};

// What the command line asks for. `text` is what Help and Version print.
struct CliCommand {
  enum class Kind { Generate, Info, Help, Version };
  Kind kind = Kind::Generate;
  RunOptions options;     // Generate
  std::string info_path;  // Info: the diffusers folder to describe
  std::string text;       // Help, Version
};

// argv as main receives it (argv[0] is the program). Accepts `--flag value` and `--flag=value`,
// with underscores or dashes. Throws UsageError for anything wrong with the command line, and
// NotSupported for subcommands that are planned but not built. Generate options are validated.
CliCommand parse_command_line(int argc, const char* const* argv);

// parse_command_line for a generation command line; any other command is a UsageError.
RunOptions parse_run_options(int argc, const char* const* argv);

// Checks ranges, pairs and combinations; throws UsageError naming the flag and the value at fault.
void validate_run_options(const RunOptions& options);

// Checks what depends on the model: the spatial multiple of height and width, and that every
// model-specific flag given is one the pipeline takes.
void validate_for_pipeline(const RunOptions& options, const PipelineSpec& spec);

// The flags only some models take (--num_frames, --true_cfg_scale, ...); a PipelineSpec lists the
// ones it takes, and the others are refused for it rather than silently ignored.
std::vector<std::string> model_specific_flags();

// Throws NotSupported naming the first flag whose requested behaviour is not built yet.
void reject_unsupported(const RunOptions& options);

// One flag of the command line, as --help and docs/cli.md describe it.
struct FlagInfo {
  std::string group;          // "Input and output", "Parallelism", ...
  std::string name;           // "--num_inference_steps"
  std::string value;          // "INT", "TEXT ...", "none|fp8"; empty for switches
  std::string default_value;  // "1", "model default", "off"
  std::string meaning;
  std::string status;         // "supported", "not supported yet", "not supported yet: cuda"
};

std::vector<FlagInfo> flag_reference();  // every RunOptions flag, in --help order
std::vector<std::string> all_flag_names();
std::vector<std::string> attention_backend_names();  // the values --attention_backend accepts

// The flag reference in Markdown: what docs/cli.md holds and `xdit --help-markdown` prints.
std::string cli_reference_markdown();

// The process exit status for each outcome; main maps exceptions with exit_code_for.
inline constexpr int kExitSuccess = 0;
inline constexpr int kExitRuntimeError = 1;
inline constexpr int kExitUsageError = 2;
inline constexpr int kExitNotSupported = 3;

int exit_code_for(const std::exception& error);

}  // namespace xdit
