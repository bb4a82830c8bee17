// The committed parity fixtures: the hash manifest, each family's tiny diffusers repo, each reference
// file against its sidecar, the size limits, and the helpers the parity tests use (SHA-256,
// matches_fixture).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "support/fixtures.h"
#include "support/files.h"
#include "xdit/io/diffusers.h"
#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"

namespace fs = std::filesystem;
using namespace xdit;
using namespace xdit::testing;

namespace {

constexpr uint64_t kMaxModelBytes = 2'000'000;      // each tiny model
constexpr uint64_t kMaxFixtureBytes = 25'000'000;   // everything under tests/fixtures

uint64_t folder_bytes(const fs::path& folder) {
  uint64_t total = 0;
  for (const auto& entry : fs::recursive_directory_iterator(folder))
    if (entry.is_regular_file()) total += entry.file_size();
  return total;
}

std::vector<int64_t> json_shape(const nlohmann::json& shape) { return shape.get<std::vector<int64_t>>(); }

}  // namespace

// ---- SHA-256 against the FIPS 180-4 examples and block-boundary lengths ----

TEST(Sha256, StandardVectors) {
  EXPECT_EQ(sha256_hex(std::string_view("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex(std::string_view("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(std::string_view("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1'000'000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, PaddingBoundaries) {
  // 55 bytes fit the length in the same block; 56 and 63 need a second one; 64 is a full block.
  EXPECT_EQ(sha256_hex(std::string(55, 'a')), "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(sha256_hex(std::string(56, 'a')), "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(sha256_hex(std::string(63, 'a')), "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34");
  EXPECT_EQ(sha256_hex(std::string(64, 'a')), "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST(Sha256, FileMatchesBuffer) {
  const fs::path path = scratch_folder("sha256") / "data.bin";
  std::string data;
  for (int i = 0; i < 200'000; ++i) data.push_back(static_cast<char>(i * 31 + 7));
  write_text(path, data);
  EXPECT_EQ(sha256_file_hex(path), sha256_hex(data));
}

// ---- matches_fixture ----

TEST(MatchesFixture, ToleranceScalesWithTheOutput) {
  const Tensor expected = Tensor::from_floats(std::vector<float>{100.0f, -50.0f, 0.5f}, {3});
  EXPECT_TRUE(matches_fixture(Tensor::from_floats(std::vector<float>{100.005f, -50.0f, 0.5f}, {3}), expected));
  const auto failure = matches_fixture(Tensor::from_floats(std::vector<float>{100.0f, -50.0f, 0.52f}, {3}), expected);
  ASSERT_FALSE(failure);
  const std::string message = failure.message();
  EXPECT_NE(message.find("max_abs="), std::string::npos) << message;
  EXPECT_NE(message.find("rel_l2="), std::string::npos) << message;
  EXPECT_NE(message.find("worst index 2"), std::string::npos) << message;
}

TEST(MatchesFixture, ShapesAndIntegers) {
  const Tensor ids = Tensor::from_ints(std::vector<int64_t>{1, 2, 3}, {1, 3});
  EXPECT_TRUE(matches_fixture(Tensor::from_ints(std::vector<int64_t>{1, 2, 3}, {1, 3}), ids));
  EXPECT_FALSE(matches_fixture(Tensor::from_ints(std::vector<int64_t>{1, 2, 4}, {1, 3}), ids));
  EXPECT_FALSE(matches_fixture(Tensor::from_ints(std::vector<int64_t>{1, 2, 3}, {3}), ids));
}

TEST(MatchesFixture, LowPrecisionUsesRelativeL2) {
  const Tensor expected = Tensor::from_floats(std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}, {4});
  EXPECT_TRUE(matches_fixture(Tensor::from_floats(std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f}, {4}, DType::BF16),
                              expected));
  EXPECT_FALSE(matches_fixture(Tensor::from_floats(std::vector<float>{1.0f, 2.0f, 3.0f, 5.0f}, {4}, DType::BF16),
                               expected));
}

// ---- the manifest ----

TEST(FixtureManifest, EveryListedFileHasItsHashAndSize) {
  const std::vector<ManifestEntry> entries = read_manifest(fixtures_root() / "MANIFEST");
  ASSERT_FALSE(entries.empty());
  for (const ManifestEntry& entry : entries) {
    const fs::path path = fixtures_root() / entry.path;
    ASSERT_TRUE(fs::is_regular_file(path)) << entry.path << " is listed but missing";
    EXPECT_EQ(fs::file_size(path), entry.size) << entry.path;
    EXPECT_EQ(sha256_file_hex(path), entry.sha256) << entry.path << " differs from the manifest";
  }
}

TEST(FixtureManifest, EveryFileIsListedOnceInOrder) {
  const std::vector<ManifestEntry> entries = read_manifest(fixtures_root() / "MANIFEST");
  std::vector<std::string> listed;
  for (const ManifestEntry& entry : entries) listed.push_back(entry.path);
  EXPECT_TRUE(std::is_sorted(listed.begin(), listed.end()));
  EXPECT_EQ(std::set<std::string>(listed.begin(), listed.end()).size(), listed.size()) << "duplicate entries";

  std::vector<std::string> present;
  for (const auto& entry : fs::recursive_directory_iterator(fixtures_root())) {
    if (!entry.is_regular_file()) continue;
    const std::string relative = fs::relative(entry.path(), fixtures_root()).generic_string();
    if (relative != "MANIFEST") present.push_back(relative);
  }
  std::sort(present.begin(), present.end());
  EXPECT_EQ(present, listed) << "tests/fixtures and MANIFEST disagree: rerun tools/reference/make_fixtures.py";
}

TEST(FixtureManifest, SizeLimits) {
  EXPECT_LE(folder_bytes(fixtures_root()), kMaxFixtureBytes);
  for (const std::string& family : fixture_families())
    EXPECT_LT(folder_bytes(fixture_model_dir(family)), kMaxModelBytes) << family;
}

TEST(FixtureManifest, FamiliesMatchTheReferenceFolder) {
  std::set<std::string> sidecars, models;
  for (const auto& entry : fs::directory_iterator(fixtures_root() / "reference"))
    if (entry.path().extension() == ".json") sidecars.insert(entry.path().stem().string());
  for (const auto& entry : fs::directory_iterator(fixtures_root() / "models")) {
    const std::string name = entry.path().filename().string();
    models.insert(name.substr(0, name.size() - std::string("-tiny").size()));
  }
  const std::set<std::string> families(fixture_families().begin(), fixture_families().end());
  EXPECT_EQ(models, families);
  // One more reference: the bundled demo model's, whose model is models/shapes-demo.
  std::set<std::string> references = families;
  references.insert("shapes-demo");
  EXPECT_EQ(sidecars, references);
}

// ---- each family ----

class FamilyFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyFixture, ModelFolderOpensWithEveryComponent) {
  const ReferenceFile reference = ReferenceFile::load(GetParam());
  const DiffusersRepo repo = DiffusersRepo::open(fixture_model_dir(GetParam()).string());
  EXPECT_EQ(reference.model_dir(), fixture_model_dir(GetParam()));
  EXPECT_EQ(repo.pipeline_class(), reference.sidecar().get_string("pipeline"));

  const JsonConfig components = reference.sidecar().get_object("components");
  std::set<std::string> in_repo;
  for (const ComponentSpec& spec : repo.components()) in_repo.insert(spec.name);
  const std::vector<std::string> names = components.keys();
  EXPECT_EQ(in_repo, std::set<std::string>(names.begin(), names.end()));

  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const JsonConfig expected = components.get_object(name);
    EXPECT_EQ(repo.component(name).class_name, expected.get_string("class"));
    if (name.starts_with("tokenizer")) {
      // tokenizer.json is the file the engine's tokenizer reads.
      const std::string path = repo.component_file(name, "tokenizer.json");
      EXPECT_NO_THROW(parse_json(read_text_file(path), path));
      EXPECT_NO_THROW(JsonConfig::load(repo.component_file(name, "tokenizer_config.json")));
      continue;
    }
    EXPECT_NO_THROW(repo.component_config(name));
    if (!expected.has("tensors")) continue;
    const auto weights = repo.component_weights(name);
    EXPECT_EQ(static_cast<int64_t>(weights->names().size()), expected.get_int("tensors"));
    EXPECT_EQ(weight_stats(*weights).params, expected.get_int("elements"));
  }
}

TEST_P(FamilyFixture, ReferenceTensorsMatchTheSidecar) {
  const ReferenceFile reference = ReferenceFile::load(GetParam());
  const nlohmann::json& declared = reference.sidecar().json().at("tensors");
  ASSERT_FALSE(declared.empty());
  std::set<std::string> declared_names;
  for (const auto& [name, info] : declared.items()) {
    SCOPED_TRACE(name);
    declared_names.insert(name);
    ASSERT_TRUE(reference.has(name));
    const TensorInfo& actual = reference.file().info(name);
    EXPECT_EQ(safetensors_dtype_name(actual.dtype), info.at("dtype").get<std::string>());
    EXPECT_EQ(actual.shape, json_shape(info.at("shape")));
    EXPECT_FALSE(info.at("about").get<std::string>().empty());
    // Every tensor loads, and the float ones are finite.
    const Tensor tensor = reference.tensor(name);
    for (double v : tensor.to_doubles()) ASSERT_TRUE(std::isfinite(v));
  }
  const std::vector<std::string>& names = reference.file().names();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), declared_names);
}

TEST_P(FamilyFixture, PromptSetIsCompleteAndTheLongPromptIsTruncated) {
  const ReferenceFile reference = ReferenceFile::load(GetParam());
  const JsonConfig tokens = reference.sidecar().get_object("tokens");
  for (const std::string key : {"ascii", "unicode", "empty", "long"}) {
    SCOPED_TRACE(key);
    ASSERT_TRUE(tokens.has(key));
    EXPECT_FALSE(reference.names_with_prefix("tokens." + key + ".").empty());
    EXPECT_FALSE(reference.names_with_prefix("text." + key + ".").empty());
  }
  const JsonConfig long_prompt = tokens.get_object("long");
  EXPECT_GT(long_prompt.get_int("untruncated_tokens"), long_prompt.get_int("valid_tokens"));
}

TEST_P(FamilyFixture, HasEveryKindOfReference) {
  const ReferenceFile reference = ReferenceFile::load(GetParam());
  for (const std::string prefix : {"tokens.", "text.", "transformer.", "scheduler.", "vae.decode.", "pipeline."}) {
    EXPECT_FALSE(reference.names_with_prefix(prefix).empty()) << prefix;
  }
  EXPECT_TRUE(reference.has("pipeline.image"));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FamilyFixture, ::testing::ValuesIn(fixture_families()),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return name;
                         });
