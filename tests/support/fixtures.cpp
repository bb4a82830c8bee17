#include "support/fixtures.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "support/reference.h"
#include "xdit/core/error.h"

namespace xdit::testing {

namespace fs = std::filesystem;

const std::vector<std::string>& fixture_families() {
  static const std::vector<std::string> families = {"flux2-klein", "z-image", "sd35", "qwen-image", "wan22-ti2v",
                                                     "wan22-a14b", "flux2-dev"};
  return families;
}

fs::path fixtures_root() { return fs::path(XDIT_SOURCE_DIR) / "tests" / "fixtures"; }

fs::path fixture_model_dir(std::string_view family) {
  return fixtures_root() / "models" / (std::string(family) + "-tiny");
}

ReferenceFile::ReferenceFile(std::string family, SafetensorsFile file, JsonConfig sidecar)
    : family_(std::move(family)), file_(std::move(file)), sidecar_(std::move(sidecar)) {}

ReferenceFile ReferenceFile::load(std::string_view family) {
  const fs::path base = fixtures_root() / "reference" / std::string(family);
  return ReferenceFile(std::string(family), SafetensorsFile::open(base.string() + ".safetensors"),
                       JsonConfig::load(base.string() + ".json"));
}

fs::path ReferenceFile::model_dir() const { return fs::path(XDIT_SOURCE_DIR) / sidecar_.get_string("model_dir"); }

Tensor ReferenceFile::tensor(std::string_view name) const {
  XDIT_CHECK(file_.contains(name), file_.label(), ": no reference tensor \"", name, "\"");
  return file_.tensor(name);
}

std::vector<std::string> ReferenceFile::names_with_prefix(std::string_view prefix) const {
  std::vector<std::string> out;
  for (const std::string& name : file_.names())
    if (name.starts_with(prefix)) out.push_back(name);
  return out;
}

FixtureCall fixture_call(const ReferenceFile& reference, std::string_view name, DType dtype) {
  const JsonConfig call = reference.sidecar().get_object("calls").get_object(name);
  FixtureCall c{call.get_string("prompt"), call.get_float("guidance_scale"), {}, call};
  c.settings.height = call.get_int("height");
  c.settings.width = call.get_int("width");
  c.settings.num_inference_steps = call.get_int("num_inference_steps");
  c.settings.seed = static_cast<uint64_t>(call.get_int("seed"));
  c.settings.dtype = dtype;
  return c;
}

::testing::AssertionResult matches_fixture(const Tensor& actual, const Tensor& expected, FixtureTolerance tolerance) {
  if (actual.shape() != expected.shape()) {
    std::ostringstream shapes;
    shapes << "shape mismatch: actual [";
    for (int64_t s : actual.shape()) shapes << ' ' << s;
    shapes << " ] expected [";
    for (int64_t s : expected.shape()) shapes << ' ' << s;
    shapes << " ]";
    return ::testing::AssertionFailure() << shapes.str();
  }
  const Comparison c = compare(actual, expected.to_doubles());
  if (c.non_finite) return ::testing::AssertionFailure() << c.describe();
  if (!is_floating(actual.dtype())) {
    if (c.max_abs == 0) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "integer values differ: " << c.describe();
  }
  if (actual.dtype() == DType::F32) {
    const double bound = tolerance.f32_max_abs * std::max(1.0, c.max_expected);
    if (c.max_abs <= bound) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "f32 max abs error above " << bound << ": " << c.describe();
  }
  if (c.rel_l2 <= tolerance.low_precision_rel_l2) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << dtype_name(actual.dtype()) << " relative L2 error above "
                                       << tolerance.low_precision_rel_l2 << ": " << c.describe();
}

double psnr(const Tensor& actual, const Tensor& expected, double peak) {
  XDIT_CHECK(actual.shape() == expected.shape(), "psnr: shapes ", shape_str(actual.shape()), " and ",
             shape_str(expected.shape()), " differ");
  const std::vector<double> a = actual.to_doubles(), e = expected.to_doubles();
  XDIT_CHECK(!a.empty(), "psnr: empty images");
  double squared = 0;
  for (size_t i = 0; i < a.size(); ++i) squared += (a[i] - e[i]) * (a[i] - e[i]);
  const double mse = squared / static_cast<double>(a.size());
  if (mse == 0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(peak * peak / mse);
}

// ---- SHA-256, FIPS 180-4 §4.1.2, §5.1.1, §6.2 ----

namespace {

constexpr std::array<uint32_t, 64> kRoundConstants = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr std::array<uint32_t, 8> kInitialHash = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                                  0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};

class Sha256 {
 public:
  void update(std::span<const std::byte> data) {
    for (std::byte b : data) {
      block_[filled_++] = static_cast<uint8_t>(b);
      if (filled_ == 64) {
        compress();
        filled_ = 0;
      }
    }
    length_bytes_ += data.size();
  }

  Sha256Digest finish() {
    // Padding: a 1 bit, zeros up to 56 mod 64 bytes, then the message length in bits, big-endian.
    const uint64_t length_bits = length_bytes_ * 8;
    block_[filled_++] = 0x80;
    if (filled_ > 56) {
      std::fill(block_.begin() + filled_, block_.end(), 0);
      compress();
      filled_ = 0;
    }
    std::fill(block_.begin() + filled_, block_.begin() + 56, 0);
    for (int i = 0; i < 8; ++i) block_[56 + i] = static_cast<uint8_t>(length_bits >> (56 - 8 * i));
    compress();
    Sha256Digest digest{};
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 4; ++j) digest[4 * i + j] = static_cast<uint8_t>(hash_[i] >> (24 - 8 * j));
    return digest;
  }

 private:
  void compress() {
    std::array<uint32_t, 64> w{};
    for (int t = 0; t < 16; ++t)
      w[t] = (uint32_t{block_[4 * t]} << 24) | (uint32_t{block_[4 * t + 1]} << 16) |
             (uint32_t{block_[4 * t + 2]} << 8) | uint32_t{block_[4 * t + 3]};
    for (int t = 16; t < 64; ++t) {
      const uint32_t s0 = std::rotr(w[t - 15], 7) ^ std::rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
      const uint32_t s1 = std::rotr(w[t - 2], 17) ^ std::rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
      w[t] = w[t - 16] + s0 + w[t - 7] + s1;
    }
    uint32_t a = hash_[0], b = hash_[1], c = hash_[2], d = hash_[3];
    uint32_t e = hash_[4], f = hash_[5], g = hash_[6], h = hash_[7];
    for (int t = 0; t < 64; ++t) {
      const uint32_t big_s1 = std::rotr(e, 6) ^ std::rotr(e, 11) ^ std::rotr(e, 25);
      const uint32_t choose = (e & f) ^ (~e & g);
      const uint32_t t1 = h + big_s1 + choose + kRoundConstants[t] + w[t];
      const uint32_t big_s0 = std::rotr(a, 2) ^ std::rotr(a, 13) ^ std::rotr(a, 22);
      const uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
      const uint32_t t2 = big_s0 + majority;
      h = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    hash_[0] += a;
    hash_[1] += b;
    hash_[2] += c;
    hash_[3] += d;
    hash_[4] += e;
    hash_[5] += f;
    hash_[6] += g;
    hash_[7] += h;
  }

  std::array<uint32_t, 8> hash_ = kInitialHash;
  std::array<uint8_t, 64> block_{};
  size_t filled_ = 0;
  uint64_t length_bytes_ = 0;
};

std::string to_hex(const Sha256Digest& digest) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (uint8_t byte : digest) {
    out.push_back(kDigits[byte >> 4]);
    out.push_back(kDigits[byte & 15]);
  }
  return out;
}

}  // namespace

