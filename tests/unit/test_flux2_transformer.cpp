// flux2::Transformer against diffusers' Flux2Transformer2DModel: one forward of the tiny klein
// (no guidance embedder) and dev (guidance embedder) models on the fixture inputs, in F32, BF16
// and with FP8 linears; the position-id builders against the pipeline's ids; and the errors for
// bad configs, bad weights and bad inputs.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "support/fixtures.h"
#include "support/reference.h"
#include "xdit/io/diffusers.h"
#include "xdit/models/flux2/position_ids.h"
#include "xdit/models/flux2/transformer.h"

namespace xdit {
namespace {

using flux2::Transformer;
using flux2::TransformerConfig;
using flux2::TransformerLoadOptions;
using testing::ReferenceFile;

struct Fixture {
  ReferenceFile reference;
  std::string transformer_dir;
  JsonConfig config;
  std::unique_ptr<TensorSource> weights;

  explicit Fixture(const std::string& family)
      : reference(ReferenceFile::load(family)),
        transformer_dir((testing::fixture_model_dir(family) / "transformer").string()),
        config(JsonConfig::load(transformer_dir + "/config.json")),
        weights(open_weights(transformer_dir)) {}

  bool has_guidance() const { return reference.has("transformer.guidance"); }
  Tensor input(const std::string& name) const { return reference.tensor("transformer." + name); }
  Tensor guidance() const { return has_guidance() ? input("guidance") : Tensor(); }

  Transformer load(TransformerLoadOptions options = {}) const { return Transformer::load(*weights, config, options); }

