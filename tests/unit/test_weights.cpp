// Weight binding: declarations under prefixes, zero-copy views, optional and ignored tensors,
// dtype conversion, and one error that lists every problem by name.
#include <gtest/gtest.h>

#include <filesystem>

#include "support/files.h"
#include "support/reference.h"
#include "xdit/io/safetensors.h"
#include "xdit/io/weights.h"

namespace fs = std::filesystem;
using namespace xdit;

namespace xt = xdit::testing;
using xt::error_of;

namespace {

// The tensors of a tiny two-block model.
TensorMap tiny_model() {
  TensorMap m("tiny.safetensors");
  m.add("proj_in.weight", Tensor::full({8, 4}, 1.0f, DType::BF16));
  m.add("proj_in.bias", Tensor::full({8}, 2.0f, DType::BF16));
  for (int i = 0; i < 2; ++i) {
    const std::string p = "blocks." + std::to_string(i) + ".";
    m.add(p + "attn.to_q.weight", Tensor::full({8, 8}, 0.5f, DType::BF16));
    m.add(p + "norm.weight", Tensor::full({8}, 1.0f, DType::F32));
  }
  m.add("pos_ids", Tensor::zeros({4}, DType::I64));
  return m;
}

struct Block {
  Tensor to_q, norm;
  void bind(WeightBinder b) {
    b.declare("attn.to_q.weight", {8, 8}, &to_q);
    b.declare("norm.weight", {8}, &norm);
  }
};

struct TinyModel {
  Tensor proj_w, proj_b, pos_ids;
  Block blocks[2];
  void bind(WeightBinder& root) {
    root.declare("proj_in.weight", {8, 4}, &proj_w);
    root.declare("proj_in.bias", {8}, &proj_b, DTypeSet::floating(), /*optional=*/true);
    root.declare("pos_ids", {-1}, &pos_ids, DTypeSet::integer());
    for (int i = 0; i < 2; ++i) blocks[i].bind(root.scoped("blocks." + std::to_string(i) + "."));
  }
};

}  // namespace

TEST(weights, BindsZeroCopyViewsUnderPrefixes) {
  const TensorMap source = tiny_model();
  TinyModel model;
  WeightBinder root(source);
  model.bind(root);
  root.finish();
  EXPECT_TRUE(model.proj_w.shares_storage_with(source.tensor("proj_in.weight")));
  EXPECT_TRUE(model.blocks[1].to_q.shares_storage_with(source.tensor("blocks.1.attn.to_q.weight")));
  EXPECT_EQ(model.blocks[0].norm.dtype(), DType::F32) << "stored dtype kept";
  EXPECT_EQ(model.pos_ids.shape(), (Shape{4})) << "-1 matches any size";
  EXPECT_EQ(root.scoped("blocks.0.").scoped("attn.").prefix(), "blocks.0.attn.");
}

TEST(weights, BindsViewsOfTheMappedFile) {
  const fs::path dir = xt::scratch_folder("weights_BindsViewsOfTheMappedFile");
  const std::string path = (dir / "w.safetensors").string();
  write_safetensors(path, {{"w", Tensor::full({2, 3}, 4.0f, DType::BF16)}});
  Tensor w;
  {
    const SafetensorsFile file = SafetensorsFile::open(path);
    WeightBinder b(file);
    b.declare("w", {2, 3}, &w);
    b.finish();
    EXPECT_EQ(w.raw_data(), file.tensor("w").raw_data()) << "a view into the mapping, not a copy";
  }
  EXPECT_EQ(w.to_floats(), std::vector<float>(6, 4.0f)) << "the view keeps the mapping alive";
}

