// The command line contract (DESIGN.md section 1): spellings, validation, "not supported yet",
// help and docs, the pipeline registry and the xdit binary's error reporting.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "support/files.h"
#include "support/reference.h"
#include "xdit/runtime/pipeline_registry.h"
#include "xdit/runtime/run_options.h"

namespace fs = std::filesystem;
using xdit::CliCommand;
using xdit::RunOptions;
using xdit::testing::expect_error;
using xdit::testing::expect_one_error_line;
using xdit::testing::ProcessResult;
using xdit::testing::read_text;
using xdit::testing::run_xdit;
using xdit::testing::scratch_folder;
using xdit::testing::write_text;

namespace {

using Words = std::vector<std::string>;

CliCommand parse(const Words& words) {
  std::vector<const char*> argv = {"xdit"};
  for (const std::string& word : words) argv.push_back(word.c_str());
  return xdit::parse_command_line(static_cast<int>(argv.size()), argv.data());
}

RunOptions options_of(const Words& words) {
  std::vector<const char*> argv = {"xdit"};
  for (const std::string& word : words) argv.push_back(word.c_str());
  return xdit::parse_run_options(static_cast<int>(argv.size()), argv.data());
}

// The same command line with every long flag spelled with dashes, as xDiT also accepts.
Words dashed(Words words) {
  for (std::string& word : words) {
    if (!word.starts_with("--")) continue;
    const size_t name_end = std::min(word.find('='), word.size());
    std::replace(word.begin() + 2, word.begin() + static_cast<std::ptrdiff_t>(name_end), '_', '-');
  }
  return words;
}

std::string joined(const Words& words) {
  std::string out;
  for (const std::string& word : words) out += word + " ";
  return out;
}

// ------------------------------------------------------------------------------------------------
// Parsing.

TEST(CliParse, DefaultsFollowXdit) {
  const RunOptions o = options_of({});
  EXPECT_FALSE(o.model);
  EXPECT_TRUE(o.prompts.empty());
  EXPECT_FALSE(o.height);
  EXPECT_FALSE(o.width);
  EXPECT_FALSE(o.num_inference_steps);
  EXPECT_FALSE(o.max_sequence_length);
  EXPECT_EQ(o.seed, 42u);
  EXPECT_EQ(o.output_directory, ".");
  EXPECT_EQ(o.batch_size, 1);
  EXPECT_EQ(o.num_iterations, 1);
  EXPECT_EQ(o.warmup_calls, 0);
  EXPECT_EQ(o.ulysses_degree, 1);
  EXPECT_EQ(o.ring_degree, 1);
  EXPECT_EQ(o.pipefusion_parallel_degree, 1);
  EXPECT_EQ(o.data_parallel_degree, 1);
  EXPECT_EQ(o.fully_shard_degree, 1);
  EXPECT_EQ(o.gemm_quantization, xdit::GemmQuantization::None);
  EXPECT_EQ(o.attention_backend, "auto");
  EXPECT_EQ(o.cache_method, xdit::CacheMethod::None);
  EXPECT_EQ(o.device, xdit::DeviceType::CPU);
  EXPECT_EQ(o.dtype, xdit::DType::BF16);
  EXPECT_EQ(o.rng, xdit::NoiseRng::TorchCpu);
  EXPECT_FALSE(o.output_name);
  EXPECT_FALSE(o.quiet);
  EXPECT_NO_THROW(xdit::reject_unsupported(o));
}

struct SpellingSample {
  Words words;
  std::function<bool(const RunOptions&)> holds;
};

TEST(CliParse, UnderscoresAndDashesForEveryGroup) {
  const std::vector<SpellingSample> samples = {
      {{"--model", "some/folder"}, [](const RunOptions& o) { return o.model == "some/folder"; }},
      {{"--negative_prompt", "blurry"}, [](const RunOptions& o) { return o.negative_prompts == Words{"blurry"}; }},
      {{"--num_inference_steps", "4"}, [](const RunOptions& o) { return o.num_inference_steps == 4; }},
      {{"--guidance_scale_2", "2.5"}, [](const RunOptions& o) { return o.guidance_scale_2 == 2.5; }},
      {{"--true_cfg_scale", "4"}, [](const RunOptions& o) { return o.true_cfg_scale == 4.0; }},
      {{"--flow_shift", "3"}, [](const RunOptions& o) { return o.flow_shift == 3.0; }},
      {{"--max_sequence_length", "512"}, [](const RunOptions& o) { return o.max_sequence_length == 512; }},
      {{"--output_directory", "out/"}, [](const RunOptions& o) { return o.output_directory == "out/"; }},
      {{"--batch_size", "2"}, [](const RunOptions& o) { return o.batch_size == 2; }},
      {{"--dataset_path", "p.csv"}, [](const RunOptions& o) { return o.dataset_path == "p.csv"; }},
      {{"--num_iterations", "5"}, [](const RunOptions& o) { return o.num_iterations == 5; }},
      {{"--warmup_calls", "2"}, [](const RunOptions& o) { return o.warmup_calls == 2; }},
      {{"--ulysses_degree", "2"}, [](const RunOptions& o) { return o.ulysses_degree == 2; }},
      {{"--use_cfg_parallel"}, [](const RunOptions& o) { return o.use_cfg_parallel; }},
      {{"--pipefusion_parallel_degree", "2", "--attn_layer_num_for_pp", "3", "5"},
       [](const RunOptions& o) { return o.attn_layer_num_for_pp == std::vector<int>{3, 5}; }},
      {{"--fully_shard_degree", "2", "--memory_efficient_sharding", "--fully_shard_components", "text_encoder"},
       [](const RunOptions& o) {
         return o.memory_efficient_sharding && o.fully_shard_components == Words{"text_encoder"};
       }},
      {{"--use_fp8_comms"}, [](const RunOptions& o) { return o.use_fp8_comms; }},
      {{"--gemm_quantization", "fp8", "--use_fp8_text_encoder"},
       [](const RunOptions& o) {
         return o.gemm_quantization == xdit::GemmQuantization::Fp8 && o.use_fp8_text_encoder;
       }},
      {{"--attention_backend", "flash_3"}, [](const RunOptions& o) { return o.attention_backend == "flash_3"; }},
      {{"--use_torch_compile"}, [](const RunOptions& o) { return o.use_torch_compile; }},
      {{"--cache_method", "dbcache", "--cache_config", R"({"Fn_compute_blocks": 2})"},
       [](const RunOptions& o) { return o.cache_method == xdit::CacheMethod::DbCache && o.cache_config; }},
      {{"--enable_tiling", "--vae_tile_size_height", "352", "--vae_tile_size_width", "2048",
        "--vae_tile_overlap_height", "88", "--vae_tile_overlap_width", "0"},
       [](const RunOptions& o) {
         return o.enable_tiling && o.vae_tile_size_height == 352 && o.vae_tile_size_width == 2048 &&
                o.vae_tile_overlap_height == 88 && o.vae_tile_overlap_width == 0;
       }},
      {{"--use_parallel_vae"}, [](const RunOptions& o) { return o.use_parallel_vae; }},
      {{"--enable_model_cpu_offload"}, [](const RunOptions& o) { return o.enable_model_cpu_offload; }},
      {{"--enable_group_cpu_offload"}, [](const RunOptions& o) { return o.enable_group_cpu_offload; }},
      {{"--enable_sequential_cpu_offload"}, [](const RunOptions& o) { return o.enable_sequential_cpu_offload; }},
      {{"--device", "cuda"}, [](const RunOptions& o) { return o.device == xdit::DeviceType::CUDA; }},
      {{"--dtype", "f32"}, [](const RunOptions& o) { return o.dtype == xdit::DType::F32; }},
      {{"--rng", "torch_cuda"}, [](const RunOptions& o) { return o.rng == xdit::NoiseRng::TorchCuda; }},
      {{"--output_name", "sunset"}, [](const RunOptions& o) { return o.output_name == "sunset"; }},
  };
  for (const SpellingSample& sample : samples) {
    for (const Words& words : {sample.words, dashed(sample.words)}) {
      SCOPED_TRACE(joined(words));
      EXPECT_TRUE(sample.holds(options_of(words)));
    }
  }
}

TEST(CliParse, FlagEqualsValue) {
  const RunOptions o = options_of({"--height=1024", "--num-inference-steps=4", "--seed=7", "--prompt=a cat",
                                   "--guidance_scale=1.0", "--gemm-quantization=none", "--cache_config={\"a\":1}",
                                   "--cache_method=fbcache"});
  EXPECT_EQ(o.height, 1024);
  EXPECT_EQ(o.num_inference_steps, 4);
  EXPECT_EQ(o.seed, 7u);
  EXPECT_EQ(o.prompts, Words{"a cat"});
  EXPECT_EQ(o.guidance_scale, 1.0);
  EXPECT_EQ(o.cache_config, "{\"a\":1}");
}

TEST(CliParse, SeveralPromptsMakeABatch) {
  EXPECT_EQ(options_of({"--prompt", "a cat", "a dog"}).prompts, (Words{"a cat", "a dog"}));
  EXPECT_EQ(options_of({"--prompt", "a cat", "--prompt", "a dog"}).prompts, (Words{"a cat", "a dog"}));
  const RunOptions o = options_of({"--prompt", "a", "b", "--negative_prompt", "x", "y", "--height", "64"});
  EXPECT_EQ(o.negative_prompts, (Words{"x", "y"}));
  EXPECT_EQ(o.height, 64);
}

TEST(CliParse, ValuesMayLookLikeOptionsOrSubcommands) {
  EXPECT_EQ(options_of({"--prompt", "info"}).prompts, Words{"info"});
  EXPECT_EQ(options_of({"--flow_shift", "-1e-3", "--flow_shift", "2"}).flow_shift, 2.0);
}

TEST(CliParse, RepeatedFlagKeepsTheLastValue) {
  EXPECT_EQ(options_of({"--height", "64", "--height", "128"}).height, 128);
  EXPECT_EQ(options_of({"--seed", "1", "--seed=2"}).seed, 2u);
  EXPECT_EQ(options_of({"--dtype", "f32", "--dtype", "bf16"}).dtype, xdit::DType::BF16);
  EXPECT_TRUE(options_of({"--quiet", "--quiet"}).quiet);
}

TEST(CliParse, SeedsCoverTorchsRange) {
  EXPECT_EQ(options_of({"--seed", "18446744073709551615"}).seed, UINT64_MAX);
  EXPECT_EQ(options_of({"--seed", "-1"}).seed, UINT64_MAX) << "torch wraps negative seeds";
  EXPECT_EQ(options_of({"--seed=-9223372036854775808"}).seed, uint64_t{1} << 63);
  for (const char* bad : {"18446744073709551616", "-9223372036854775809", "1.5", "0x10", "seven"}) {
    expect_error<xdit::UsageError>([&] { parse({"--seed", bad}); }, {std::string("--seed ") + bad});
  }
}

TEST(CliParse, UnknownFlagIsNamedAsTyped) {
  expect_error<xdit::UsageError>([] { parse({"--no_such_flag", "3"}); }, {"unknown flag --no_such_flag"});
  expect_error<xdit::UsageError>([] { parse({"--height", "64", "--no-such-flag"}); },
                                 {"unknown flag --no-such-flag"});
  expect_error<xdit::UsageError>([] { parse({"--no-such=3"}); }, {"unknown flag --no-such"});
  expect_error<xdit::UsageError>([] { parse({"stray"}); }, {"unexpected argument stray"});
}

TEST(CliParse, BadValuesNameTheFlag) {
  expect_error<xdit::UsageError>([] { parse({"--height", "tall"}); }, {"--height", "tall"});
  expect_error<xdit::UsageError>([] { parse({"--guidance_scale", "x"}); }, {"--guidance_scale", "x"});
  expect_error<xdit::UsageError>([] { parse({"--height"}); }, {"--height"});
}

TEST(CliParse, EnumeratedValuesListTheAllowedOnes) {
  expect_error<xdit::UsageError>([] { parse({"--gemm_quantization", "int8"}); },
                                 {"--gemm_quantization int8", "none, fp8"});
  expect_error<xdit::UsageError>([] { parse({"--device", "tpu"}); }, {"--device tpu", "cpu, cuda"});
  expect_error<xdit::UsageError>([] { parse({"--dtype", "f16"}); }, {"--dtype f16", "bf16, f32"});
  expect_error<xdit::UsageError>([] { parse({"--rng", "philox"}); }, {"--rng philox", "torch_cpu, torch_cuda"});
  expect_error<xdit::UsageError>([] { parse({"--cache_method", "easycache"}); },
                                 {"--cache_method easycache", "teacache, fbcache, dbcache"});
  std::string backends;
  for (const std::string& name : xdit::attention_backend_names()) backends += (backends.empty() ? "" : ", ") + name;
  expect_error<xdit::UsageError>([] { parse({"--attention_backend", "magic"}); },
                                 {"--attention_backend magic", backends});
  EXPECT_NE(backends.find("aiter_flydsl_fp8"), std::string::npos);
}

// ------------------------------------------------------------------------------------------------
// Validation: each rule fails with a message naming the flag and the value at fault.

struct Invalid {
  Words words;
  Words fragments;
};

TEST(CliValidation, EachRuleNamesTheFlagAndValue) {
  const std::vector<Invalid> cases = {
      {{"--ulysses_degree", "0"}, {"--ulysses_degree 0", "at least 1"}},
      {{"--ring_degree", "-2"}, {"--ring_degree -2", "at least 1"}},
      {{"--pipefusion_parallel_degree", "0"}, {"--pipefusion_parallel_degree 0"}},
      {{"--data_parallel_degree", "0"}, {"--data_parallel_degree 0"}},
      {{"--fully_shard_degree", "0"}, {"--fully_shard_degree 0"}},
      {{"--num_pipeline_patch", "0"}, {"--num_pipeline_patch 0"}},
      {{"--attn_layer_num_for_pp", "0"}, {"--attn_layer_num_for_pp 0"}},
      {{"--attn_layer_num_for_pp", "4", "4"}, {"--attn_layer_num_for_pp", "--pipefusion_parallel_degree 1"}},
      {{"--num_inference_steps", "0"}, {"--num_inference_steps 0"}},
      {{"--height", "0"}, {"--height 0"}},
      {{"--width", "-16"}, {"--width -16"}},
      {{"--num_frames", "0"}, {"--num_frames 0"}},
      {{"--batch_size", "0"}, {"--batch_size 0"}},
      {{"--num_iterations", "0"}, {"--num_iterations 0"}},
      {{"--warmup_calls", "-1"}, {"--warmup_calls -1"}},
      {{"--max_sequence_length", "0"}, {"--max_sequence_length 0"}},
      {{"--guidance_scale", "nan"}, {"--guidance_scale nan", "finite"}},
      {{"--guidance_scale_2", "inf"}, {"--guidance_scale_2 inf", "finite"}},
      {{"--true_cfg_scale", "nan"}, {"--true_cfg_scale nan"}},
      {{"--flow_shift", "0"}, {"--flow_shift 0"}},
      {{"--prompt", "a", "b", "c", "--negative_prompt", "x", "y"}, {"--negative_prompt", "2 values for 3 prompts"}},
      {{"--output_name", "a/b"}, {"--output_name \"a/b\""}},
      {{"--enable_tiling", "--vae_tile_size_height", "352"}, {"--vae_tile_size_height 352", "--vae_tile_size_width"}},
      {{"--enable_tiling", "--vae_tile_size_width", "352"}, {"--vae_tile_size_width 352", "--vae_tile_size_height"}},
      {{"--enable_tiling", "--vae_tile_overlap_height", "8"},
       {"--vae_tile_overlap_height 8", "--vae_tile_overlap_width"}},
      {{"--enable_tiling", "--vae_tile_overlap_width", "8"},
       {"--vae_tile_overlap_width 8", "--vae_tile_overlap_height"}},
      {{"--vae_tile_size_height", "352", "--vae_tile_size_width", "2048"},
       {"--vae_tile_size_height 352", "--enable_tiling"}},
      {{"--vae_tile_overlap_height", "8", "--vae_tile_overlap_width", "8"},
       {"--vae_tile_overlap_height 8", "--enable_tiling"}},
      {{"--enable_tiling", "--vae_tile_size_height", "64", "--vae_tile_size_width", "64", "--vae_tile_overlap_height",
        "64", "--vae_tile_overlap_width", "0"},
       {"--vae_tile_overlap_height 64", "less than --vae_tile_size_height 64"}},
      {{"--enable_tiling", "--vae_tile_size_height", "64", "--vae_tile_size_width", "64", "--vae_tile_overlap_height",
        "0", "--vae_tile_overlap_width", "80"},
       {"--vae_tile_overlap_width 80", "less than --vae_tile_size_width 64"}},
      {{"--enable_tiling", "--vae_tile_size_height", "0", "--vae_tile_size_width", "64"},
       {"--vae_tile_size_height 0"}},
      {{"--use_fp8_text_encoder"}, {"--use_fp8_text_encoder", "--gemm_quantization fp8"}},
      {{"--cache_method", "fbcache", "--cache_config", "{bad"}, {"--cache_config {bad", "not valid JSON"}},
      {{"--cache_method", "fbcache", "--cache_config", "[1, 2]"}, {"--cache_config [1, 2]", "JSON object"}},
      {{"--cache_config", "{}"}, {"--cache_config {}", "--cache_method"}},
      {{"--memory_efficient_sharding"}, {"--memory_efficient_sharding", "--fully_shard_degree"}},
      {{"--fully_shard_components", "text_encoder"}, {"--fully_shard_components text_encoder"}},
      {{"--pipefusion_parallel_degree", "2", "--use_fp8_comms"}, {"--use_fp8_comms", "--pipefusion_parallel_degree"}},
  };
  for (const Invalid& invalid : cases) {
    for (const Words& words : {invalid.words, dashed(invalid.words)}) {
      SCOPED_TRACE(joined(words));
      expect_error<xdit::UsageError>([&] { parse(words); }, invalid.fragments);
    }
  }
}

TEST(CliValidation, ValidLayoutsPass) {
  EXPECT_NO_THROW(options_of({"--model", "m", "--prompt", "A spectacular sunset over the ocean", "--seed", "42",
                              "--height", "2048", "--width", "2048", "--num_inference_steps", "4",
                              "--guidance_scale", "1.0", "--gemm_quantization", "fp8", "--use_fp8_text_encoder",
                              "--enable_tiling", "--output_directory", "out/"}));
  EXPECT_NO_THROW(options_of({"--ulysses_degree", "2", "--use_fp8_comms", "--memory_efficient_replicated_load",
                              "--use_parallel_vae", "--enable_tiling", "--vae_tile_size_height", "352",
                              "--vae_tile_size_width", "2048", "--vae_tile_overlap_height", "88",
                              "--vae_tile_overlap_width", "0"}));
  EXPECT_NO_THROW(options_of({"--prompt", "a", "b", "--negative_prompt", "x"}));
}

// ------------------------------------------------------------------------------------------------
// Known but not built yet: rejected, never ignored.

TEST(CliNotSupported, NamesTheFlag) {
  const std::vector<Invalid> cases = {
      {{"--ulysses_degree", "2"}, {"--ulysses_degree 2: not supported yet"}},
      {{"--ring_degree", "2"}, {"--ring_degree 2: not supported yet"}},
      {{"--use_cfg_parallel"}, {"--use_cfg_parallel: not supported yet"}},
      {{"--pipefusion_parallel_degree", "2"}, {"--pipefusion_parallel_degree 2: not supported yet"}},
      {{"--num_pipeline_patch", "4"}, {"--num_pipeline_patch 4: not supported yet"}},
      {{"--attn_layer_num_for_pp", "8"}, {"--attn_layer_num_for_pp 8: not supported yet"}},
      {{"--data_parallel_degree", "2"}, {"--data_parallel_degree 2: not supported yet"}},
      {{"--fully_shard_degree", "2"}, {"--fully_shard_degree 2: not supported yet"}},
      {{"--memory_efficient_replicated_load"}, {"--memory_efficient_replicated_load: not supported yet"}},
      {{"--use_fp8_comms"}, {"--use_fp8_comms: not supported yet"}},
      {{"--attention_backend", "sdpa"}, {"--attention_backend sdpa: not supported yet"}},
      {{"--use_torch_compile"}, {"--use_torch_compile: not supported yet"}},
      {{"--cache_method", "teacache"}, {"--cache_method teacache: not supported yet"}},
      {{"--enable_tiling"}, {"--enable_tiling: not supported yet"}},
      {{"--use_parallel_vae"}, {"--use_parallel_vae: not supported yet"}},
      {{"--enable_model_cpu_offload"}, {"--enable_model_cpu_offload: not supported yet"}},
      {{"--enable_group_cpu_offload"}, {"--enable_group_cpu_offload: not supported yet"}},
      {{"--enable_sequential_cpu_offload"}, {"--enable_sequential_cpu_offload: not supported yet"}},
      {{"--device", "cuda"}, {"--device cuda: not supported yet"}},
      {{"--rng", "torch_cuda"}, {"--rng torch_cuda: not supported yet"}},
      {{"--dataset_path", "prompts.csv"}, {"--dataset_path prompts.csv: not supported yet"}},
  };
  for (const Invalid& invalid : cases) {
    SCOPED_TRACE(joined(invalid.words));
    const RunOptions options = options_of(invalid.words);
    expect_error<xdit::NotSupported>([&] { xdit::reject_unsupported(options); }, invalid.fragments);
  }
  RunOptions fsdp;
  fsdp.fully_shard_components = {"text_encoder"};
  expect_error<xdit::NotSupported>([&] { xdit::reject_unsupported(fsdp); },
                                   {"--fully_shard_components text_encoder: not supported yet"});
  RunOptions sharding;
  sharding.memory_efficient_sharding = true;
  expect_error<xdit::NotSupported>([&] { xdit::reject_unsupported(sharding); },
                                   {"--memory_efficient_sharding: not supported yet"});
}

TEST(CliNotSupported, PlainRequestsPass) {
  EXPECT_NO_THROW(xdit::reject_unsupported(options_of({"--model", "m", "--prompt", "a", "--height", "512",
                                                       "--num_inference_steps", "4", "--dtype", "f32", "--seed", "3",
                                                       "--num_iterations", "3", "--warmup_calls", "1", "--quiet",
                                                       "--attention_backend", "auto", "--device", "cpu",
                                                       "--gemm_quantization", "fp8", "--use_fp8_text_encoder"})));
}

// ------------------------------------------------------------------------------------------------
// Help, version, subcommands and the generated docs.

const Words kGroups = {"Input and output", "Benchmarking", "Parallelism", "Precision and kernels",
                       "Caching",          "VAE",          "Offload",     "Our own"};

// DESIGN.md section 1, the flag set.
const Words kContractFlags = {
    "--model", "--prompt", "--negative_prompt", "--height", "--width", "--num_frames", "--num_inference_steps",
    "--guidance_scale", "--guidance_scale_2", "--true_cfg_scale", "--flow_shift", "--max_sequence_length", "--seed",
    "--output_directory", "--batch_size", "--dataset_path", "--num_iterations", "--warmup_calls", "--ulysses_degree",
    "--ring_degree", "--use_cfg_parallel", "--pipefusion_parallel_degree", "--num_pipeline_patch",
    "--attn_layer_num_for_pp", "--data_parallel_degree", "--fully_shard_degree", "--fully_shard_components",
    "--memory_efficient_sharding", "--memory_efficient_replicated_load", "--use_fp8_comms", "--gemm_quantization",
    "--use_fp8_text_encoder", "--attention_backend", "--use_torch_compile", "--cache_method", "--cache_config",
    "--enable_tiling", "--use_parallel_vae", "--vae_tile_size_height", "--vae_tile_size_width",
    "--vae_tile_overlap_height", "--vae_tile_overlap_width", "--enable_model_cpu_offload",
    "--enable_group_cpu_offload", "--enable_sequential_cpu_offload", "--device", "--dtype", "--rng", "--output_name",
    "--quiet",
    // Ours beyond DESIGN.md section 1: diffusers pipeline arguments of the same names (FLUX.2, Z-Image).
    "--text_encoder_out_layers", "--cfg_normalization", "--cfg_truncation"};

TEST(CliHelp, FlagSetIsTheContract) {
  const Words names = xdit::all_flag_names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()),
            std::set<std::string>(kContractFlags.begin(), kContractFlags.end()));
  EXPECT_EQ(names.size(), kContractFlags.size()) << "a flag is defined twice";
}

