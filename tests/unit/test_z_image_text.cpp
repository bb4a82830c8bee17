// Z-Image text conditioning against diffusers' ZImagePipeline.encode_prompt on the tiny fixture
// (a 3-layer Qwen3Model): the chat-formatted text, the padded ids and mask, and hidden_states[-2]
// of the valid tokens for every fixture prompt; bf16 and fp8 bounded against the f32 fixture;
// checkpoint layouts and bad repositories.
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
#include "xdit/models/z_image/text_conditioning.h"

namespace fs = std::filesystem;

namespace xdit::z_image {
namespace {

using testing::ReferenceFile;

struct Fixture {
  ReferenceFile reference = ReferenceFile::load("z-image");
  DiffusersRepo repo = DiffusersRepo::open(testing::fixture_model_dir("z-image").string());

  const nlohmann::json& tokens() const { return reference.sidecar().json().at("tokens"); }
  int64_t max_length() const {
    return reference.sidecar().json().at("text_encoder").at("max_sequence_length").get<int64_t>();
  }
  std::vector<std::string> prompt_names() const { return reference.sidecar().get_object("tokens").keys(); }
  std::string prompt(const std::string& key) const { return tokens().at(key).at("prompt").get<std::string>(); }
  int64_t valid_tokens(const std::string& key) const { return tokens().at(key).at("valid_tokens").get<int64_t>(); }
  Tensor embeds(const std::string& key) const { return reference.tensor("text." + key + ".prompt_embeds"); }

