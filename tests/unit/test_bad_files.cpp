// Hand-made bad inputs. Each must raise an xdit::Error whose message is one line naming the file
// (and the tensor or field when there is one). The table below builds every input; the
// single-file cases are also committed under tests/bad_files/ as fuzz seeds, and
// CommittedCopiesAreCurrent keeps those in step:
// The valid fuzz seeds of tests/fuzz/corpus/ are made the same way.
//   XDIT_UPDATE_BAD_FILES=1 build-io/bin/test_bad_files --gtest_filter='bad_files.*'
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "support/files.h"
#include "xdit/io/diffusers.h"
#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"

namespace fs = std::filesystem;
using namespace xdit;
namespace xt = xdit::testing;
using xt::le64;
using xt::read_text;
using xt::write_text;

namespace {

// A safetensors file: header padded with spaces to a multiple of 8, then `data`.
std::string st(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + data;
}

const std::string kGoodHeader =
    R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
    R"("b":{"dtype":"BF16","shape":[2,2],"data_offsets":[8,16]}})";
const std::string kGood = st(kGoodHeader, std::string(16, '\x01'));

struct BadCase {
  std::string name;
  // A single committed file: its name under tests/bad_files/ and its bytes. Empty for cases that
  // need a folder of files, which `build` makes instead.
  std::string file;
  std::string bytes;
  // Builds the input under `dir` (by default: writes `bytes` to dir/file) and returns the path
  // the message must name.
  std::function<std::string(const fs::path& dir, const BadCase& c)> build;
  std::function<void(const std::string& path)> load;
  std::vector<std::string> expect;  // substrings of the message
};

std::string write_own_file(const fs::path& dir, const BadCase& c) {
  const fs::path path = dir / c.file;
  write_text(path, c.bytes);
  return path.string();
}

void load_safetensors(const std::string& path) { SafetensorsFile::open(path); }

BadCase st_case(std::string name, std::string bytes, std::vector<std::string> expect) {
  return {name, "safetensors/" + name + ".safetensors", std::move(bytes), write_own_file, load_safetensors,
          std::move(expect)};
}

BadCase config_case(std::string name, std::string text, std::function<void(const JsonConfig&)> use,
                    std::vector<std::string> expect) {
  return {name, "json/" + name + ".json", std::move(text), write_own_file,
          [use](const std::string& path) { use(JsonConfig::load(path)); }, std::move(expect)};
}

// A diffusers folder with one component "transformer" whose model_index.json is `model_index`.
std::function<std::string(const fs::path&, const BadCase&)> repo_with(std::string model_index, bool make_folder) {
  return [=](const fs::path& dir, const BadCase&) {
    write_text(dir / "repo" / "model_index.json", model_index);
    if (make_folder) fs::create_directories(dir / "repo" / "transformer");
    return (dir / "repo" / "model_index.json").string();
  };
}

void load_repo(const std::string& model_index_path) { DiffusersRepo::open(fs::path(model_index_path).parent_path()); }

// A sharded checkpoint: index.json with `weight_map`, and shards s1 = {a}, s2 = {b} (and any
// `extra` shard files given as name -> tensor list).
std::function<std::string(const fs::path&, const BadCase&)> sharded_with(
    std::string weight_map, std::vector<std::pair<std::string, std::string>> shards) {
  return [=](const fs::path& dir, const BadCase&) {
    for (const auto& [file, header] : shards) write_text(dir / "ckpt" / file, st(header, std::string(4, '\0')));
    const fs::path index = dir / "ckpt" / "model.safetensors.index.json";
    write_text(index, R"({"metadata": {}, "weight_map": )" + weight_map + "}");
    return index.string();
  };
}

void load_sharded(const std::string& path) { ShardedSafetensors::open(path); }

const std::string kTensorA = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
const std::string kTensorB = R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
const std::string kTensorsAB =
    R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})";