TEST(CliHelp, ListsEveryGroupAndFlag) {
  for (const Words& words : {Words{"--help"}, Words{"-h"}, Words{"--height", "64", "--help"}}) {
    const CliCommand command = parse(words);
    ASSERT_EQ(command.kind, CliCommand::Kind::Help);
    for (const std::string& group : kGroups) EXPECT_NE(command.text.find(group + ":"), std::string::npos) << group;
    for (const std::string& flag : xdit::all_flag_names()) EXPECT_NE(command.text.find(flag), std::string::npos) << flag;
    EXPECT_NE(command.text.find("--version"), std::string::npos);
    EXPECT_NE(command.text.find("info"), std::string::npos);
    EXPECT_EQ(command.text.find("--help_markdown"), std::string::npos) << "the docs flag is hidden";
  }
}

TEST(CliHelp, MarksWhatIsNotSupportedYet) {
  for (const xdit::FlagInfo& flag : xdit::flag_reference()) {
    SCOPED_TRACE(flag.name);
    EXPECT_NE(std::find(kGroups.begin(), kGroups.end(), flag.group), kGroups.end());
    EXPECT_FALSE(flag.meaning.empty());
    EXPECT_TRUE(flag.status == "supported" || flag.status.starts_with("not supported yet")) << flag.status;
  }
  const std::string help = parse({"--help"}).text;
  EXPECT_NE(help.find("[not supported yet: values above 1]"), std::string::npos);
}