  TextConditioning load(DType dtype = DType::F32, bool fp8 = false) const {
    return TextConditioning::load(repo, {dtype, fp8, max_length()});
  }
};

TEST(ZImageText, ReadsHiddenStateMinusTwoWithoutTheLastLayer) {
  const Fixture f;
  ASSERT_EQ(f.reference.sidecar().json().at("text_encoder").at("hidden_states_index").get<int>(), -2);
  const TextConditioning text = f.load();
  EXPECT_EQ(text.encoder().config().num_hidden_layers, 3);
  EXPECT_EQ(text.hidden_state_index(), 2);
  EXPECT_EQ(text.encoder().loaded_layers(), 2);
  EXPECT_EQ(text.max_sequence_length(), 512);
}

// The chat-formatted text (enable_thinking=True: no empty think block), then the ids and mask
// with padding and truncation, exactly.
TEST(ZImageText, FormatsAndTokenizesEveryPromptLikeThePipeline) {
  const Fixture f;
  const TextConditioning text = f.load();
  ASSERT_EQ(f.prompt_names().size(), 4u);
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

// Each prompt alone, in f32: [valid tokens, hidden] within 1e-4 x max |expected|.
TEST(ZImageText, PromptEmbedsMatchDiffusersForEveryPrompt) {
  const Fixture f;
  const TextConditioning text = f.load();
  for (const std::string& key : f.prompt_names()) {
    SCOPED_TRACE(key);
    const std::vector<Tensor> out = text.encode({f.prompt(key)});
    ASSERT_EQ(out.size(), 1u);
    const Tensor expected = f.embeds(key);
    ASSERT_EQ(out[0].shape(), (Shape{f.valid_tokens(key), 32}));
    EXPECT_EQ(out[0].dtype(), DType::F32);
    const testing::Comparison cmp = testing::compare(out[0], expected.to_doubles());
    std::printf("[ z-image text ] %-8s max abs %.3g (max |expected| %.3g, bound %.3g)\n", key.c_str(), cmp.max_abs,
                cmp.max_expected, 1e-4 * cmp.max_expected);
    EXPECT_LE(cmp.max_abs, 1e-4 * cmp.max_expected) << cmp.describe();
  }
}

// All prompts in one batch give each prompt's rows; the long one is truncated with one warning.
TEST(ZImageText, BatchEqualsSinglePromptsAndWarnsAboutTruncation) {
  const Fixture f;
  const TextConditioning text = f.load();
  const std::vector<std::string> keys = f.prompt_names();
  std::vector<std::string> prompts;
  for (const std::string& key : keys) prompts.push_back(f.prompt(key));

  ::testing::internal::CaptureStderr();
  const std::vector<Tensor> out = text.encode(prompts);
  const std::string warnings = ::testing::internal::GetCapturedStderr();

  ASSERT_EQ(out.size(), keys.size());
  std::string expected_warnings;
  for (size_t i = 0; i < keys.size(); ++i) {
    SCOPED_TRACE(keys[i]);
    const int64_t untruncated = f.tokens().at(keys[i]).at("untruncated_tokens").get<int64_t>();
    if (untruncated > 512)
      expected_warnings += "xdit: warning: prompt " + std::to_string(i) + " has " + std::to_string(untruncated) +
                           " tokens; truncated to max_sequence_length 512\n";
    EXPECT_TRUE(testing::matches_fixture(out[i], f.embeds(keys[i])));
  }
  EXPECT_EQ(warnings, expected_warnings);
  EXPECT_NE(warnings.find("has "), std::string::npos) << "the long prompt must be truncated";
}

// bf16 compute and FP8 projections against the f32 fixture: relative L2 over all prompts.
TEST(ZImageText, Bf16AndFp8StayCloseToTheF32Reference) {
  const Fixture f;
  std::vector<std::string> prompts;
  std::vector<double> expected;
  for (const std::string& key : f.prompt_names()) {
    prompts.push_back(f.prompt(key));
    const std::vector<double> e = f.embeds(key).to_doubles();
    expected.insert(expected.end(), e.begin(), e.end());
  }
  struct Case {
    const char* label;
    DType dtype;
    bool fp8;
    double bound;
  };
  // The tiny random encoder amplifies rounding: PyTorch itself measures a relative L2 of 0.0147 in
  // bf16, and 0.0888 (f32) and 0.0897 (bf16) with the same per-channel FP8 weights; we measure
  // 0.0133, 0.0888 and 0.0966. A lost FP8 scale or a wrong hidden state gives ~1.
  for (const Case& c : {Case{"bf16", DType::BF16, false, 3e-2}, Case{"f32 + fp8", DType::F32, true, 0.15},
                        Case{"bf16 + fp8", DType::BF16, true, 0.15}}) {
    ::testing::internal::CaptureStderr();
    const std::vector<Tensor> out = f.load(c.dtype, c.fp8).encode(prompts);
    ::testing::internal::GetCapturedStderr();
    std::vector<double> actual;
    for (const Tensor& t : out) {
      EXPECT_EQ(t.dtype(), c.dtype);
      const std::vector<double> v = t.to_doubles();
      actual.insert(actual.end(), v.begin(), v.end());
    }
    const testing::Comparison cmp = testing::compare(actual, expected);
    std::printf("[ z-image text ] %-10s rel L2 %.3g (bound %.3g), max abs %.3g of %.3g\n", c.label, cmp.rel_l2,
                c.bound, cmp.max_abs, cmp.max_expected);
    EXPECT_FALSE(cmp.non_finite) << c.label;
    EXPECT_LE(cmp.rel_l2, c.bound) << c.label << ": " << cmp.describe();
  }
}

// ---- Checkpoint layouts and bad repositories.

fs::path copy_repo(const std::string& name) {
  const fs::path dir = testing::scratch_folder(name) / "repo";
  fs::copy(testing::fixture_model_dir("z-image"), dir, fs::copy_options::recursive);
  return dir;
}

// Rewrites the text encoder's weights through `edit`, which returns the new name ("" drops it).
void rewrite_text_encoder(const fs::path& dir, const std::function<std::string(const std::string&)>& edit) {
  const fs::path file = dir / "text_encoder" / "model.safetensors";
  std::vector<std::pair<std::string, Tensor>> kept;
  {
    const SafetensorsFile original = SafetensorsFile::open(file.string());
    for (const std::string& name : original.names()) {
      const std::string target = edit(name);
      if (!target.empty()) kept.emplace_back(target, original.tensor(name).clone());
    }
  }
  write_safetensors(file.string(), kept);
}

void edit_json(const fs::path& path, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(testing::read_text(path));
  edit(j);
  testing::write_text(path, j.dump(2));
}

TextConditioning load_dir(const fs::path& dir) { return TextConditioning::load(DiffusersRepo::open(dir.string()), {}); }

// A Qwen3ForCausalLM checkpoint (model.* and lm_head) gives the same features; the last layer's
// tensors are never needed.
TEST(ZImageText, LoadsCausalLmCheckpointsAndNeverNeedsTheLastLayer) {
  const Fixture f;
  const fs::path causal = copy_repo("z_image_text_causal_lm");
  {
    const SafetensorsFile original = SafetensorsFile::open((causal / "text_encoder" / "model.safetensors").string());
    std::vector<std::pair<std::string, Tensor>> renamed;
    for (const std::string& name : original.names())
      renamed.emplace_back("model." + name, original.tensor(name).clone());
    renamed.emplace_back("lm_head.weight", original.tensor("embed_tokens.weight").clone());
    write_safetensors((causal / "text_encoder" / "model.safetensors").string(), renamed);
  }
  edit_json(causal / "model_index.json",
            [](nlohmann::json& j) { j["text_encoder"] = {"transformers", "Qwen3ForCausalLM"}; });
  EXPECT_TRUE(testing::matches_fixture(load_dir(causal).encode({f.prompt("ascii")})[0], f.embeds("ascii")));

  const fs::path truncated = copy_repo("z_image_text_no_last_layer");
  rewrite_text_encoder(truncated, [](const std::string& name) {
    return name.starts_with("layers.2.") || name.starts_with("norm.") ? std::string() : name;
  });
  EXPECT_TRUE(testing::matches_fixture(load_dir(truncated).encode({f.prompt("ascii")})[0], f.embeds("ascii")));
}

TEST(ZImageTextBadInput, ClearErrors) {
  const fs::path klass = copy_repo("z_image_text_class");
  edit_json(klass / "model_index.json",
            [](nlohmann::json& j) { j["text_encoder"] = {"transformers", "T5EncoderModel"}; });
  testing::expect_error([&] { load_dir(klass); }, {"T5EncoderModel", "not supported"});

  const fs::path missing = copy_repo("z_image_text_tensor");
  rewrite_text_encoder(missing,
                       [](const std::string& name) { return name == "layers.1.mlp.up_proj.weight" ? "" : name; });
  testing::expect_error([&] { load_dir(missing); }, {"layers.1.mlp.up_proj.weight", "missing"});

  const fs::path no_pad = copy_repo("z_image_text_pad");
  edit_json(no_pad / "tokenizer" / "tokenizer_config.json", [](nlohmann::json& j) { j.erase("pad_token"); });
  testing::expect_error([&] { load_dir(no_pad); }, {"tokenizer_config.json", "pad_token"});

  const fs::path no_encoder = copy_repo("z_image_text_folder");
  fs::remove_all(no_encoder / "text_encoder");
  testing::expect_error([&] { load_dir(no_encoder); }, {"text_encoder"});

  const Fixture f;
  testing::expect_error([&] { TextConditioning::load(f.repo, {DType::F32, false, 0}); }, {"max_sequence_length"});
  testing::expect_error([&] { f.load().encode({}); }, {"no prompts"});
}

}  // namespace
}  // namespace xdit::z_image