std::vector<BadCase> bad_cases() {
  std::vector<BadCase> cases = {
      // ---- safetensors: sizes and header framing ----
      st_case("empty", "", {"too short"}),
      st_case("five_bytes", std::string("\x10\0\0\0\0", 5), {"5 bytes, too short"}),
      st_case("truncated_mid_header", kGood.substr(0, 8 + kGoodHeader.size() / 2), {"runs past the end of the file"}),
      st_case("truncated_mid_data", kGood.substr(0, kGood.size() - 5), {"tensor \"b\"", "run past the end of the data"}),
      st_case("header_length_over_limit", le64(200'000'000) + "{}", {"header length 200000000 exceeds the limit"}),
      st_case("header_length_past_end", le64(1000) + "{}      ", {"header length 1000 runs past the end of the file"}),
      st_case("header_empty", le64(0), {"header is empty"}),
      st_case("not_json", st("{this is not json}", ""), {"invalid JSON", "line 1, column 3"}),
      st_case("header_is_array", st("[1, 2]", ""), {"does not start with '{'"}),
      st_case("header_leading_space", st(" {}", ""), {"does not start with '{'"}),
      st_case("header_trailing_garbage", st("{} x", ""), {"invalid JSON"}),
      st_case("header_nul_padding", le64(8) + std::string("{}\0\0\0\0\0\0", 8), {"invalid JSON: NUL byte at offset 2"}),
      st_case("invalid_utf8_name", st("{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", "abcd"),
              {"invalid JSON", "UTF-8"}),
      // ---- tensor entries ----
      st_case("unknown_dtype", st(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", "x"),
              {"tensor \"w\"", "unknown dtype \"Q7\""}),
      st_case("unsupported_dtype", st(R"({"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, 'x')),
              {"tensor \"w\"", "dtype \"F64\" is not supported"}),
      st_case("dtype_not_string", st(R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})", "xxxx"),
              {"tensor \"w\"", "dtype must be a string, got integer 4"}),
      st_case("wrong_size", st(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", std::string(20, 'x')),
              {"tensor \"w\"", "shape [2, 3] of F32 needs 24 bytes", "hold 20"}),
      st_case("shape_overflow",
              st(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", "xxxx"),
              {"tensor \"w\"", "too large"}),
      st_case("negative_shape", st(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "xxxx"),
              {"tensor \"w\"", "shape entry 0 must be a non-negative integer, got integer -1"}),
      st_case("float_shape", st(R"({"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", "xxxx"),
              {"tensor \"w\"", "got float 1.0"}),
      st_case("shape_not_list", st(R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", "xxxx"),
              {"tensor \"w\"", "shape must be a list"}),
      st_case("missing_data_offsets", st(R"({"w":{"dtype":"F32","shape":[1]}})", "xxxx"),
              {"tensor \"w\"", "missing field \"data_offsets\""}),
      st_case("unexpected_field", st(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}})", "xxxx"),
              {"tensor \"w\"", "unexpected field \"x\""}),
      st_case("entry_not_object", st(R"({"w":[1,2]})", ""), {"tensor \"w\"", "entry must be an object"}),
      st_case("offsets_one_value", st(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4]}})", "xxxx"),
              {"tensor \"w\"", "data_offsets must be [begin, end]"}),
      st_case("begin_after_end", st(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", std::string(8, 'x')),
              {"tensor \"w\"", "data_offsets [8, 4] have begin > end"}),
      st_case("offsets_beyond_end", st(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", "xxxxxxxx"),
              {"tensor \"w\"", "run past the end of the data section (8 bytes)"}),
      // ---- layout of the data section ----
      st_case("overlap",
              st(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 std::string(12, 'x')),
              {"tensors \"a\" and \"b\" overlap"}),
      st_case("hole",
              st(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                 std::string(12, 'x')),
              {"hole", "bytes [4, 8) before tensor \"b\""}),
      st_case("hole_at_start", st(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", std::string(8, 'x')),
              {"hole", "bytes [0, 4) before tensor \"a\""}),
      st_case("data_after_last_tensor", st(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "xxxxxxxx"),
              {"tensors end at data byte 4", "holds 8 bytes"}),
      st_case("data_without_tensors", st("{}", "xxxx"), {"tensors end at data byte 0"}),
      st_case("duplicate_names",
              st(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                 std::string(8, 'x')),
              {"duplicate key \"a\""}),
      st_case("duplicate_field",
              st(R"({"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})", "xxxx"),
              {"duplicate key \"dtype\" in object \"a\""}),
      st_case("newline_in_name", st("{\"a\\nb\":{\"dtype\":\"Q\",\"shape\":[],\"data_offsets\":[0,0]}}", ""),
              {"tensor \"a\\x0ab\"", "unknown dtype"}),
      // ---- metadata ----
      st_case("too_deep", st("{\"a\":" + std::string(70, '[') + std::string(70, ']') + "}", ""),
              {"nesting deeper than 64 levels"}),
      st_case("metadata_not_string", st(R"({"__metadata__":{"format":1}})", ""),
              {"__metadata__ entry \"format\" must be a string, got integer 1"}),
      st_case("metadata_not_object", st(R"({"__metadata__":"pt"})", ""), {"__metadata__ must be an object"}),

      // ---- JSON configs ----
      config_case("config_nan", R"({"num_layers": 2, "eps": NaN})", [](const JsonConfig&) {},
                  {"invalid JSON", "line 1", "NaN and Infinity are not valid JSON numbers"}),
      config_case("config_infinity", "{\n  \"eps\": -Infinity\n}", [](const JsonConfig&) {},
                  {"invalid JSON", "line 2", "NaN and Infinity"}),
      config_case("config_overflowing_float", R"({"eps": 1e400})", [](const JsonConfig& c) { c.get_float("eps"); },
                  {"invalid JSON", "number overflow"}),
      config_case("config_missing_field", R"({"num_attention_heads": 4})",
                  [](const JsonConfig& c) { c.get_int("num_layers"); }, {"field \"num_layers\" is missing"}),
      config_case("config_ill_typed", R"({"num_layers": "2"})", [](const JsonConfig& c) { c.get_int("num_layers"); },
                  {"field \"num_layers\" must be an integer, got string \"2\""}),
      config_case("config_float_for_int", R"({"num_layers": 2.5})",
                  [](const JsonConfig& c) { c.get_int("num_layers"); },
                  {"field \"num_layers\" must be an integer, got float 2.5"}),
      config_case("config_int_out_of_range", R"({"num_layers": 99999999999999999999})",
                  [](const JsonConfig& c) { c.get_int("num_layers"); },
                  {"field \"num_layers\"", "out of the 64-bit integer range"}),
      config_case("config_int_over_int32", R"({"num_layers": 3000000000})",
                  [](const JsonConfig& c) {
                    int n = 0;
                    c.read("num_layers", n);
                  },
                  {"field \"num_layers\" is 3000000000, out of range"}),
      config_case("config_bad_list_entry", R"({"axes_dims_rope": [16, "56", 56]})",
                  [](const JsonConfig& c) { c.get_int_list("axes_dims_rope"); },
                  {"field \"axes_dims_rope[1]\" must be an integer"}),
      config_case("config_nested_missing", R"({"vae": {"in_channels": 3}})",
                  [](const JsonConfig& c) { c.get_object("vae").get_int("latent_channels"); },
                  {"field \"vae.latent_channels\" is missing"}),
      config_case("config_duplicate_key", R"({"num_layers": 2, "num_layers": 3})", [](const JsonConfig&) {},
                  {"duplicate key \"num_layers\""}),
      config_case("config_truncated", "{\"num_layers\": 2,\n \"dim\": ", [](const JsonConfig&) {},
                  {"invalid JSON", "line 2"}),
      config_case("config_too_deep", "{\"a\": " + std::string(100, '[') + std::string(100, ']') + "}",
                  [](const JsonConfig&) {}, {"nesting deeper than 64 levels"}),
      config_case("config_not_object", "[1, 2, 3]", [](const JsonConfig&) {},
                  {"expected a JSON object, got array"}),
      config_case("config_invalid_utf8", "{\"name\": \"\xc3\x28\"}", [](const JsonConfig&) {},
                  {"invalid JSON", "UTF-8"}),

      // ---- diffusers layout ----
      {"model_index_missing_folder", "", "",
       repo_with(R"({"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"]})", false),
       load_repo, {"component \"transformer\"", "has no folder", "/repo/transformer"}},
      {"model_index_bad_component", "", "",
       repo_with(R"({"_class_name": "FluxPipeline", "transformer": ["diffusers"]})", true), load_repo,
       {"field \"transformer\" must be a component [library, class]"}},
      {"model_index_no_class", "", "", repo_with(R"({"transformer": ["diffusers", "X"]})", true), load_repo,
       {"field \"_class_name\" is missing"}},
      {"model_index_escaping_name", "", "", repo_with(R"({"_class_name": "P", "../x": ["diffusers", "X"]})", true),
       load_repo, {"field \"../x\" is not a valid component folder name"}},
      {"sharded_missing_shard", "", "", sharded_with(R"({"a": "s1.safetensors", "b": "s9.safetensors"})",
                                                     {{"s1.safetensors", kTensorA}}),
       load_sharded, {"shard \"s9.safetensors\"", "tensor \"b\"", "does not exist"}},
      {"sharded_tensor_missing_from_shard", "", "",
       sharded_with(R"({"a": "s1.safetensors", "c": "s1.safetensors"})", {{"s1.safetensors", kTensorA}}), load_sharded,
       {"tensor \"c\" is listed in shard \"s1.safetensors\"", "does not contain it"}},
      {"sharded_tensor_in_two_shards", "", "",
       sharded_with(R"({"a": "s1.safetensors", "b": "s2.safetensors"})",
                    {{"s1.safetensors", kTensorA}, {"s2.safetensors", kTensorsAB}}),
       load_sharded, {"tensor \"a\" appears in two shards", "s1.safetensors", "s2.safetensors"}},
      {"sharded_tensor_not_listed", "", "",
       sharded_with(R"({"a": "s1.safetensors"})", {{"s1.safetensors", kTensorsAB}}), load_sharded,
       {"tensor \"b\"", "is not listed in the weight_map"}},
      {"sharded_shard_outside_folder", "", "", sharded_with(R"({"a": "../s1.safetensors"})", {}), load_sharded,
       {"tensor \"a\"", "must be a file name in the index's folder"}},
      {"sharded_no_weight_map", "", "",
       [](const fs::path& dir, const BadCase&) {
         write_text(dir / "idx.json", R"({"metadata": {}})");
         return (dir / "idx.json").string();
       },
       load_sharded, {"field \"weight_map\" is missing"}},
  };
  return cases;
}

