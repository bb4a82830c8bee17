// The Qwen3 text encoder (the shared DecoderLM with q/k norms) against transformers: the klein pipeline's prompt_embeds (hidden states 9, 18, 27
// of the tiny 28-layer text encoder, stacked per token) for every fixture prompt, in F32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "support/fixtures.h"
#include "support/reference.h"
#include "xdit/io/diffusers.h"
#include "xdit/text/qwen3.h"

namespace xdit {
namespace {

using testing::ReferenceFile;

struct Klein {
  ReferenceFile reference = ReferenceFile::load("flux2-klein");
  DiffusersRepo repo = DiffusersRepo::open(testing::fixture_model_dir("flux2-klein").string());
  std::vector<int> taps;

  Klein() {
    for (int64_t t : reference.sidecar().get_object("text_encoder").get_int_list("hidden_states_layers"))
      taps.push_back(static_cast<int>(t));
  }
  int deepest() const { return *std::max_element(taps.begin(), taps.end()); }
};

TEST(Qwen3, ConfigOfTheTinyModel) {
  const Klein klein;
  const DecoderLMConfig c = qwen3_config(klein.repo.component_config("text_encoder"));
  EXPECT_EQ(c.hidden_size, 32);
  EXPECT_EQ(c.num_hidden_layers, 28);
  EXPECT_EQ(c.num_attention_heads, 2);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.intermediate_size, 48);
  EXPECT_EQ(c.vocab_size, 650);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_TRUE(c.qk_norm);
}

TEST(Qwen3, PromptEmbedsMatchTransformersForEveryPrompt) {
  const Klein klein;
  const auto weights = klein.repo.component_weights("text_encoder");
  const DecoderLM encoder = load_qwen3(*weights, klein.repo.component_config("text_encoder"), klein.deepest(), {});
  const std::vector<std::string> prompts = klein.reference.sidecar().get_object("tokens").keys();
  ASSERT_FALSE(prompts.empty());
  for (const std::string& prompt : prompts) {
    SCOPED_TRACE(prompt);
    const Tensor ids = klein.reference.tensor("tokens." + prompt + ".input_ids");
    const Tensor mask = klein.reference.tensor("tokens." + prompt + ".attention_mask");
    const Tensor expected = klein.reference.tensor("text." + prompt + ".prompt_embeds");
    const Tensor actual = encoder.hidden_states_stacked(ids, mask, klein.taps);
    EXPECT_EQ(actual.dtype(), DType::F32);
    EXPECT_MATCHES_FIXTURE(actual, expected);
    const testing::Comparison cmp = testing::compare(actual, expected.to_doubles());
    std::printf("[ qwen3    ] %-8s max abs %.3g (max |expected| %.3g)\n", prompt.c_str(), cmp.max_abs,
                cmp.max_expected);
  }
}

TEST(Qwen3, TapsAreStackedInTheOrderGiven) {
  const Klein klein;
  const auto weights = klein.repo.component_weights("text_encoder");
  const DecoderLM encoder = load_qwen3(*weights, klein.repo.component_config("text_encoder"), 3, {});
  const Tensor ids = klein.reference.tensor("tokens.ascii.input_ids").narrow(1, 0, 8);
  const Tensor mask = klein.reference.tensor("tokens.ascii.attention_mask").narrow(1, 0, 8);
  const Tensor forward = encoder.hidden_states_stacked(ids, mask, {1, 3});
  const Tensor reversed = encoder.hidden_states_stacked(ids, mask, {3, 1});
  ASSERT_EQ(forward.shape(), (Shape{1, 8, 64}));
  EXPECT_EQ(testing::values(forward.narrow(2, 0, 32)), testing::values(reversed.narrow(2, 32, 32)));
  EXPECT_EQ(testing::values(forward.narrow(2, 32, 32)), testing::values(reversed.narrow(2, 0, 32)));
}

TEST(Qwen3, RejectsTapsBeyondTheLoadedLayersAndUnknownTokens) {
  const Klein klein;
  const auto weights = klein.repo.component_weights("text_encoder");
  const JsonConfig config = klein.repo.component_config("text_encoder");
  const DecoderLM encoder = load_qwen3(*weights, config, 2, {});
  const Tensor mask = Tensor::full({1, 2}, 1.0f, DType::I32);
  const std::vector<int64_t> known = {1, 2}, unknown = {1, 650};
  testing::expect_error([&] { encoder.hidden_states_stacked(Tensor::from_ints(known, {1, 2}), mask, {3}); },
                        {"hidden state 3", "not loaded"});
  testing::expect_error([&] { encoder.hidden_states_stacked(Tensor::from_ints(unknown, {1, 2}), mask, {1}); },
                        {"token id 650", "vocabulary of 650"});
  const std::vector<int64_t> left = {0, 1}, none = {0, 0};
  testing::expect_error(
      [&] { encoder.hidden_states_stacked(Tensor::from_ints(known, {1, 2}), Tensor::from_ints(left, {1, 2}), {1}); },
      {"mask row 0", "not right-padded"});
  testing::expect_error(
      [&] { encoder.hidden_states_stacked(Tensor::from_ints(known, {1, 2}), Tensor::from_ints(none, {1, 2}), {1}); },
      {"mask row 0", "no tokens"});
  testing::expect_error([&] { load_qwen3(*weights, config, 29, {}); },
                        {"hidden state 29", "28 layers"});
}

}  // namespace
}  // namespace xdit