TEST(CliHelp, Version) {
  for (const Words& words : {Words{"--version"}, Words{"--version", "--height", "64"}}) {
    const CliCommand command = parse(words);
    EXPECT_EQ(command.kind, CliCommand::Kind::Version);
    EXPECT_EQ(command.text, std::string("xdit ") + XDIT_VERSION + "\n");
  }
}

TEST(CliSubcommands, Info) {
  const CliCommand command = parse({"info", "models/shapes-demo"});
  EXPECT_EQ(command.kind, CliCommand::Kind::Info);
  EXPECT_EQ(command.info_path, "models/shapes-demo");
  expect_error<xdit::UsageError>([] { parse({"info"}); }, {"folder"});
  expect_error<xdit::UsageError>([] { parse({"info", "a", "b"}); }, {"unexpected argument b"});
  EXPECT_EQ(parse({"info", "--help"}).kind, CliCommand::Kind::Help);
}

TEST(CliSubcommands, ServeIsNotSupportedYet) {
  expect_error<xdit::NotSupported>([] { parse({"serve", "--model", "m", "--port", "8000"}); },
                                   {"xdit serve: not supported yet"});
}

TEST(CliSubcommands, ParseRunOptionsWantsAGenerationCommand) {
  expect_error<xdit::UsageError>([] { options_of({"info", "x"}); }, {"generation command"});
  expect_error<xdit::UsageError>([] { options_of({"--help"}); }, {"generation command"});
}