TEST(weights, ReportsEveryProblemAtOnce) {
  TensorMap source("model.safetensors");
  source.add("a.weight", Tensor::zeros({4, 4}, DType::BF16));
  source.add("b.weight", Tensor::zeros({4, 5}, DType::BF16));
  source.add("c.weight", Tensor::zeros({4}, DType::I64));
  source.add("stray.weight", Tensor::zeros({1}, DType::BF16));
  source.add("blocks.0.extra", Tensor::zeros({1}, DType::BF16));
  Tensor a, b, c, d, e;
  WeightBinder root(source);
  root.declare("a.weight", {4, 4}, &a);
  root.declare("b.weight", {4, 4}, &b);
  root.declare("c.weight", {4}, &c);
  WeightBinder blocks = root.scoped("blocks.0.");
  blocks.declare("attn.to_k.weight", {4, 4}, &d);
  blocks.declare("attn.to_k.bias", {4}, &e, DTypeSet::floating(), /*optional=*/true);

  const std::string msg = error_of([&] { root.finish(); });
  const std::string summary = msg.substr(0, msg.find('\n'));
  EXPECT_EQ(summary,
            "5 weight problems in model.safetensors: 1 missing, 2 unexpected, 1 wrong shape, 1 wrong dtype");
  for (const std::string line : {"\n  missing: \"blocks.0.attn.to_k.weight\" [4, 4]",
                                 "\n  unexpected: \"stray.weight\"", "\n  unexpected: \"blocks.0.extra\"",
                                 "\n  wrong shape: \"b.weight\": expected [4, 4], found [4, 5]",
                                 "\n  wrong dtype: \"c.weight\": expected f32|bf16|f16|f8e4m3|f8e5m2, found i64"}) {
    EXPECT_NE(msg.find(line), std::string::npos) << "missing line " << line << " in:\n" << msg;
  }
  EXPECT_EQ(msg.find("to_k.bias"), std::string::npos) << "an absent optional tensor is not a problem";
  EXPECT_FALSE(a.defined()) << "nothing is bound when binding fails";
}

TEST(weights, OptionalAndIgnoredTensors) {
  TensorMap source("te.safetensors");
  source.add("layers.0.w", Tensor::zeros({2}, DType::F32));
  source.add("lm_head.weight", Tensor::zeros({10, 2}, DType::F32));
  Tensor w, bias;
  WeightBinder root(source);
  root.declare("layers.0.w", {2}, &w);
  root.declare("layers.0.b", {2}, &bias, DTypeSet::floating(), /*optional=*/true);
  root.ignore("lm_head.");
  EXPECT_TRUE(root.has("layers.0.w"));
  EXPECT_FALSE(root.scoped("layers.0.").has("b"));
  root.finish();
  EXPECT_TRUE(w.defined());
  EXPECT_FALSE(bias.defined());
}

TEST(weights, RootPrefixLimitsWhatMustBeDeclared) {
  const TensorMap source = tiny_model();
  Block block;
  WeightBinder root(source, "blocks.1.");
  block.bind(root);
  root.finish();  // the other tensors of the file are outside the prefix
  EXPECT_TRUE(block.to_q.shares_storage_with(source.tensor("blocks.1.attn.to_q.weight")));
}

TEST(weights, ConvertsAtBindTime) {
  const TensorMap source = tiny_model();
  TinyModel model;
  WeightBinder root(source, "", BindOptions{DType::F32});
  model.bind(root);
  root.finish();
  EXPECT_EQ(model.proj_w.dtype(), DType::F32);
  EXPECT_FALSE(model.proj_w.shares_storage_with(source.tensor("proj_in.weight"))) << "converted copy";
  EXPECT_EQ(model.proj_b.to_floats(), std::vector<float>(8, 2.0f));
  EXPECT_TRUE(model.blocks[0].norm.shares_storage_with(source.tensor("blocks.0.norm.weight")))
      << "already f32: kept as a view";
  EXPECT_EQ(model.pos_ids.dtype(), DType::I64) << "integer tensors are not converted";
}

TEST(weights, MisuseIsAnError) {
  const TensorMap source = tiny_model();
  Tensor t, q;
  WeightBinder root(source, "blocks.0.");
  root.declare("norm.weight", {8}, &t);
  EXPECT_THROW(root.declare("norm.weight", {8}, &t), Error);
  EXPECT_THROW(root.declare("x", {8}, nullptr), Error);
  root.declare("attn.to_q.weight", {8, 8}, &q);
  root.finish();
  EXPECT_THROW(root.finish(), Error);
  EXPECT_THROW(root.declare("y", {1}, &t), Error);
}

TEST(weights, DTypeSetNames) {
  EXPECT_EQ(DTypeSet({DType::BF16, DType::F32}).str(), "f32|bf16");
  EXPECT_EQ(DTypeSet().str(), "none");
  EXPECT_TRUE(DTypeSet::floating().contains(DType::F8E4M3));
  EXPECT_FALSE(DTypeSet::floating().contains(DType::I32));
}
