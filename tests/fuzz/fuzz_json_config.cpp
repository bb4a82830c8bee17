// libFuzzer harness: arbitrary bytes as a config.json / model_index.json / sharded index. Every
// getter is tried on every field; malformed input must give one-line xdit::Errors, nothing else.
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "xdit/io/diffusers.h"
#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"

namespace {

void check_one_line(const xdit::Error& e) {
  if (std::string_view(e.what()).find('\n') != std::string_view::npos) std::abort();
}

template <typename Fn>
void attempt(Fn&& fn) {
  try {
    fn();
  } catch (const xdit::Error& e) {
    check_one_line(e);
  }
}

// A config struct read with the read()/read_optional() pattern, to exercise every member type.
struct ExampleConfig {
  int num_layers = 2;
  int64_t dim = 64;
  float eps = 1e-6f;
  double theta = 10000.0;
  bool flag = false;
  std::string act = "gelu";
  std::vector<int> axes;
  std::vector<int64_t> sizes;
  std::vector<float> scales;
  std::vector<double> shifts;
  std::vector<std::string> names;
  std::optional<int> maybe;
};

void exercise(const xdit::JsonConfig& config, int depth) {
  for (const std::string& key : config.keys()) {
    attempt([&] { config.get_int(key); });
    attempt([&] { config.get_int(key, 7); });
    attempt([&] { config.get_float(key); });
    attempt([&] { config.get_float(key, 0.5); });
    attempt([&] { config.get_bool(key); });
    attempt([&] { config.get_bool(key, true); });
    attempt([&] { config.get_string(key); });
    attempt([&] { config.get_string(key, "x"); });
    attempt([&] { config.get_int_list(key); });
    attempt([&] { config.get_float_list(key); });
    attempt([&] { config.get_string_list(key); });
    if (depth < 4) attempt([&] { exercise(config.get_object(key), depth + 1); });
  }
  ExampleConfig c;
  const char* fields[] = {"num_layers", "dim", "eps", "theta", "flag", "act", "axes", "sizes", "scales", "shifts",
                          "names", "maybe"};
  for (const char* f : fields) {
    attempt([&] { config.read_optional(f, c.num_layers); });
    attempt([&] { config.read_optional(f, c.dim); });
    attempt([&] { config.read_optional(f, c.eps); });
    attempt([&] { config.read_optional(f, c.theta); });
    attempt([&] { config.read_optional(f, c.flag); });
    attempt([&] { config.read_optional(f, c.act); });
    attempt([&] { config.read_optional(f, c.axes); });
    attempt([&] { config.read_optional(f, c.sizes); });
    attempt([&] { config.read_optional(f, c.scales); });
    attempt([&] { config.read_optional(f, c.shifts); });
    attempt([&] { config.read_optional(f, c.names); });
    attempt([&] { config.read(f, c.maybe); });
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const xdit::JsonConfig config = xdit::JsonConfig::parse(text, "fuzz/config.json");
    exercise(config, 0);
    attempt([&] { xdit::parse_model_index(config); });
    attempt([&] { xdit::parse_weight_map(config); });
  } catch (const xdit::Error& e) {
    check_one_line(e);
  }
  return 0;
}