TEST(CliDocs, DocsFileIsTheGeneratedReference) {
  const CliCommand command = parse({"--help-markdown"});
  ASSERT_EQ(command.kind, CliCommand::Kind::Help);
  EXPECT_EQ(command.text, xdit::cli_reference_markdown());
  EXPECT_EQ(read_text(fs::path(XDIT_SOURCE_DIR) / "docs" / "cli.md"), command.text)
      << "docs/cli.md is stale: regenerate it with `xdit --help-markdown > docs/cli.md`";
  for (const std::string& flag : xdit::all_flag_names()) {
    EXPECT_NE(command.text.find("`" + flag + "`"), std::string::npos) << flag;
  }
  for (const std::string& group : kGroups) EXPECT_NE(command.text.find("## " + group + "\n"), std::string::npos);
}

TEST(CliExitCodes, OneCodePerOutcome) {
  EXPECT_EQ(xdit::exit_code_for(xdit::NotSupported("x")), xdit::kExitNotSupported);
  EXPECT_EQ(xdit::exit_code_for(xdit::UsageError("x")), xdit::kExitUsageError);
  EXPECT_EQ(xdit::exit_code_for(xdit::Error("x")), xdit::kExitRuntimeError);
  EXPECT_EQ(xdit::exit_code_for(std::runtime_error("x")), xdit::kExitRuntimeError);
}

