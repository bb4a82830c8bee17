// FLUX.2 text conditioning against diffusers' encode_prompt, for klein (Qwen3, taps 9/18/27) and
// dev (Mistral3's text model, taps 10/20/30): the chat-formatted text, the padded ids and mask,
// and the prompt_embeds (valid and padded rows) for every fixture prompt; bf16 and fp8 bounded
// against the f32 fixture; bad repositories.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "support/files.h"
#include "support/fixtures.h"
#include "support/reference.h"
#include "xdit/io/diffusers.h"
#include "xdit/io/safetensors.h"
#include "xdit/models/flux2/text_conditioning.h"
#include "xdit/ops/ops.h"
#include "xdit/text/mistral3.h"
#include "xdit/text/qwen3.h"

namespace fs = std::filesystem;

namespace xdit::flux2 {
namespace {

using testing::ReferenceFile;

struct Family {
  std::string name;  // "flux2-klein", "flux2-dev"
  ReferenceFile reference;
  DiffusersRepo repo;

  explicit Family(const std::string& family)
      : name(family),
        reference(ReferenceFile::load(family)),
        repo(DiffusersRepo::open(testing::fixture_model_dir(family).string())) {}

  const nlohmann::json& sidecar_text_encoder() const { return reference.sidecar().json().at("text_encoder"); }
  const nlohmann::json& tokens() const { return reference.sidecar().json().at("tokens"); }
  int64_t max_length() const { return sidecar_text_encoder().at("max_sequence_length").get<int64_t>(); }
  std::vector<std::string> prompt_names() const { return reference.sidecar().get_object("tokens").keys(); }
  std::string prompt(const std::string& key) const { return tokens().at(key).at("prompt").get<std::string>(); }

