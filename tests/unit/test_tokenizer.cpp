// The byte-level BPE tokenizer: exact ids against the reference fixtures (the chat-formatted text
// the pipelines feed the tokenizer), decode round trips, added tokens and load/encode errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "support/files.h"
#include "support/fixtures.h"
#include "support/reference.h"
#include "xdit/text/tokenizer.h"

namespace fs = std::filesystem;
using namespace xdit;
using namespace xdit::testing;

namespace {

fs::path tokenizer_path(std::string_view family) { return fixture_model_dir(family) / "tokenizer" / "tokenizer.json"; }

const Tokenizer& klein() {
  static const Tokenizer tokenizer = Tokenizer::load(tokenizer_path("flux2-klein"));
  return tokenizer;
}

// A copy of the klein tokenizer.json with `edit` applied, written to a scratch file.
fs::path edited_tokenizer(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(read_text(tokenizer_path("flux2-klein")));
  edit(j);
  fs::path path = scratch_folder(name) / "tokenizer.json";
  write_text(path, j.dump());
  return path;
}

}  // namespace

class TokenizerFixture : public ::testing::TestWithParam<std::string> {};

// Every recorded prompt (ascii, unicode, empty, long): our ids equal the pipeline's unpadded ids.
TEST_P(TokenizerFixture, MatchesReferenceIds) {
  const ReferenceFile ref = ReferenceFile::load(GetParam());
  const Tokenizer tokenizer = Tokenizer::load(tokenizer_path(GetParam()));
  const nlohmann::json& cases = ref.sidecar().json().at("tokens");
  ASSERT_FALSE(cases.empty());
  for (const auto& [name, info] : cases.items()) {
    SCOPED_TRACE(name);
    const std::vector<double> expected = values(ref.tensor("tokens." + name + ".input_ids"));
    const size_t valid = info.at("valid_tokens").get<size_t>();
    const std::vector<int64_t> ids = tokenizer.encode(info.at("formatted").get<std::string>());
    EXPECT_EQ(ids.size(), info.at("untruncated_tokens").get<size_t>());
    ASSERT_GE(ids.size(), valid);
    ASSERT_GE(expected.size(), valid);
    for (size_t i = 0; i < valid; ++i) ASSERT_EQ(static_cast<double>(ids[i]), expected[i]) << "token " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, TokenizerFixture, ::testing::Values("flux2-klein", "z-image", "qwen-image"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::erase(name, '-');
                           return name;
                         });

// The sidecars' formatted text is the MODELS.md chat template around the prompt.
TEST(Tokenizer, FixturesUseTheChatTemplates) {
  for (const auto& [family, tail] : {std::pair{"flux2-klein", "<think>\n\n</think>\n\n"}, std::pair{"z-image", ""}}) {
    const ReferenceFile ref = ReferenceFile::load(family);  // owns the JSON that `cases` refers to
    const nlohmann::json& cases = ref.sidecar().json().at("tokens");
    for (const auto& [name, info] : cases.items()) {
      const std::string p = info.at("prompt").get<std::string>();
      EXPECT_EQ(info.at("formatted").get<std::string>(),
                "<|im_start|>user\n" + p + "<|im_end|>\n<|im_start|>assistant\n" + tail)
          << family << " " << name;
    }
  }
}

TEST(Tokenizer, TruncatesToMaxLength) {
  const std::string text = "<|im_start|>user\nA red fox jumps over a sleeping dog.<|im_end|>";
  const std::vector<int64_t> all = klein().encode(text);
  ASSERT_GT(all.size(), 5u);
  EXPECT_EQ(klein().encode(text, 5), std::vector<int64_t>(all.begin(), all.begin() + 5));
  EXPECT_EQ(klein().encode(text, 1000), all);
  EXPECT_TRUE(klein().encode(text, 0).empty());
}

TEST(Tokenizer, DecodeInvertsEncodeUpToNfc) {
  for (const std::string text :
       {"A red fox, 10% off!\n\n  tabs\there", "東京の夜景 🌃 한국어 👩\u200d🚀", "It's 3.14!"})
    EXPECT_EQ(klein().decode(klein().encode(text)), text);
  // "e" + combining acute and "n" + combining tilde compose under NFC.
  EXPECT_EQ(klein().decode(klein().encode("cafe\u0301 man\u0303ana")), "caf\u00e9 ma\u00f1ana");
  EXPECT_TRUE(klein().encode("").empty());
  EXPECT_EQ(klein().decode({}), "");
}

TEST(Tokenizer, AddedTokensRoundTrip) {
  const nlohmann::json j = nlohmann::json::parse(read_text(tokenizer_path("flux2-klein")));
  ASSERT_FALSE(j.at("added_tokens").empty());
  for (const auto& t : j.at("added_tokens")) {
    const std::string content = t.at("content").get<std::string>();
    const int64_t id = t.at("id").get<int64_t>();
    EXPECT_EQ(klein().encode(content), std::vector<int64_t>{id}) << content;
    EXPECT_EQ(klein().token_id(content), id);
    EXPECT_EQ(klein().decode(std::vector<int64_t>{id}), content);
    // Recognised inside text with no spaces around it.
    const std::vector<int64_t> inside = klein().encode("ab" + content + "cd");
    EXPECT_NE(std::find(inside.begin(), inside.end(), id), inside.end()) << content;
    EXPECT_EQ(klein().decode(inside), "ab" + content + "cd");
  }
}

TEST(Tokenizer, LoadErrorsNameThePathAndField) {
  expect_error([] { Tokenizer::load("/nonexistent/tokenizer.json"); }, {"/nonexistent/tokenizer.json"});

  const fs::path bad_json = scratch_folder("tok_bad_json") / "tokenizer.json";
  write_text(bad_json, "{\"model\": ");
  expect_error([&] { Tokenizer::load(bad_json); }, {bad_json.string(), "invalid JSON"});

  const fs::path nfkc = edited_tokenizer("tok_nfkc",
                                         [](nlohmann::json& j) { j["normalizer"] = {{"type", "NFKC"}}; });
  expect_error([&] { Tokenizer::load(nfkc); }, {nfkc.string(), "normalizer", "NFKC"});

  const fs::path meta = edited_tokenizer("tok_meta",
                                         [](nlohmann::json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}}; });
  expect_error([&] { Tokenizer::load(meta); }, {meta.string(), "pre_tokenizer", "Metaspace"});

  const fs::path merges = edited_tokenizer("tok_merges",
                                         [](nlohmann::json& j) { j["model"]["merges"][0] = "notatoken x"; });
  expect_error([&] { Tokenizer::load(merges); }, {merges.string(), "model.merges", "notatoken"});

  const fs::path decoder = edited_tokenizer("tok_decoder",
                                         [](nlohmann::json& j) { j["decoder"] = {{"type", "WordPiece"}}; });
  expect_error([&] { Tokenizer::load(decoder); }, {decoder.string(), "decoder", "WordPiece"});

  const fs::path flag = edited_tokenizer("tok_flag", [](nlohmann::json& j) {
    j["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = "yes";
  });
  expect_error([&] { Tokenizer::load(flag); }, {flag.string(), "unexpected JSON value"});
}

