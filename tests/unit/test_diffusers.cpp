// The diffusers layout (model_index.json, component folders, single / sharded / variant weights),
// typed JSON config access with the struct-filling pattern, and `xdit info`.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>

#include "support/files.h"
#include "support/reference.h"
#include "xdit/io/diffusers.h"
#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"
#include "xdit/runtime/model_info.h"

namespace fs = std::filesystem;
using namespace xdit;
namespace xt = xdit::testing;
using xt::error_of;
using xt::write_text;

namespace {

// A small pipeline: a transformer with a single bf16 file (and an fp16 variant beside it), a
// sharded text encoder, a VAE, and a tokenizer and scheduler without weights.
fs::path make_repo(const fs::path& root) {
  const fs::path repo = root / "tiny-pipe";
  write_text(repo / "model_index.json", R"({
    "_class_name": "Flux2KleinPipeline", "_diffusers_version": "0.36.0",
    "is_distilled": true, "safety_checker": [null, null], "feature_extractor": null,
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "Qwen3ForCausalLM"],
    "tokenizer": ["transformers", "Qwen2TokenizerFast"],
    "transformer": ["diffusers", "Flux2Transformer2DModel"],
    "vae": ["diffusers", "AutoencoderKLFlux2"]})");
  write_text(repo / "scheduler" / "scheduler_config.json", R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "shift": 3.0})");
  write_text(repo / "tokenizer" / "tokenizer.json", "{}");
  write_text(repo / "transformer" / "config.json", R"({"num_layers": 2, "attention_head_dim": 16})");
  write_safetensors((repo / "transformer" / "diffusion_pytorch_model.safetensors").string(),
                    {{"proj.weight", Tensor::zeros({1000, 1200}, DType::BF16)},
                     {"proj.bias", Tensor::zeros({1000}, DType::F32)}});
  write_safetensors((repo / "transformer" / "diffusion_pytorch_model.fp16.safetensors").string(),
                    {{"proj.weight", Tensor::zeros({1000, 1200}, DType::F16)}});
  write_text(repo / "text_encoder" / "config.json", R"({"hidden_size": 8})");
  write_safetensors((repo / "text_encoder" / "model-00001-of-00002.safetensors").string(),
                    {{"embed.weight", Tensor::zeros({10, 8}, DType::BF16)}});
  write_safetensors((repo / "text_encoder" / "model-00002-of-00002.safetensors").string(),
                    {{"norm.weight", Tensor::zeros({8}, DType::BF16)}});
  write_text(repo / "text_encoder" / "model.safetensors.index.json",
             R"({"metadata": {}, "weight_map": {"embed.weight": "model-00001-of-00002.safetensors",
                 "norm.weight": "model-00002-of-00002.safetensors"}})");
  write_text(repo / "vae" / "config.json", R"({"latent_channels": 32})");
  write_safetensors((repo / "vae" / "diffusion_pytorch_model.safetensors").string(),
                    {{"conv.weight", Tensor::zeros({4, 3, 3, 3}, DType::F32)}});
  return repo;
}

}  // namespace

TEST(diffusers, ReadsModelIndexAndComponents) {
  const fs::path tmp = xt::scratch_folder("diffusers_ReadsModelIndexAndComponents");
  const DiffusersRepo repo = DiffusersRepo::open(make_repo(tmp).string());
  EXPECT_EQ(repo.pipeline_class(), "Flux2KleinPipeline");
  EXPECT_EQ(repo.diffusers_version(), "0.36.0");
  std::vector<std::string> names;
  for (const ComponentSpec& c : repo.components()) names.push_back(c.name);
  EXPECT_EQ(names, (std::vector<std::string>{"scheduler", "text_encoder", "tokenizer", "transformer", "vae"}));
  EXPECT_FALSE(repo.has_component("safety_checker")) << "[null, null] means absent";
  EXPECT_FALSE(repo.has_component("feature_extractor")) << "null means absent";
  EXPECT_FALSE(repo.has_component("is_distilled")) << "flags are pipeline options, not components";
  EXPECT_EQ(repo.component("text_encoder").library, "transformers");
  EXPECT_EQ(repo.component("transformer").class_name, "Flux2Transformer2DModel");
  EXPECT_TRUE(repo.model_index().get_bool("is_distilled"));
  EXPECT_NE(error_of([&] { repo.component("unet"); }).find("\"unet\""), std::string::npos);
}