  TextConditioning load(DType dtype = DType::F32, bool fp8 = false) const {
    return TextConditioning::load(repo, {dtype, fp8, max_length(), {}});
  }
};

// Rows [0, valid) and [valid, L) of a [1, L, C] result against the fixture, reported separately.
void expect_rows_match(const Tensor& actual, const Tensor& expected, int64_t valid, const std::string& label) {
  const int64_t length = expected.size(1);
  ASSERT_EQ(actual.shape(), expected.shape());
  const testing::Comparison all = testing::compare(actual, expected.to_doubles());
  std::printf("[ flux2 text ] %-24s max abs %.3g (max |expected| %.3g, bound %.3g)\n", label.c_str(), all.max_abs,
              all.max_expected, 1e-4 * all.max_expected);
  EXPECT_LE(all.max_abs, 1e-4 * all.max_expected) << label << ": " << all.describe();
  EXPECT_TRUE(testing::matches_fixture(actual.narrow(1, 0, valid), expected.narrow(1, 0, valid)))
      << label << " valid rows";
  if (valid < length) {
    EXPECT_TRUE(
        testing::matches_fixture(actual.narrow(1, valid, length - valid), expected.narrow(1, valid, length - valid)))
        << label << " padded rows";
  }
}

class Flux2Text : public ::testing::TestWithParam<std::string> {};

TEST_P(Flux2Text, PicksTheEncoderAndTheDefaultTaps) {
  const Family f(GetParam());
  const TextConditioning text = f.load();
  const bool klein = f.name == "flux2-klein";
  EXPECT_EQ(text.encoder_kind(), klein ? TextConditioning::Encoder::Qwen3 : TextConditioning::Encoder::Mistral3);
  std::vector<int> expected;
  for (const auto& t : f.sidecar_text_encoder().at("hidden_states_layers")) expected.push_back(t.get<int>());
  EXPECT_EQ(text.taps(), expected);
  EXPECT_EQ(text.max_sequence_length(), 512);
  // Only the layers up to the deepest tap are loaded: 27 of 28 (klein), 30 of 31 (dev).
  EXPECT_EQ(text.encoder().loaded_layers(), klein ? 27 : 30);
  EXPECT_EQ(text.encoder().config().num_hidden_layers, klein ? 28 : 31);
  EXPECT_EQ(text.encoder().config().qk_norm, klein);
}

// The chat-formatted text, then the ids and mask with padding and truncation, exactly.
TEST_P(Flux2Text, FormatsAndTokenizesEveryPromptLikeThePipeline) {
  const Family f(GetParam());
  const TextConditioning text = f.load();
  for (const std::string& key : f.prompt_names()) {
    SCOPED_TRACE(key);
    const nlohmann::json& info = f.tokens().at(key);
    EXPECT_EQ(text.format(f.prompt(key)), info.at("formatted").get<std::string>());
    const PaddedTokens tokens = text.tokenize({f.prompt(key)});
    EXPECT_TRUE(testing::matches_fixture(tokens.input_ids, f.reference.tensor("tokens." + key + ".input_ids")));
    EXPECT_TRUE(
        testing::matches_fixture(tokens.attention_mask, f.reference.tensor("tokens." + key + ".attention_mask")));
    EXPECT_EQ(tokens.untruncated_tokens, std::vector<int64_t>{info.at("untruncated_tokens").get<int64_t>()});
  }
}

// Each prompt alone, in f32: valid and padded rows within 1e-4 x max |expected|.
TEST_P(Flux2Text, PromptEmbedsMatchDiffusersForEveryPrompt) {
  const Family f(GetParam());
  const TextConditioning text = f.load();
  for (const std::string& key : f.prompt_names()) {
    SCOPED_TRACE(key);
    const TextConditioning::Encoded out = text.encode({f.prompt(key)});
    EXPECT_EQ(out.prompt_embeds.dtype(), DType::F32);
    expect_rows_match(out.prompt_embeds, f.reference.tensor("text." + key + ".prompt_embeds"),
                      f.tokens().at(key).at("valid_tokens").get<int64_t>(), f.name + " " + key);
  }
}

// All prompts in one batch give each prompt's rows; the long one is truncated with one warning.
TEST_P(Flux2Text, BatchEqualsSinglePromptsAndWarnsAboutTruncation) {
  const Family f(GetParam());
  const TextConditioning text = f.load();
  const std::vector<std::string> keys = f.prompt_names();
  std::vector<std::string> prompts;
  for (const std::string& key : keys) prompts.push_back(f.prompt(key));

  ::testing::internal::CaptureStderr();
  const TextConditioning::Encoded out = text.encode(prompts);
  const std::string warnings = ::testing::internal::GetCapturedStderr();

  const auto batch = static_cast<int64_t>(keys.size());
  ASSERT_EQ(out.prompt_embeds.shape(), (Shape{batch, 512, 96}));
  ASSERT_EQ(out.untruncated_tokens.size(), keys.size());
  std::string expected_warnings;
  for (size_t i = 0; i < keys.size(); ++i) {
    SCOPED_TRACE(keys[i]);
    const int64_t untruncated = f.tokens().at(keys[i]).at("untruncated_tokens").get<int64_t>();
    EXPECT_EQ(out.untruncated_tokens[i], untruncated);
    if (untruncated > 512)
      expected_warnings += "xdit: warning: prompt " + std::to_string(i) + " has " + std::to_string(untruncated) +
                           " tokens; truncated to max_sequence_length 512\n";
    const Tensor row = out.prompt_embeds.narrow(0, static_cast<int64_t>(i), 1);
    EXPECT_TRUE(testing::matches_fixture(row, f.reference.tensor("text." + keys[i] + ".prompt_embeds")));
  }
  EXPECT_EQ(warnings, expected_warnings);
  EXPECT_NE(warnings.find("has 2"), std::string::npos) << "the long prompt must be truncated";

  ASSERT_EQ(out.text_ids.shape(), (Shape{batch, 512, 4}));
  EXPECT_EQ(out.text_ids.dtype(), DType::I64);
  EXPECT_EQ(testing::values(out.text_ids.select(0, 1).select(0, 7)), (std::vector<double>{0, 0, 0, 7}));
  EXPECT_EQ(testing::values(out.text_ids.select(0, 0).select(0, 511)), (std::vector<double>{0, 0, 0, 511}));
}

// bf16 compute and FP8 projections against the f32 fixture: relative L2 over all prompts.
TEST_P(Flux2Text, Bf16AndFp8StayCloseToTheF32Reference) {
  const Family f(GetParam());
  std::vector<std::string> prompts;
  std::vector<double> expected;
  for (const std::string& key : f.prompt_names()) {
    prompts.push_back(f.prompt(key));
    const std::vector<double> e = f.reference.tensor("text." + key + ".prompt_embeds").to_doubles();
    expected.insert(expected.end(), e.begin(), e.end());
  }
  struct Case {
    const char* label;
    DType dtype;
    bool fp8;
    double bound;
  };
  // The tiny random encoders amplify rounding over their 27-30 layers: PyTorch itself measures a
  // relative L2 of 0.031 (klein) and 0.020 (dev) in bf16, and 0.195 and 0.121 with the same
  // per-channel FP8 weights in f32, which is what we measure too. Fp8ProjectionsEqualDequantizedWeights
  // checks the FP8 path tightly; these bounds catch gross errors (a lost scale gives ~1).
  for (const Case& c : {Case{"bf16", DType::BF16, false, 5e-2}, Case{"f32 + fp8", DType::F32, true, 0.3},
                        Case{"bf16 + fp8", DType::BF16, true, 0.3}}) {
    const TextConditioning text = f.load(c.dtype, c.fp8);
    const Tensor embeds = text.encode(prompts).prompt_embeds;
    EXPECT_EQ(embeds.dtype(), c.dtype);
    const testing::Comparison cmp = testing::compare(embeds, expected);
    std::printf("[ flux2 text ] %-12s %-10s rel L2 %.3g (bound %.3g), max abs %.3g of %.3g\n", f.name.c_str(), c.label,
                cmp.rel_l2, c.bound, cmp.max_abs, cmp.max_expected);
    EXPECT_FALSE(cmp.non_finite) << c.label;
    EXPECT_LE(cmp.rel_l2, c.bound) << c.label << ": " << cmp.describe();
  }
}

// FP8 projections compute what f32 projections with the dequantized weights compute.
TEST_P(Flux2Text, Fp8ProjectionsEqualDequantizedWeights) {
  const Family f(GetParam());
  const bool klein = f.name == "flux2-klein";
  const std::string layers_prefix = klein ? "model.layers." : "language_model.model.layers.";
  const auto weights = f.repo.component_weights("text_encoder");
  const JsonConfig config = f.repo.component_config("text_encoder");
  TensorMap dequantized;
  for (const std::string& name : weights->names()) {
    Tensor t = weights->tensor(name);
    if (name.starts_with(layers_prefix) && name.ends_with("_proj.weight")) {
      const ops::Fp8Weight q = ops::quantize_fp8_per_channel(t);
      t = ops::mul(q.data.to(DType::F32), q.scale.unsqueeze(1));
    }
    dequantized.add(name, t);
  }
  const int deepest = klein ? 27 : 30;
  auto load = [&](const TensorSource& source, bool fp8) {
    const DecoderLMOptions options{DType::F32, fp8};
    return klein ? load_qwen3(source, config, deepest, options)
                 : load_mistral3_text_model(source, config, deepest, options);
  };
  const Tensor ids = f.reference.tensor("tokens.unicode.input_ids");
  const Tensor mask = f.reference.tensor("tokens.unicode.attention_mask");
  const std::vector<int> taps = f.load().taps();
  const Tensor fp8 = load(*weights, true).hidden_states_stacked(ids, mask, taps);
  const Tensor reference = load(dequantized, false).hidden_states_stacked(ids, mask, taps);
  const testing::Comparison cmp = testing::compare(fp8, reference.to_doubles());
  std::printf("[ flux2 text ] %-12s fp8 vs dequantized f32: max abs %.3g of %.3g\n", f.name.c_str(), cmp.max_abs,
              cmp.max_expected);
  EXPECT_TRUE(testing::matches_fixture(fp8, reference));
}

TEST_P(Flux2Text, WeightBytesFollowTheDtype) {
  const Family f(GetParam());
  const size_t f32 = f.load().weight_bytes();
  const size_t bf16 = f.load(DType::BF16).weight_bytes();
  const size_t fp8 = f.load(DType::BF16, true).weight_bytes();
  EXPECT_EQ(bf16 * 2, f32);
  EXPECT_LT(fp8, bf16);
  EXPECT_GT(fp8, bf16 / 2);  // norms, embeddings and scales stay wider
}

// Taps chosen by the caller, in the caller's order; beyond the model they are refused.
TEST_P(Flux2Text, CustomTaps) {
  const Family f(GetParam());
  const TextConditioning text = TextConditioning::load(f.repo, {DType::F32, false, 16, {2, 1}});
  EXPECT_EQ(text.encoder().loaded_layers(), 2);
  const Tensor embeds = text.encode({"A red fox"}).prompt_embeds;
  ASSERT_EQ(embeds.shape(), (Shape{1, 16, 64}));
  const Tensor swapped =
      TextConditioning::load(f.repo, {DType::F32, false, 16, {1, 2}}).encode({"A red fox"}).prompt_embeds;
  EXPECT_EQ(testing::values(embeds.narrow(2, 0, 32)), testing::values(swapped.narrow(2, 32, 32)));
  testing::expect_error(
      [&] {
        TextConditioning::load(f.repo, {DType::F32, false, 512, {40}});
      },
      {"hidden state 40", "config.json"});
  testing::expect_error([&] { TextConditioning::load(f.repo, {DType::F32, false, 0, {}}); }, {"max_sequence_length"});
  testing::expect_error([&] { text.encode({}); }, {"no prompts"});
}

INSTANTIATE_TEST_SUITE_P(Families, Flux2Text, ::testing::Values("flux2-klein", "flux2-dev"), [](const auto& info) {
  std::string name = info.param;
  std::erase(name, '-');
  return name;
});

TEST(Flux2TextDev, ConfigOfTheTinyMistral) {
  const Family dev("flux2-dev");
  const DecoderLMConfig c = mistral3_text_config(dev.repo.component_config("text_encoder"));
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.num_hidden_layers, 31);
  EXPECT_EQ(c.num_attention_heads, 2);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.intermediate_size, 32);
  EXPECT_EQ(c.vocab_size, 640);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e9);
  EXPECT_FALSE(c.qk_norm);
}

