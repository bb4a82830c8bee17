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
#include "xdit/text/chat_template.h"
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

INSTANTIATE_TEST_SUITE_P(Families, TokenizerFixture,
                         ::testing::Values("flux2-klein", "flux2-dev", "z-image", "qwen-image"),
                         [](const auto& info) {
                           std::string name = info.param;
                           std::erase(name, '-');
                           return name;
                         });

// The sidecars' formatted text is what chat::qwen and chat::mistral build around the prompt:
// klein with enable_thinking=False, Z-Image with True, Qwen-Image's own template (a system turn),
// FLUX.2 dev's system message and user turn after the bos token.
TEST(ChatTemplate, RebuildsTheFixturesFormattedText) {
  struct Case {
    const char* family;
    std::function<std::string(const std::string&)> format;
  };
  const std::string describe =
      "Describe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of "
      "the objects and background:";
  const std::string system =
      "You are an AI that reasons about image descriptions. You give structured responses focusing on object "
      "relationships, object\nattribution and actions without speculation.";
  const Case cases[] = {
      {"flux2-klein", [](const std::string& p) { return chat::qwen({{"user", p}}, true, false); }},
      {"z-image", [](const std::string& p) { return chat::qwen({{"user", p}}, true, true); }},
      {"qwen-image", [&](const std::string& p) { return chat::qwen({{"system", describe}, {"user", p}}, true, true); }},
      {"flux2-dev", [&](const std::string& p) { return chat::mistral({{"system", system}, {"user", p}}, "<s>"); }},
  };
  for (const Case& c : cases) {
    const ReferenceFile ref = ReferenceFile::load(c.family);  // owns the JSON that `tokens` refers to
    const nlohmann::json& tokens = ref.sidecar().json().at("tokens");
    ASSERT_FALSE(tokens.empty());
    for (const auto& [name, info] : tokens.items())
      EXPECT_EQ(c.format(info.at("prompt").get<std::string>()), info.at("formatted").get<std::string>())
          << c.family << " " << name;
  }
}

TEST(ChatTemplate, GenerationPromptAndRoles) {
  EXPECT_EQ(chat::qwen({{"user", "hi"}}, false, false), "<|im_start|>user\nhi<|im_end|>\n");
  EXPECT_EQ(chat::qwen({}, true, true), "<|im_start|>assistant\n");
  EXPECT_EQ(chat::mistral({{"user", "a"}, {"user", "b"}}, "<s>"), "<s>[INST]a[/INST][INST]b[/INST]");
  expect_error([] { chat::qwen({{"assistant", "x"}}, true, false); }, {"Qwen", "\"assistant\""});
  expect_error([] { chat::mistral({{"tool", "x"}}, "<s>"); }, {"Mistral", "\"tool\""});
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

// Tekken's TemplateProcessing "<s> $A": add_special_tokens=True puts <s> in front; the Qwen
// template adds nothing. Plain encode() never adds them (apply_chat_template's tokenization).
TEST(Tokenizer, PostProcessorTemplateAddsSpecialTokens) {
  const Tokenizer tekken = Tokenizer::load(tokenizer_path("flux2-dev"));
  const std::vector<int64_t> ids = tekken.encode("A red fox");
  ASSERT_FALSE(ids.empty());
  EXPECT_NE(ids.front(), tekken.token_id("<s>"));
  std::vector<int64_t> expected{tekken.token_id("<s>")};
  expected.insert(expected.end(), ids.begin(), ids.end());
  EXPECT_EQ(tekken.with_special_tokens(ids), expected);
  EXPECT_EQ(tekken.with_special_tokens({}), std::vector<int64_t>{tekken.token_id("<s>")});
  EXPECT_EQ(klein().with_special_tokens(ids), ids);

  // A Sequence of processors wraps in order: the second template goes around the first.
  const fs::path nested = edited_tokenizer("tok_nested_template", [](nlohmann::json& j) {
    const nlohmann::json wrap = {
        {"type", "TemplateProcessing"},
        {"single",
         {{{"SpecialToken", {{"id", "<|im_start|>"}}}},
          {{"Sequence", {{"id", "A"}}}},
          {{"SpecialToken", {{"id", "<|im_end|>"}}}}}},
        {"special_tokens", {{"<|im_start|>", {{"ids", {641}}}}, {"<|im_end|>", {{"ids", {642}}}}}}};
    const nlohmann::json eot = {{"type", "TemplateProcessing"},
                                {"single", {{{"Sequence", {{"id", "A"}}}}, {{"SpecialToken", {{"id", "e"}}}}}},
                                {"special_tokens", {{"e", {{"ids", {640}}}}}}};
    j["post_processor"] = {{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}}, eot, wrap}}};
  });
  EXPECT_EQ(Tokenizer::load(nested).with_special_tokens(std::vector<int64_t>{7, 8}),
            (std::vector<int64_t>{641, 7, 8, 640, 642}));
}

TEST(Tokenizer, PostProcessorErrorsNameTheField) {
  const fs::path bert = edited_tokenizer("tok_bert", [](nlohmann::json& j) {
    j["post_processor"] = {{"type", "BertProcessing"}};
  });
  expect_error([&] { Tokenizer::load(bert); }, {bert.string(), "post_processor.type", "BertProcessing"});

  const fs::path unknown = edited_tokenizer("tok_template_id", [](nlohmann::json& j) {
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
                           {"special_tokens", {{"<s>", {{"ids", {99999}}}}}}};
  });
  expect_error([&] { Tokenizer::load(unknown); }, {unknown.string(), "post_processor.special_tokens", "99999"});

  const fs::path missing = edited_tokenizer("tok_template_missing", [](nlohmann::json& j) {
    j["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
                           {"special_tokens", nlohmann::json::object()}};
  });
  expect_error([&] { Tokenizer::load(missing); }, {missing.string(), "post_processor.special_tokens", "<s>"});

  const fs::path no_sequence = edited_tokenizer("tok_template_no_a", [](nlohmann::json& j) {
    j["post_processor"] = {{"type", "TemplateProcessing"}, {"single", nlohmann::json::array()}};
  });
  expect_error([&] { Tokenizer::load(no_sequence); }, {no_sequence.string(), "post_processor.single"});
}