TEST(Tokenizer, RejectsInvalidUtf8) {
  expect_error([] { klein().encode("ab\xff" "cd"); }, {"not valid UTF-8", "offset 2"});
  expect_error([] { klein().encode("\xe6\x9d"); }, {"not valid UTF-8"});   // truncated sequence
  expect_error([] { klein().encode("\xed\xa0\x80"); }, {"not valid UTF-8"});  // a surrogate
  expect_error([] { klein().decode(std::vector<int64_t>{klein().vocab_size()}); }, {"unknown token id"});
}

// Pair merges in the newer ["a", "b"] form give the same ids as "a b" strings.
TEST(Tokenizer, AcceptsPairMerges) {
  const fs::path pairs = edited_tokenizer("tok_pairs", [](nlohmann::json& j) {
    for (auto& m : j["model"]["merges"]) {
      if (!m.is_string()) continue;
      const std::string s = m.get<std::string>();
      m = nlohmann::json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
    }
  });
  const std::string text = "<|im_start|>user\nA red fox jumps over a sleeping dog 東京.<|im_end|>";
  EXPECT_EQ(Tokenizer::load(pairs).encode(text), klein().encode(text));
}

// ByteLevel with its own GPT-2 regex and add_prefix_space: plain ASCII words split as with the
// Qwen2 pattern, after a space is put in front.
TEST(Tokenizer, ByteLevelRegexWithPrefixSpace) {
  const fs::path gpt2 = edited_tokenizer("tok_gpt2", [](nlohmann::json& j) {
    j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  });
  EXPECT_EQ(Tokenizer::load(gpt2).encode("A red fox jumps"), klein().encode(" A red fox jumps"));
}

// lstrip/rstrip added tokens take the whitespace next to them.
TEST(Tokenizer, AddedTokenStripFlags) {
  const fs::path strip = edited_tokenizer("tok_strip", [](nlohmann::json& j) {
    j["added_tokens"][0]["lstrip"] = true;
    j["added_tokens"][0]["rstrip"] = true;
  });
  const Tokenizer tokenizer = Tokenizer::load(strip);
  const int64_t id = tokenizer.token_id("<|endoftext|>");
  std::vector<int64_t> expected = klein().encode("a");
  expected.push_back(id);
  const std::vector<int64_t> b = klein().encode("b");
  expected.insert(expected.end(), b.begin(), b.end());
  EXPECT_EQ(tokenizer.encode("a \t<|endoftext|>\n b"), expected);
}