// Destroying the conditioning releases the encoder weights: the checkpoint is no longer mapped
// (f32 weights stored as f32 are bound as views of the mapping), and the embeddings outlive it.
TEST_P(Flux2Text, DestroyingReleasesTheWeightFile) {
  const Family f(GetParam());
  const std::string file = fs::canonical(testing::fixture_model_dir(f.name) / "text_encoder" / "model.safetensors");
  auto mapped = [&] { return testing::read_text("/proc/self/maps").find(file) != std::string::npos; };
  ASSERT_FALSE(mapped());
  Tensor embeds;
  {
    const TextConditioning text = f.load();
    EXPECT_TRUE(mapped());
    embeds = text.encode({"A red fox"}).prompt_embeds;
  }
  EXPECT_FALSE(mapped());
  EXPECT_TRUE(testing::matches_fixture(embeds.narrow(1, 0, 4), embeds.clone().narrow(1, 0, 4)));
}

// dev's format_input removes "[IMG]" from the prompt before the template.
TEST(Flux2TextDev, DropsImageTokensFromThePrompt) {
  const Family dev("flux2-dev");
  const TextConditioning text = dev.load();
  EXPECT_EQ(text.format("a [IMG]cat[IMG]"), text.format("a cat"));
  EXPECT_EQ(dev.sidecar_text_encoder().at("system_message").get<std::string>(), std::string(kSystemMessage));
}