// Valid inputs committed as fuzz seeds (tests/fuzz/corpus/<target>/seed_*), so the fuzzer starts
// from files that reach every part of the parsers.
struct GoodSeed {
  std::string file;  // under tests/fuzz/corpus/
  std::string bytes;
  std::function<void(const std::string& path)> load;
};

std::vector<GoodSeed> good_seeds() {
  const std::string all_dtypes =
      R"({"__metadata__":{"format":"pt","note":"seed"},)"
      R"("f32":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("i64":{"dtype":"I64","shape":[1],"data_offsets":[8,16]},)"
      R"("i32":{"dtype":"I32","shape":[],"data_offsets":[16,20]},)"
      R"("bf16":{"dtype":"BF16","shape":[1,2],"data_offsets":[20,24]},)"
      R"("f16":{"dtype":"F16","shape":[2,1],"data_offsets":[24,28]},)"
      R"("e4m3":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[28,30]},)"
      R"("e5m2":{"dtype":"F8_E5M2","shape":[1,1,2],"data_offsets":[30,32]},)"
      R"("empty":{"dtype":"F32","shape":[0,3],"data_offsets":[32,32]}})";
  const std::string unpadded = R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const auto config = [](const std::string& path) {
    const JsonConfig c = JsonConfig::load(path);
    for (const std::string& key : c.keys()) (void)c.json()[key];
  };
  return {
      {"safetensors/seed_two_tensors.safetensors", kGood, load_safetensors},
      {"safetensors/seed_all_dtypes.safetensors", st(all_dtypes, std::string(32, '<')), load_safetensors},
      {"safetensors/seed_unpadded_header.safetensors", le64(unpadded.size()) + unpadded + std::string(8, '@'),
       load_safetensors},
      {"safetensors/seed_no_tensors.safetensors", st("{}", ""), load_safetensors},
      {"json_config/seed_model_index.json",
       R"({"_class_name": "Flux2KleinPipeline", "_diffusers_version": "0.36.0",
  "is_distilled": true, "safety_checker": [null, null], "feature_extractor": null,
  "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
  "text_encoder": ["transformers", "Qwen3ForCausalLM"], "tokenizer": ["transformers", "Qwen2TokenizerFast"],
  "transformer": ["diffusers", "Flux2Transformer2DModel"], "vae": ["diffusers", "AutoencoderKLFlux2"]}
)",
       [](const std::string& path) { parse_model_index(JsonConfig::load(path)); }},
      {"json_config/seed_transformer_config.json",
       R"({"_class_name": "Flux2Transformer2DModel", "attention_head_dim": 128, "axes_dims_rope": [32, 32, 32, 32],
  "eps": 1e-06, "guidance_embeds": false, "in_channels": 128, "num_layers": 5, "patch_size": 1,
  "rope_theta": 2000, "timestep_guidance_channels": 256, "out_channels": null, "mlp_ratio": 3.0,
  "act_fn": "silu", "names": ["a", "b"], "vae": {"scaling_factor": 0.3611, "block_out_channels": [128, 256]}}
)",
       config},
      {"json_config/seed_scheduler_config.json",
       R"({"_class_name": "FlowMatchEulerDiscreteScheduler", "base_image_seq_len": 256, "base_shift": 0.5,
  "max_shift": 1.15, "num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": true,
  "time_shift_type": "exponential", "shift_terminal": null, "stochastic_sampling": false}
)",
       config},
      {"json_config/seed_weight_map.json",
       R"({"metadata": {"total_size": 8044936192}, "weight_map": {
  "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
  "model.layers.0.mlp.down_proj.weight": "model-00001-of-00002.safetensors",
  "model.norm.weight": "model-00002-of-00002.safetensors"}}
)",
       [](const std::string& path) { parse_weight_map(JsonConfig::load(path)); }},
  };
}