Sha256Digest sha256(std::span<const std::byte> data) {
  Sha256 state;
  state.update(data);
  return state.finish();
}

std::string sha256_hex(std::span<const std::byte> data) { return to_hex(sha256(data)); }

std::string sha256_hex(std::string_view data) {
  return sha256_hex(std::as_bytes(std::span<const char>(data.data(), data.size())));
}

std::string sha256_file_hex(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  XDIT_CHECK(file, "cannot open ", path.string());
  Sha256 state;
  std::vector<char> chunk(1 << 16);
  while (file) {
    file.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    state.update(std::as_bytes(std::span<const char>(chunk.data(), static_cast<size_t>(file.gcount()))));
  }
  XDIT_CHECK(file.eof(), "error reading ", path.string());
  return to_hex(state.finish());
}

std::vector<ManifestEntry> read_manifest(const fs::path& path) {
  std::ifstream file(path);
  XDIT_CHECK(file, "cannot open ", path.string());
  std::vector<ManifestEntry> entries;
  std::string line;
  for (int number = 1; std::getline(file, line); ++number) {
    std::istringstream fields(line);
    ManifestEntry entry;
    std::string rest;
    fields >> entry.sha256 >> entry.size >> entry.path;
    const bool hex = entry.sha256.size() == 64 &&
                     std::all_of(entry.sha256.begin(), entry.sha256.end(),
                                 [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
    XDIT_CHECK(!fields.fail() && !(fields >> rest) && hex && !entry.path.empty(), path.string(), ":", number,
               ": expected \"<sha256>  <size>  <path>\", got ", quote(line));
    entries.push_back(std::move(entry));
  }
  return entries;
}

}  // namespace xdit::testing