// ---- Bad repositories: one clear error naming the file, field, class or tensor.

// A scratch copy of a fixture repository.
fs::path copy_repo(const std::string& family, const std::string& name) {
  const fs::path dir = testing::scratch_folder(name) / "repo";
  fs::copy(testing::fixture_model_dir(family), dir, fs::copy_options::recursive);
  return dir;
}

void edit_json(const fs::path& path, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(testing::read_text(path));
  edit(j);
  testing::write_text(path, j.dump(2));
}

TextConditioning load_dir(const fs::path& dir) { return TextConditioning::load(DiffusersRepo::open(dir.string()), {}); }

TEST(Flux2TextBadInput, UnknownEncoderClassIsNamed) {
  const fs::path dir = copy_repo("flux2-klein", "flux2_text_class");
  edit_json(dir / "model_index.json", [](nlohmann::json& j) {
    j["text_encoder"] = {"transformers", "T5EncoderModel"};
  });
  testing::expect_error([&] { load_dir(dir); }, {"T5EncoderModel", "not supported"});
}

TEST(Flux2TextBadInput, MissingTokenizerFilesAreNamed) {
  const fs::path dir = copy_repo("flux2-klein", "flux2_text_tokenizer");
  fs::remove(dir / "tokenizer" / "tokenizer.json");
  testing::expect_error([&] { load_dir(dir); }, {(dir / "tokenizer" / "tokenizer.json").string(), "missing"});

  const fs::path no_config = copy_repo("flux2-dev", "flux2_text_tokenizer_config");
  fs::remove(no_config / "tokenizer" / "tokenizer_config.json");
  testing::expect_error([&] { load_dir(no_config); }, {"tokenizer_config.json", "missing"});

  const fs::path no_pad = copy_repo("flux2-dev", "flux2_text_pad");
  edit_json(no_pad / "tokenizer" / "tokenizer_config.json", [](nlohmann::json& j) { j.erase("pad_token"); });
  testing::expect_error([&] { load_dir(no_pad); }, {"tokenizer_config.json", "pad_token"});

  const fs::path left = copy_repo("flux2-klein", "flux2_text_left");
  edit_json(left / "tokenizer" / "tokenizer_config.json", [](nlohmann::json& j) { j["padding_side"] = "left"; });
  testing::expect_error([&] { load_dir(left); }, {"tokenizer_config.json", "padding_side", "only \"right\""});

  const fs::path no_bos = copy_repo("flux2-dev", "flux2_text_bos");
  edit_json(no_bos / "tokenizer" / "tokenizer_config.json", [](nlohmann::json& j) { j.erase("bos_token"); });
  testing::expect_error([&] { load_dir(no_bos); }, {"tokenizer_config.json", "bos_token"});
}