// ------------------------------------------------------------------------------------------------
// The pipeline registry and run_generation.

constexpr const char* kTestPipeline = "XditCliTestPipeline";

class PipelineRegistryTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    xdit::register_pipeline({kTestPipeline, 16, [](const RunOptions& options) { runs().push_back(options); },
                             {"--guidance_scale", "--negative_prompt"}});
  }
  void SetUp() override { runs().clear(); }

  static std::vector<RunOptions>& runs() {
    static std::vector<RunOptions> calls;
    return calls;
  }

  // A model folder whose model_index.json holds `index` (none when empty).
  static std::string model_folder(const std::string& name, const std::string& index) {
    const fs::path folder = scratch_folder(name);
    if (!index.empty()) write_text(folder / "model_index.json", index);
    return folder.string();
  }

  static std::string index_for(const std::string& pipeline_class) {
    return R"({"_class_name": ")" + pipeline_class + R"(", "_diffusers_version": "0.36.0"})";
  }
};

TEST_F(PipelineRegistryTest, FindsRegisteredClasses) {
  ASSERT_NE(xdit::find_pipeline(kTestPipeline), nullptr);
  EXPECT_EQ(xdit::find_pipeline(kTestPipeline)->spatial_multiple, 16);
  EXPECT_EQ(xdit::find_pipeline("NoSuchPipeline"), nullptr);
  const Words names = xdit::registered_pipelines();
  EXPECT_NE(std::find(names.begin(), names.end(), kTestPipeline), names.end());
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
}