TEST(diffusers, ComponentConfigsAndFiles) {
  const fs::path tmp = xt::scratch_folder("diffusers_ComponentConfigsAndFiles");
  const DiffusersRepo repo = DiffusersRepo::open(make_repo(tmp).string());
  EXPECT_EQ(repo.component_config("transformer").get_int("num_layers"), 2);
  EXPECT_EQ(repo.component_config("scheduler").get_float("shift"), 3.0) << "falls back to scheduler_config.json";
  EXPECT_NE(repo.component_file("tokenizer", "tokenizer.json").find("tokenizer.json"), std::string::npos);
  EXPECT_NE(error_of([&] { repo.component_file("tokenizer", "vocab.txt"); }).find("vocab.txt"), std::string::npos);
  EXPECT_NE(error_of([&] { repo.component_config("tokenizer"); }).find("no config.json"), std::string::npos);
}

TEST(diffusers, PicksSingleShardedAndVariantWeights) {
  const fs::path tmp = xt::scratch_folder("diffusers_PicksSingleShardedAndVariantWeights");
  const DiffusersRepo repo = DiffusersRepo::open(make_repo(tmp).string());

  const auto transformer = repo.component_weights("transformer");
  EXPECT_NE(dynamic_cast<const SafetensorsFile*>(transformer.get()), nullptr);
  EXPECT_TRUE(transformer->label().ends_with("transformer/diffusion_pytorch_model.safetensors"))
      << "the fp16 variant is not used unless asked for";
  EXPECT_EQ(transformer->info("proj.weight").dtype, DType::BF16);

  const auto variant = repo.component_weights("transformer", "fp16");
  EXPECT_EQ(variant->info("proj.weight").dtype, DType::F16);

  const auto text_encoder = repo.component_weights("text_encoder");
  EXPECT_NE(dynamic_cast<const ShardedSafetensors*>(text_encoder.get()), nullptr);
  EXPECT_EQ(text_encoder->names(), (std::vector<std::string>{"embed.weight", "norm.weight"}));

  EXPECT_FALSE(repo.component_weights_file("tokenizer").has_value());
  const std::string msg = error_of([&] { repo.component_weights("scheduler"); });
  EXPECT_NE(msg.find("no safetensors weights"), std::string::npos) << msg;
  EXPECT_NE(msg.find("scheduler"), std::string::npos) << msg;
}

TEST(diffusers, PytorchBinWeightsAreNamedInTheError) {
  const fs::path tmp = xt::scratch_folder("diffusers_PytorchBinWeightsAreNamedInTheError");
  write_text(tmp / "unet" / "diffusion_pytorch_model.bin", "pickle");
  const std::string msg = error_of([&] { open_weights((tmp / "unet").string()); });
  EXPECT_NE(msg.find(".bin weights are not supported"), std::string::npos) << msg;
}