TEST(Flux2TextBadInput, MissingTextEncoderIsNamed) {
  const fs::path folder = copy_repo("flux2-dev", "flux2_text_folder");
  fs::remove_all(folder / "text_encoder");
  testing::expect_error([&] { load_dir(folder); }, {"text_encoder"});

  const fs::path unlisted = copy_repo("flux2-dev", "flux2_text_unlisted");
  fs::remove_all(unlisted / "text_encoder");
  edit_json(unlisted / "model_index.json", [](nlohmann::json& j) { j.erase("text_encoder"); });
  testing::expect_error([&] { load_dir(unlisted); }, {"text_encoder"});

  const fs::path weights = copy_repo("flux2-dev", "flux2_text_weights");
  fs::remove(weights / "text_encoder" / "model.safetensors");
  testing::expect_error([&] { load_dir(weights); }, {(weights / "text_encoder").string()});

  const fs::path config = copy_repo("flux2-dev", "flux2_text_config");
  edit_json(config / "text_encoder" / "config.json", [](nlohmann::json& j) { j["text_config"].erase("hidden_size"); });
  testing::expect_error([&] { load_dir(config); }, {"config.json", "hidden_size"});

  const fs::path window = copy_repo("flux2-dev", "flux2_text_window");
  edit_json(window / "text_encoder" / "config.json",
            [](nlohmann::json& j) { j["text_config"]["sliding_window"] = 4096; });
  testing::expect_error([&] { load_dir(window); }, {"config.json", "sliding_window"});
}

// A checkpoint without one tensor the taps need: the error names the tensor.
TEST(Flux2TextBadInput, MissingTensorIsNamed) {
  for (const auto& [family, missing] : {std::pair{"flux2-dev", "language_model.model.layers.29.mlp.up_proj.weight"},
                                        std::pair{"flux2-klein", "model.layers.3.self_attn.k_norm.weight"}}) {
    const fs::path dir = copy_repo(family, std::string("flux2_text_tensor_") + family);
    const fs::path file = dir / "text_encoder" / "model.safetensors";
    std::vector<std::pair<std::string, Tensor>> kept;
    {
      const SafetensorsFile original = SafetensorsFile::open(file.string());
      for (const std::string& name : original.names())
        if (name != missing) kept.emplace_back(name, original.tensor(name).clone());
    }
    write_safetensors(file.string(), kept);
    testing::expect_error([&] { load_dir(dir); }, {missing, "missing"});
  }
}

// transformers 5's module names (model.language_model.*, lm_head) load as well as the saved ones.
TEST(Flux2TextDev, LoadsModuleNamedCheckpoints) {
  const Family dev("flux2-dev");
  const fs::path dir = copy_repo("flux2-dev", "flux2_text_module_names");
  const fs::path file = dir / "text_encoder" / "model.safetensors";
  std::vector<std::pair<std::string, Tensor>> renamed;
  {
    const SafetensorsFile original = SafetensorsFile::open(file.string());
    for (const std::string& name : original.names()) {
      std::string target = name;
      if (name.starts_with("language_model.model."))
        target = "model.language_model." + name.substr(21);
      else if (name.starts_with("language_model.lm_head."))
        target = "lm_head." + name.substr(23);
      else
        target = "model." + name;
      renamed.emplace_back(target, original.tensor(name).clone());
    }
  }
  write_safetensors(file.string(), renamed);
  const TextConditioning text = load_dir(dir);
  EXPECT_TRUE(testing::matches_fixture(text.encode({dev.prompt("ascii")}).prompt_embeds,
                                       dev.reference.tensor("text.ascii.prompt_embeds")));
}

}  // namespace
}  // namespace xdit::flux2