// padding="max_length", truncation=True: cut to the length, right-padded, mask 1 then 0.
TEST(Tokenizer, EncodePaddedTruncatesAndPads) {
  const std::string short_text = "A red fox", long_text = "A red fox jumps over a sleeping dog at the edge.";
  const std::vector<int64_t> a = klein().encode(short_text), b = klein().encode(long_text);
  const size_t length = a.size() + 3;
  ASSERT_GT(b.size(), length);
  const int64_t pad = klein().token_id("<|endoftext|>");
  const PaddedTokens t = klein().encode_padded({short_text, long_text}, length, pad);
  ASSERT_EQ(t.input_ids.shape(), (Shape{2, static_cast<int64_t>(length)}));
  ASSERT_EQ(t.input_ids.dtype(), DType::I64);
  ASSERT_EQ(t.attention_mask.dtype(), DType::I64);
  std::vector<double> ids0(a.begin(), a.end()), mask0(a.size(), 1.0);
  ids0.insert(ids0.end(), 3, static_cast<double>(pad));
  mask0.insert(mask0.end(), 3, 0.0);
  const std::vector<double> ids1(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(length)), mask1(length, 1.0);
  EXPECT_EQ(values(t.input_ids.select(0, 0)), ids0);
  EXPECT_EQ(values(t.attention_mask.select(0, 0)), mask0);
  EXPECT_EQ(values(t.input_ids.select(0, 1)), ids1);
  EXPECT_EQ(values(t.attention_mask.select(0, 1)), mask1);
  EXPECT_EQ(t.untruncated_tokens,
            (std::vector<int64_t>{static_cast<int64_t>(a.size()), static_cast<int64_t>(b.size())}));

  expect_error([] { klein().encode_padded({"a"}, 0, 640); }, {"length must be > 0"});
  expect_error([] { klein().encode_padded({"a"}, 4, klein().vocab_size()); }, {"padding id"});
}

TEST(Tokenizer, ConfigReadsTheSpecialTokens) {
  const TokenizerConfig qwen =
      TokenizerConfig::load(tokenizer_path("flux2-klein").parent_path() / "tokenizer_config.json");
  EXPECT_EQ(qwen.pad_token, "<|endoftext|>");
  EXPECT_EQ(qwen.eos_token, "<|im_end|>");
  EXPECT_FALSE(qwen.bos_token.has_value());  // null in Qwen's config
  const TokenizerConfig tekken =
      TokenizerConfig::load(tokenizer_path("flux2-dev").parent_path() / "tokenizer_config.json");
  EXPECT_EQ(tekken.bos_token, "<s>");
  EXPECT_EQ(tekken.pad_token, "<pad>");

  const fs::path object = scratch_folder("tok_config_object") / "tokenizer_config.json";
  write_text(object, R"({"pad_token": {"__type": "AddedToken", "content": "<pad>", "lstrip": false}})");
  EXPECT_EQ(TokenizerConfig::load(object).pad_token, "<pad>");

  EXPECT_EQ(tekken.padding_side, "right");
  EXPECT_EQ(tekken.truncation_side, "right");

  const fs::path left = scratch_folder("tok_config_left") / "tokenizer_config.json";
  write_text(left, R"({"pad_token": "<pad>", "padding_side": "left", "truncation_side": "left"})");
  EXPECT_EQ(TokenizerConfig::load(left).padding_side, "left");
  EXPECT_EQ(TokenizerConfig::load(left).truncation_side, "left");
  const fs::path middle = scratch_folder("tok_config_middle") / "tokenizer_config.json";
  write_text(middle, R"({"padding_side": "middle"})");
  expect_error([&] { TokenizerConfig::load(middle); }, {middle.string(), "padding_side", "middle"});
  const fs::path number = scratch_folder("tok_config_number") / "tokenizer_config.json";
  write_text(number, R"({"pad_token": 3})");
  expect_error([&] { TokenizerConfig::load(number); }, {number.string(), "pad_token"});
  expect_error([] { TokenizerConfig::load("/nonexistent/tokenizer_config.json"); },
               {"/nonexistent/tokenizer_config.json"});
}

TEST(Tokenizer, ConfigReadsModelMaxLength) {
  const auto load = [](const std::string& name, const std::string& text) {
    const fs::path path = scratch_folder(name) / "tokenizer_config.json";
    write_text(path, text);
    return path;
  };
  EXPECT_EQ(TokenizerConfig::load(load("tok_max_64", R"({"model_max_length": 64})")).model_max_length, 64);
  EXPECT_FALSE(TokenizerConfig::load(load("tok_max_none", "{}")).model_max_length.has_value());
  // transformers' VERY_LARGE_INTEGER, int(1e30), is its "no limit".
  EXPECT_FALSE(TokenizerConfig::load(load("tok_max_huge", R"({"model_max_length": 1000000000000000019884624838656})"))
                   .model_max_length.has_value());
  const fs::path zero = load("tok_max_zero", R"({"model_max_length": 0})");
  expect_error([&] { TokenizerConfig::load(zero); }, {zero.string(), "model_max_length", "positive"});
  const fs::path text = load("tok_max_text", R"({"model_max_length": "64"})");
  expect_error([&] { TokenizerConfig::load(text); }, {text.string(), "model_max_length"});
}