TEST(diffusers, WeightStats) {
  const fs::path tmp = xt::scratch_folder("diffusers_WeightStats");
  const DiffusersRepo repo = DiffusersRepo::open(make_repo(tmp).string());
  const WeightStats stats = weight_stats(*repo.component_weights("transformer"));
  EXPECT_EQ(stats.tensors, 2u);
  EXPECT_EQ(stats.params, 1'201'000);
  EXPECT_EQ(stats.params_by_dtype.at(DType::BF16), 1'200'000);
  EXPECT_EQ(stats.params_by_dtype.at(DType::F32), 1'000);
  EXPECT_EQ(stats.bytes, 2'400'000u + 4'000u);
}

TEST(diffusers, OpenErrors) {
  const fs::path tmp = xt::scratch_folder("diffusers_OpenErrors");
  EXPECT_NE(error_of([&] { DiffusersRepo::open((tmp / "nothing").string()); }).find("no such folder"),
            std::string::npos);
  EXPECT_NE(error_of([&] { DiffusersRepo::open(tmp.string()); }).find("no model_index.json"),
            std::string::npos);
}

TEST(diffusersModelInfo, PrintsPipelineComponentsAndSizes) {
  const fs::path tmp = xt::scratch_folder("diffusers_PrintsPipelineComponentsAndSizes");
  std::ostringstream out;
  print_model_info(make_repo(tmp).string(), out);
  const std::string text = out.str();
  for (const std::string expected :
       {"pipeline: Flux2KleinPipeline (diffusers 0.36.0)\n", "scheduler: FlowMatchEulerDiscreteScheduler (diffusers)\n",
        "tokenizer: Qwen2TokenizerFast (transformers)\n", "transformer: Flux2Transformer2DModel (diffusers)\n",
        "  weights: diffusion_pytorch_model.safetensors, 2 tensors\n", "  dtypes: f32: 1.0K params, bf16: 1.2M params\n",
        "  params: 1.2M\n", "  memory: 2.3 MiB\n", "  weights: model.safetensors.index.json, 2 tensors\n",
        "total: 1.2M params, 2.3 MiB\n"}) {
    EXPECT_NE(text.find(expected), std::string::npos) << "missing: " << expected << "in:\n" << text;
  }
  // Components without weights print their class line only.
  const size_t scheduler = text.find("scheduler:");
  EXPECT_EQ(text.substr(text.find('\n', scheduler) + 1, 13), "text_encoder:");
}

TEST(diffusersModelInfo, HumanReadableNumbers) {
  EXPECT_EQ(human_count(0), "0");
  EXPECT_EQ(human_count(999), "999");
  EXPECT_EQ(human_count(1000), "1.0K");
  EXPECT_EQ(human_count(84'100'000), "84.1M");
  EXPECT_EQ(human_count(3'880'000'000), "3.9B");
  EXPECT_EQ(human_count(999'960), "1.0M") << "rounding up moves to the next unit";
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(1536), "1.5 KiB");
  EXPECT_EQ(human_bytes(uint64_t{7} << 30), "7.0 GiB");
}

// ---- JsonConfig ----

TEST(diffusersJsonConfig, TypedGetters) {
  const JsonConfig c = JsonConfig::parse(
      R"({"n": 3, "big": 9223372036854775807, "neg": -4, "f": 0.25, "fi": 2, "b": true, "s": "silu",
          "il": [1, 2, 3], "fl": [0.5, 1], "sl": ["a", "b"], "nothing": null, "obj": {"k": 7}})",
      "dir/config.json");
  EXPECT_EQ(c.get_int("n"), 3);
  EXPECT_EQ(c.get_int("big"), INT64_MAX);
  EXPECT_EQ(c.get_int("neg"), -4);
  EXPECT_EQ(c.get_float("f"), 0.25);
  EXPECT_EQ(c.get_float("fi"), 2.0) << "integers are numbers";
  EXPECT_TRUE(c.get_bool("b"));
  EXPECT_EQ(c.get_string("s"), "silu");
  EXPECT_EQ(c.get_int_list("il"), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(c.get_float_list("fl"), (std::vector<double>{0.5, 1.0}));
  EXPECT_EQ(c.get_string_list("sl"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(c.get_object("obj").get_int("k"), 7);
  EXPECT_TRUE(c.has("n"));
  EXPECT_FALSE(c.has("nothing")) << "null counts as absent";
  EXPECT_FALSE(c.has("missing"));

  EXPECT_EQ(c.get_int("missing", 5), 5);
  EXPECT_EQ(c.get_int("nothing", 5), 5);
  EXPECT_EQ(c.get_float("missing", 1.5), 1.5);
  EXPECT_FALSE(c.get_bool("missing", false));
  EXPECT_EQ(c.get_string("missing", "gelu"), "gelu");
  EXPECT_EQ(c.get_int_list("missing", {4}), (std::vector<int64_t>{4}));
  EXPECT_EQ(c.get_float_list("missing", {0.5}), (std::vector<double>{0.5}));
}

TEST(diffusersJsonConfig, ErrorsNameFileAndField) {
  const JsonConfig c = JsonConfig::parse(R"({"s": "x", "n": 1, "nothing": null, "obj": {"k": "v"}})",
                                         "transformer/config.json");
  const auto expect_error = [&](const std::function<void()>& fn, const std::string& expected) {
    const std::string msg = error_of(fn);
    EXPECT_NE(msg.find(expected), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  };
  expect_error([&] { c.get_int("num_layers"); }, "transformer/config.json: field \"num_layers\" is missing");
  expect_error([&] { c.get_int("s"); }, "transformer/config.json: field \"s\" must be an integer, got string \"x\"");
  expect_error([&] { c.get_int("s", 2); }, "field \"s\" must be an integer");
  expect_error([&] { c.get_int("nothing"); }, "field \"nothing\" must be an integer, got null");
  expect_error([&] { c.get_bool("n"); }, "field \"n\" must be a boolean, got integer 1");
  expect_error([&] { c.get_string("n"); }, "field \"n\" must be a string");
  expect_error([&] { c.get_float("s"); }, "field \"s\" must be a number");
  expect_error([&] { c.get_int_list("n"); }, "field \"n\" must be a list of integers");
  expect_error([&] { c.get_object("obj").get_int("k"); }, "field \"obj.k\" must be an integer");
  expect_error([&] { c.fail_field("n", "must be even"); }, "transformer/config.json: field \"n\" must be even");
  expect_error([&] { JsonConfig::load("/nonexistent/config.json"); }, "cannot open /nonexistent/config.json");
}

namespace {

// The struct pattern for model configs: defaults are diffusers' defaults.
struct ExampleTransformerConfig {
  int num_layers = 0;
  int64_t in_channels = 64;
  float eps = 1e-6f;
  double theta = 10000.0;
  bool guidance_embeds = false;
  std::string act_fn = "gelu";
  std::vector<int> axes_dims_rope = {16, 56, 56};
  std::optional<int> out_channels;

  static ExampleTransformerConfig from_json(const JsonConfig& c) {
    ExampleTransformerConfig cfg;
    c.read("num_layers", cfg.num_layers);
    c.read_optional("in_channels", cfg.in_channels);
    c.read_optional("eps", cfg.eps);
    c.read_optional("rope_theta", cfg.theta);
    c.read_optional("guidance_embeds", cfg.guidance_embeds);
    c.read_optional("act_fn", cfg.act_fn);
    c.read_optional("axes_dims_rope", cfg.axes_dims_rope);
    c.read("out_channels", cfg.out_channels);
    if (cfg.num_layers <= 0) c.fail_field("num_layers", "must be positive");
    return cfg;
  }
};

}  // namespace

TEST(diffusersJsonConfig, StructPattern) {
  const auto cfg = ExampleTransformerConfig::from_json(JsonConfig::parse(
      R"({"num_layers": 8, "eps": 1e-5, "guidance_embeds": true, "axes_dims_rope": [32, 32], "out_channels": null})",
      "config.json"));
  EXPECT_EQ(cfg.num_layers, 8);
  EXPECT_EQ(cfg.in_channels, 64) << "absent: default kept";
  EXPECT_FLOAT_EQ(cfg.eps, 1e-5f);
  EXPECT_EQ(cfg.theta, 10000.0);
  EXPECT_TRUE(cfg.guidance_embeds);
  EXPECT_EQ(cfg.act_fn, "gelu");
  EXPECT_EQ(cfg.axes_dims_rope, (std::vector<int>{32, 32}));
  EXPECT_FALSE(cfg.out_channels.has_value());

  const auto with_out = ExampleTransformerConfig::from_json(
      JsonConfig::parse(R"({"num_layers": 1, "out_channels": 16})", "config.json"));
  EXPECT_EQ(with_out.out_channels, 16);

  EXPECT_NE(error_of([] { ExampleTransformerConfig::from_json(JsonConfig::parse(R"({"num_layers": 0})", "c.json")); })
                .find("c.json: field \"num_layers\" must be positive"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              ExampleTransformerConfig::from_json(
                  JsonConfig::parse(R"({"num_layers": 2, "eps": 1e300})", "c.json"));
            }).find("field \"eps\" is 1e+300, out of float range"),
            std::string::npos);
}

TEST(diffusersJsonConfig, NaNHintOnlyWhereTheParserStopped) {
  const std::string nan = error_of([] { JsonConfig::parse("{\"a\": [1, NaN]}", "c.json"); });
  EXPECT_NE(nan.find("(NaN and Infinity are not valid JSON numbers)"), std::string::npos) << nan;
  const std::string inf = error_of([] { JsonConfig::parse("{\"a\": -Infinity}", "c.json"); });
  EXPECT_NE(inf.find("(NaN and Infinity are not valid JSON numbers)"), std::string::npos) << inf;
  const std::string key = error_of([] { JsonConfig::parse(R"({"NaN": 1 2})", "c.json"); });
  EXPECT_NE(key.find("c.json: invalid JSON: parse error at line 1"), std::string::npos) << key;
  EXPECT_EQ(key.find("NaN and Infinity"), std::string::npos) << key;
}

TEST(diffusersJsonConfig, SanitizeKeepsMessagesOnOneLine) {
  EXPECT_EQ(sanitize("a\nb\tc"), "a\\x0ab\\x09c");
  EXPECT_EQ(sanitize("caf\xc3\xa9"), "caf\xc3\xa9") << "valid UTF-8 is kept";
  EXPECT_EQ(sanitize("\xff\xc3"), "\\xff\\xc3");
  EXPECT_EQ(sanitize("\xed\xa0\x80"), "\\xed\\xa0\\x80") << "surrogates are not valid UTF-8";
  EXPECT_EQ(quote(std::string(300, 'x'), 10), "\"xxxxxxxxxx...\"");
}
