// The committed parity fixtures (tools/reference/make_fixtures.py): where each family's tiny model
// and reference tensors live, loading a reference file with its JSON sidecar, comparing a result
// with a reference tensor, and the SHA-256 used by the fixture manifest.
#pragma once

#include <gtest/gtest.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "xdit/core/tensor.h"
#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"
#include "xdit/runtime/generation.h"

namespace xdit::testing {

// The families with fixtures, as named in tests/fixtures (models/<family>-tiny, reference/<family>.*).
const std::vector<std::string>& fixture_families();

std::filesystem::path fixtures_root();                            // <repo>/tests/fixtures
std::filesystem::path fixture_model_dir(std::string_view family);  // models/<family>-tiny

// tests/fixtures/reference/<family>.safetensors and its sidecar <family>.json, which names the
// pipeline, the components, the prompt set and, for every tensor, its dtype, shape and meaning.
class ReferenceFile {
 public:
  static ReferenceFile load(std::string_view family);

  const std::string& family() const { return family_; }
  const SafetensorsFile& file() const { return file_; }
  const JsonConfig& sidecar() const { return sidecar_; }
  std::filesystem::path model_dir() const;  // the sidecar's model_dir, under the repo root

  bool has(std::string_view name) const { return file_.contains(name); }
  Tensor tensor(std::string_view name) const;  // throws naming the file and the tensor
  // Names that start with `prefix` ("scheduler.", "text.ascii."), in file order.
  std::vector<std::string> names_with_prefix(std::string_view prefix) const;

 private:
  ReferenceFile(std::string family, SafetensorsFile file, JsonConfig sidecar);

  std::string family_;
  SafetensorsFile file_;
  JsonConfig sidecar_;
};

// One pipeline call recorded in a sidecar ("calls.<name>"): its prompt, guidance scale, the
// settings every image pipeline shares (size, steps, seed) at `dtype`, and the call's JSON for
// the family's own arguments.
struct FixtureCall {
  std::string prompt;
  double guidance_scale = 0;
  ImageSettings settings;
  JsonConfig json;
};
FixtureCall fixture_call(const ReferenceFile& reference, std::string_view name, DType dtype);

// The parity tolerances of DESIGN.md §6. An F32 result passes when its max abs error is at most
// f32_max_abs × max(1, max |expected|); a BF16/F16 result when its relative L2 error is at most
// low_precision_rel_l2. Integer results must be equal.
struct FixtureTolerance {
  double f32_max_abs = 1e-4;
  double low_precision_rel_l2 = 1e-2;
};

// Shapes must match; the failure message gives the max abs error, the relative L2 error and the
// worst index (Comparison::describe).
::testing::AssertionResult matches_fixture(const Tensor& actual, const Tensor& expected, FixtureTolerance tolerance = {});

// Peak signal-to-noise ratio in dB of two images of equal shape with values in [0, peak]:
// 10 log10(peak^2 / MSE); infinity when they are equal.
double psnr(const Tensor& actual, const Tensor& expected, double peak = 1.0);

// SHA-256 (FIPS 180-4).
using Sha256Digest = std::array<uint8_t, 32>;
Sha256Digest sha256(std::span<const std::byte> data);
std::string sha256_hex(std::span<const std::byte> data);
std::string sha256_hex(std::string_view data);
std::string sha256_file_hex(const std::filesystem::path& path);  // throws when it cannot be read

// tests/fixtures/MANIFEST: one "<sha256 hex>  <size>  <path relative to tests/fixtures>" per line.
struct ManifestEntry {
  std::string sha256;
  uint64_t size = 0;
  std::string path;
};
std::vector<ManifestEntry> read_manifest(const std::filesystem::path& path);  // throws on a malformed line

}  // namespace xdit::testing

#define EXPECT_MATCHES_FIXTURE(actual, expected) EXPECT_TRUE(::xdit::testing::matches_fixture(actual, expected))