  Tensor forward(const Transformer& model, const Tensor& timestep) const {
    return model.forward(input("hidden_states"), input("encoder_hidden_states"), timestep, guidance(),
                         model.rope(input("txt_ids"), input("img_ids")));
  }
  Tensor forward(const Transformer& model) const { return forward(model, input("timestep")); }
};

class Flux2Transformer : public ::testing::TestWithParam<std::string> {};

INSTANTIATE_TEST_SUITE_P(Families, Flux2Transformer, ::testing::Values("flux2-klein", "flux2-dev"),
                         [](const auto& info) { return info.param == "flux2-klein" ? "klein" : "dev"; });

TEST_P(Flux2Transformer, ConfigOfTheTinyModel) {
  const Fixture f(GetParam());
  const TransformerConfig c = TransformerConfig::from_json(f.config);
  EXPECT_EQ(c.inner_dim(), 32);
  EXPECT_EQ(c.mlp_hidden_dim(), 96);
  EXPECT_EQ(c.out_channels, 128);  // null in config.json: in_channels
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.num_single_layers, 2);
  EXPECT_EQ(c.axes_dims_rope, (std::vector<int64_t>{4, 4, 4, 4}));
  EXPECT_DOUBLE_EQ(c.rope_theta, 2000.0);
  EXPECT_EQ(c.guidance_embeds, f.has_guidance());
}

TEST_P(Flux2Transformer, F32MatchesDiffusers) {
  const Fixture f(GetParam());
  const Transformer model = f.load();
  const Tensor expected = f.input("output");
  const Tensor actual = f.forward(model);
  EXPECT_EQ(actual.dtype(), DType::F32);
  EXPECT_MATCHES_FIXTURE(actual, expected);
  const testing::Comparison cmp = testing::compare(actual, expected.to_doubles());
  std::printf("[ flux2    ] %s f32: max abs %.3g (max |expected| %.3g, %.3g relative), rel L2 %.3g\n",
              GetParam().c_str(), cmp.max_abs, cmp.max_expected, cmp.max_abs / cmp.max_expected, cmp.rel_l2);
}

// In bf16 diffusers casts the timestep to bf16 and multiplies by 1000 there: sigma 0.75 embeds as
// 752, not 750, which alone moves the tiny model's output by ~15% (relative L2). The bf16 path
// mirrors that, so it is checked against the f32 path fed 0.752, which the f32 test ties to diffusers.
TEST_P(Flux2Transformer, Bf16MatchesF32WithDiffusersTimestepRounding) {
  const Fixture f(GetParam());
  TransformerLoadOptions bf16;
  bf16.compute_dtype = DType::BF16;
  const Transformer model = f.load(bf16);
  const Tensor actual = f.forward(model);
  EXPECT_EQ(actual.dtype(), DType::BF16);
  const Tensor rounded_timestep = Tensor::from_floats(std::vector<float>{0.752f}, {1});
  const Tensor expected = f.forward(f.load(), rounded_timestep);
  const testing::Comparison cmp = testing::compare(actual, expected.to_doubles());
  const testing::Comparison against_fixture = testing::compare(actual, f.input("output").to_doubles());
  std::printf("[ flux2    ] %s bf16: rel L2 %.3g against f32 at sigma 0.752 (%.3g against the f32 fixture at 0.75)\n",
              GetParam().c_str(), cmp.rel_l2, against_fixture.rel_l2);
  EXPECT_LT(cmp.rel_l2, 2e-2) << cmp.describe();
  // The rounding is diffusers': 0.75 and 0.752 both embed as 752, so the bf16 outputs are identical.
  EXPECT_EQ(testing::values(actual), testing::values(f.forward(model, rounded_timestep)));
  // Both roundings count: 0.7581 is first rounded to 0.7578125, so it embeds as 756 like 0.756
  // does (rounding 758.1 alone would give 760).
  auto at = [&](float sigma) {
    return testing::values(f.forward(model, Tensor::from_floats(std::vector<float>{sigma}, {1})));
  };
  EXPECT_EQ(at(0.7581f), at(0.756f));
  EXPECT_NE(at(0.7581f), at(0.76f));
}

TEST_P(Flux2Transformer, Fp8LinearsStayCloseToF32) {
  const Fixture f(GetParam());
  TransformerLoadOptions fp8;
  fp8.fp8_linear = true;
  const Transformer model = f.load(fp8);
  const Transformer reference_model = f.load();
  EXPECT_LT(model.weight_bytes(), reference_model.weight_bytes());
  const Tensor actual = f.forward(model);
  const testing::Comparison cmp = testing::compare(actual, f.input("output").to_doubles());
  std::printf("[ flux2    ] %s fp8 linears (f32 activations): rel L2 %.3g, weights %zu -> %zu bytes\n",
              GetParam().c_str(), cmp.rel_l2, reference_model.weight_bytes(), model.weight_bytes());
  EXPECT_LT(cmp.rel_l2, 5e-2) << cmp.describe();

  // FP8 weights with bf16 activations, against f32 at diffusers' bf16 timestep (see the bf16 test).
  TransformerLoadOptions fp8_bf16;
  fp8_bf16.compute_dtype = DType::BF16;
  fp8_bf16.fp8_linear = true;
  const Tensor bf16_actual = f.forward(f.load(fp8_bf16));
  const Tensor expected = f.forward(reference_model, Tensor::from_floats(std::vector<float>{0.752f}, {1}));
  const testing::Comparison bf16_cmp = testing::compare(bf16_actual, expected.to_doubles());
  std::printf("[ flux2    ] %s fp8 linears (bf16 activations): rel L2 %.3g\n", GetParam().c_str(), bf16_cmp.rel_l2);
  EXPECT_LT(bf16_cmp.rel_l2, 5e-2) << bf16_cmp.describe();
}

// Each batch row gets its own timestep (and modulation): a batch of two equals two single runs.
TEST_P(Flux2Transformer, BatchRowsAreIndependent) {
  const Fixture f(GetParam());
  const Transformer model = f.load();
  const Tensor x = f.input("hidden_states"), text = f.input("encoder_hidden_states");
  const Tensor other_x = ops::scale(x, -0.5f), other_text = ops::scale(text, 2.0f);
  const Tensor timesteps = Tensor::from_floats(std::vector<float>{0.75f, 0.3f}, {2});
  Tensor guidance;
  if (f.has_guidance()) guidance = Tensor::from_floats(std::vector<float>{4.0f, 2.5f}, {2});
  const ops::RopeTable rope = model.rope(f.input("txt_ids"), f.input("img_ids"));
  const Tensor both =
      model.forward(ops::concat({x, other_x}, 0), ops::concat({text, other_text}, 0), timesteps, guidance, rope);
  ASSERT_EQ(both.shape(), (Shape{2, 48, 128}));
  EXPECT_MATCHES_FIXTURE(both.narrow(0, 0, 1), f.input("output"));
  const Tensor second = model.forward(other_x, other_text, timesteps.narrow(0, 1, 1),
                                      guidance.defined() ? guidance.narrow(0, 1, 1) : Tensor(), rope);
  EXPECT_MATCHES_FIXTURE(both.narrow(0, 1, 1), second);
}

TEST_P(Flux2Transformer, PositionIdsEqualThePipelines) {
  const Fixture f(GetParam());
  const Tensor img_ids = f.input("img_ids");
  const Tensor txt_ids = f.input("txt_ids");
  EXPECT_EQ(testing::values(flux2::prepare_latent_ids(1, {6, 8})), testing::values(img_ids));
  EXPECT_EQ(flux2::prepare_latent_ids(1, {6, 8}).shape(), img_ids.shape());
  EXPECT_EQ(testing::values(flux2::prepare_text_ids(1, 20)), testing::values(txt_ids));
  EXPECT_EQ(flux2::prepare_text_ids(1, 20).shape(), txt_ids.shape());
}

TEST(Flux2PositionIds, ReferenceImagesAreOffsetInTime) {
  // _prepare_image_ids([1x2 grid, 2x1 grid]): T = 10 for the first image, 20 for the second.
  const Tensor ids = flux2::prepare_image_ids({{1, 2}, {2, 1}});
  ASSERT_EQ(ids.shape(), (Shape{1, 4, 4}));
  EXPECT_EQ(testing::values(ids), (std::vector<double>{10, 0, 0, 0, 10, 0, 1, 0, 20, 0, 0, 0, 20, 1, 0, 0}));
  const Tensor batched = flux2::prepare_latent_ids(2, {2, 3});
  ASSERT_EQ(batched.shape(), (Shape{2, 6, 4}));
  EXPECT_EQ(testing::values(batched.select(0, 1)), testing::values(batched.select(0, 0)));
  testing::expect_error([] { flux2::prepare_image_ids({}); }, {"no reference images"});
  testing::expect_error([] { flux2::prepare_latent_ids(1, {0, 4}); }, {"0 x 4"});
}

// ---- Errors

// The fixture config with `field` replaced by `value` (JSON text).
JsonConfig config_with(const JsonConfig& config, const std::string& field, const std::string& value) {
  nlohmann::json json = config.json();
  json[field] = nlohmann::json::parse(value);
  return JsonConfig::parse(json.dump(), "modified/config.json");
}

TEST(Flux2TransformerErrors, BadConfigFieldsAreNamed) {
  const Fixture f("flux2-klein");
  auto expect_refused = [&](const std::string& field, const std::string& value, const std::string& fragment) {
    SCOPED_TRACE(field + " = " + value);
    testing::expect_error([&] { TransformerConfig::from_json(config_with(f.config, field, value)); },
                          {"modified/config.json", field, fragment});
  };
  expect_refused("axes_dims_rope", "[4, 4, 4, 2]", "sums to 14 but attention_head_dim is 16");
  expect_refused("axes_dims_rope", "[5, 3, 4, 4]", "positive and even");
  expect_refused("num_attention_heads", "0", "must be positive");
  expect_refused("timestep_guidance_channels", "255", "must be even");
  expect_refused("mlp_ratio", "-1.0", "positive MLP width");
  expect_refused("rope_theta", "0", "must be > 0");
  expect_refused("guidance_embeds", "\"yes\"", "guidance_embeds");
  expect_refused("_class_name", "\"FluxTransformer2DModel\"", "expected \"Flux2Transformer2DModel\"");
  testing::expect_error([&] { f.load({DType::F16, false}); }, {"compute dtype must be f32 or bf16"});
}

// The fixture's tensors in memory, `replaced` swapped in (or dropped when undefined) by name.
TensorMap weights_with(const TensorSource& source, const std::string& name, const Tensor& replacement) {
  TensorMap map("modified weights");
  for (const std::string& n : source.names()) {
    if (n != name) map.add(n, source.tensor(n));
  }
  if (replacement.defined()) map.add(name, replacement);
  return map;
}

TEST(Flux2TransformerErrors, BadWeightsAreNamed) {
  const Fixture klein("flux2-klein");
  const std::string proj = "single_transformer_blocks.1.attn.to_qkv_mlp_proj.weight";
  const TensorMap wrong_shape = weights_with(*klein.weights, proj, Tensor::zeros({287, 32}, DType::F32));
  testing::expect_error([&] { Transformer::load(wrong_shape, klein.config, {}); },
                        {"modified weights", proj, "[287, 32]", "[288, 32]"});
  const std::string norm = "transformer_blocks.0.attn.norm_added_k.weight";
  const TensorMap missing = weights_with(*klein.weights, norm, Tensor());
  testing::expect_error([&] { Transformer::load(missing, klein.config, {}); }, {norm, "missing"});
  // dev's checkpoint under klein's config: the guidance embedder is not expected.
  const Fixture dev("flux2-dev");
  testing::expect_error([&] { Transformer::load(*dev.weights, klein.config, {}); },
                        {"time_guidance_embed.guidance_embedder.linear_1.weight", "unexpected"});
}

TEST(Flux2TransformerErrors, BadInputsAreNamed) {
  const Fixture klein("flux2-klein"), dev("flux2-dev");
  const Transformer klein_model = klein.load(), dev_model = dev.load();
  const Tensor hidden = klein.input("hidden_states"), text = klein.input("encoder_hidden_states");
  const Tensor timestep = klein.input("timestep");
  const ops::RopeTable rope = klein_model.rope(klein.input("txt_ids"), klein.input("img_ids"));
  testing::expect_error(
      [&] { dev_model.forward(hidden, dev.input("encoder_hidden_states"), timestep, Tensor(), rope); },
      {"guidance is required"});
  testing::expect_error([&] { klein_model.forward(hidden, text, timestep, dev.input("guidance"), rope); },
                        {"guidance was given", "guidance_embeds is false"});
  testing::expect_error([&] { klein_model.forward(hidden.narrow(2, 0, 64), text, timestep, Tensor(), rope); },
                        {"hidden_states", "[1, 48, 64]"});
  testing::expect_error([&] { klein_model.forward(hidden, text.narrow(1, 0, 19), timestep, Tensor(), rope); },
                        {"RoPE table", "19 text + 48 image tokens"});
  testing::expect_error([&] { klein_model.forward(hidden, text.narrow(2, 0, 95), timestep, Tensor(), rope); },
                        {"encoder_hidden_states", "[1, 20, 95]"});
  testing::expect_error([&] { klein_model.forward(hidden, text, Tensor::zeros({2}, DType::F32), Tensor(), rope); },
                        {"timestep must be [1]", "[2]"});
  testing::expect_error([&] { klein_model.rope(klein.input("txt_ids").narrow(2, 0, 3), klein.input("img_ids")); },
                        {"txt_ids", "3 coordinates", "4 axes"});
}

}  // namespace
}  // namespace xdit