TEST_F(PipelineRegistryTest, RejectsDuplicatesAndIncompleteSpecs) {
  expect_error<xdit::Error>([] { xdit::register_pipeline({kTestPipeline, 16, [](const RunOptions&) {}, {}}); },
                            {kTestPipeline, "registered twice"});
  expect_error<xdit::Error>([] { xdit::register_pipeline({"", 16, [](const RunOptions&) {}, {}}); }, {"empty"});
  expect_error<xdit::Error>([] { xdit::register_pipeline({"XditCliNoRun", 16, nullptr, {}}); }, {"no run function"});
  expect_error<xdit::Error>([] { xdit::register_pipeline({"XditCliZero", 0, [](const RunOptions&) {}, {}}); },
                            {"spatial_multiple 0"});
}

TEST_F(PipelineRegistryTest, HeightAndWidthFollowTheSpatialMultiple) {
  const std::string model = model_folder("spatial", index_for(kTestPipeline));
  expect_error<xdit::UsageError>(
      [&] { xdit::run_generation(options_of({"--model", model, "--height", "1000"})); },
      {"--height 1000", "multiple of 16", kTestPipeline});
  expect_error<xdit::UsageError>(
      [&] { xdit::run_generation(options_of({"--model", model, "--height", "1024", "--width", "1000"})); },
      {"--width 1000", "multiple of 16"});
  EXPECT_TRUE(runs().empty());

  xdit::run_generation(options_of({"--model", model, "--height", "1024", "--width", "512", "--prompt", "a cat"}));
  ASSERT_EQ(runs().size(), 1u);
  EXPECT_EQ(runs()[0].height, 1024);
  EXPECT_EQ(runs()[0].prompts, Words{"a cat"});
}