class BadFiles : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadFiles, GivesAOneLineErrorNamingTheFile) {
  const BadCase& c = GetParam();
  const fs::path dir = xt::scratch_folder("bad_file");
  const std::string path = c.build(dir, c);
  std::string message;
  try {
    c.load(path);
    ADD_FAILURE() << c.name << ": no error";
  } catch (const Error& e) {
    message = e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << c.name << ": not an xdit::Error: " << e.what();
  }
  if (message.empty()) return;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  EXPECT_NE(message.find(path), std::string::npos) << "names the file: " << message;
  for (const std::string& part : c.expect) EXPECT_NE(message.find(part), std::string::npos) << message;
}

INSTANTIATE_TEST_SUITE_P(bad_files, BadFiles, ::testing::ValuesIn(bad_cases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

TEST(bad_files, FuzzSeedsLoadAndCommittedCopiesAreCurrent) {
  const fs::path root = fs::path(XDIT_SOURCE_DIR) / "tests" / "fuzz" / "corpus";
  const bool update = std::getenv("XDIT_UPDATE_BAD_FILES") != nullptr;
  const fs::path dir = xt::scratch_folder("seed");
  for (const GoodSeed& seed : good_seeds()) {
    const fs::path path = dir / seed.file;
    write_text(path, seed.bytes);
    EXPECT_NO_THROW(seed.load(path.string())) << seed.file;
    if (update) write_text(root / seed.file, seed.bytes);
    EXPECT_EQ(read_text(root / seed.file), seed.bytes)
        << (root / seed.file).string() << " is stale; run with XDIT_UPDATE_BAD_FILES=1 to rewrite it";
  }
}

TEST(bad_files, CommittedCopiesAreCurrent) {
  const fs::path root = fs::path(XDIT_SOURCE_DIR) / "tests" / "bad_files";
  const bool update = std::getenv("XDIT_UPDATE_BAD_FILES") != nullptr;
  for (const BadCase& c : bad_cases()) {
    if (c.file.empty()) continue;
    if (update) write_text(root / c.file, c.bytes);
    EXPECT_EQ(read_text(root / c.file), c.bytes)
        << (root / c.file).string() << " is stale; run with XDIT_UPDATE_BAD_FILES=1 to rewrite it";
  }
}

}  // namespace