TEST_F(PipelineRegistryTest, ModelSpecificFlagsMustBeOnesThePipelineTakes) {
  const std::string model = model_folder("model_flags", index_for(kTestPipeline));
  for (const Words& flag : {Words{"--num_frames", "81"}, Words{"--true_cfg_scale", "4"},
                            Words{"--guidance_scale_2", "3"}, Words{"--flow_shift", "5"},
                            Words{"--text_encoder_out_layers", "1", "2"}, Words{"--cfg_normalization", "1"},
                            Words{"--cfg_truncation", "0.9"}}) {
    Words args = {"--model", model};
    args.insert(args.end(), flag.begin(), flag.end());
    expect_error<xdit::UsageError>([&] { xdit::run_generation(options_of(args)); },
                                   {flag[0] + ": " + kTestPipeline + " does not take this flag"});
  }
  EXPECT_TRUE(runs().empty());
  xdit::run_generation(
      options_of({"--model", model, "--guidance_scale", "5", "--negative_prompt", "blur", "--prompt", "a cat"}));
  ASSERT_EQ(runs().size(), 1u);
  EXPECT_EQ(runs()[0].guidance_scale, 5.0);

  expect_error<xdit::Error>(
      [] { xdit::register_pipeline({"XditCliBadFlags", 16, [](const RunOptions&) {}, {"--seed"}}); },
      {"XditCliBadFlags", "--seed", "not a model-specific flag"});
  EXPECT_EQ(xdit::model_specific_flags().size(), 9u);
}

TEST(CliFlags, TextEncoderOutLayersAreListed) {
  EXPECT_EQ(options_of({"--text_encoder_out_layers", "9", "18", "27"}).text_encoder_out_layers,
            (std::vector<int>{9, 18, 27}));
  expect_error<xdit::UsageError>([] { parse({"--text-encoder-out-layers", "-1"}); },
                                 {"--text_encoder_out_layers -1", "0 or above"});
  expect_error<xdit::UsageError>([] { parse({"--cfg-normalization", "-1"}); }, {"--cfg_normalization -1"});
  EXPECT_EQ(options_of({"--cfg_truncation", "0.9"}).cfg_truncation, 0.9);
}

TEST_F(PipelineRegistryTest, UnsupportedFlagsAreRejectedBeforeTheModelIsRead) {
  const std::string model = model_folder("unsupported", index_for(kTestPipeline));
  expect_error<xdit::NotSupported>([&] { xdit::run_generation(options_of({"--model", model, "--ulysses_degree", "2"})); },
                                   {"--ulysses_degree 2: not supported yet"});
  EXPECT_TRUE(runs().empty());
}

TEST_F(PipelineRegistryTest, WithoutModelTheDemoModelRuns) {
  const std::string demo = model_folder("demo_model", index_for(kTestPipeline));
  ASSERT_EQ(setenv("XDIT_DEMO_MODEL", demo.c_str(), 1), 0);
  xdit::run_generation(options_of({"--prompt", "a red circle"}));
  ASSERT_EQ(runs().size(), 1u);
  EXPECT_EQ(runs()[0].model, demo);

  const std::string empty = model_folder("no_demo_model", "");
  ASSERT_EQ(setenv("XDIT_DEMO_MODEL", empty.c_str(), 1), 0);
  expect_error<xdit::UsageError>([] { xdit::run_generation(options_of({"--prompt", "a red circle"})); },
                                 {"no --model given", empty, "XDIT_DEMO_MODEL"});
  ASSERT_EQ(unsetenv("XDIT_DEMO_MODEL"), 0);
  EXPECT_EQ(xdit::bundled_demo_model(), XDIT_SOURCE_DIR "/models/shapes-demo");
}

TEST_F(PipelineRegistryTest, ModelFolderErrors) {
  RunOptions hub;
  hub.model = "black-forest-labs/FLUX.2-klein-4B-not-a-folder";
  expect_error<xdit::NotSupported>([&] { xdit::run_generation(hub); },
                                   {"--model black-forest-labs/FLUX.2-klein-4B-not-a-folder", "Hub"});

  const auto run_in = [](const std::string& model) {
    RunOptions options;
    options.model = model;
    xdit::run_generation(options);
  };
  const std::string empty = model_folder("no_index", "");
  expect_error<xdit::Error>([&] { run_in(empty); }, {empty, "no model_index.json"});

  const std::string broken = model_folder("broken_index", "{\"_class_name\": ");
  expect_error<xdit::Error>([&] { run_in(broken); }, {broken + "/model_index.json", "invalid JSON"});

  const std::string no_class = model_folder("no_class", R"({"_diffusers_version": "0.36.0"})");
  expect_error<xdit::Error>([&] { run_in(no_class); }, {no_class + "/model_index.json", "_class_name"});

  const std::string number_class = model_folder("number_class", R"({"_class_name": 7})");
  expect_error<xdit::Error>([&] { run_in(number_class); }, {"_class_name", "must be a string"});

  const std::string unknown = model_folder("unknown_class", index_for("NoSuchPipeline"));
  expect_error<xdit::NotSupported>([&] { run_in(unknown); }, {"pipeline class NoSuchPipeline: not supported yet"});
  EXPECT_TRUE(runs().empty());
}

// ------------------------------------------------------------------------------------------------
// The xdit binary: one error line on stderr and the documented exit code.

TEST(CliBinary, BadFlagIsOneErrorLine) {
  expect_one_error_line(run_xdit("--no-such-flag 3"), xdit::kExitUsageError, "--no-such-flag");
  expect_one_error_line(run_xdit("--height 0"), xdit::kExitUsageError, "--height 0");
}

TEST(CliBinary, NotSupportedHasItsOwnCode) {
  expect_one_error_line(run_xdit("--ulysses-degree 2"), xdit::kExitNotSupported, "--ulysses_degree 2");
}

TEST(CliBinary, RuntimeErrorsExitWithOne) {
  const fs::path model = scratch_folder("binary_model");
  expect_one_error_line(run_xdit("--model " + model.string()), xdit::kExitRuntimeError, "model_index.json");
}

TEST(CliBinary, HelpAndVersionSucceed) {
  const ProcessResult version = run_xdit("--version");
  EXPECT_EQ(version.exit_code, xdit::kExitSuccess);
  EXPECT_EQ(version.out, std::string("xdit ") + XDIT_VERSION + "\n");
  EXPECT_TRUE(version.err.empty());
  const ProcessResult help = run_xdit("--help");
  EXPECT_EQ(help.exit_code, xdit::kExitSuccess);
  EXPECT_NE(help.out.find("Parallelism:"), std::string::npos);
}

}  // namespace
