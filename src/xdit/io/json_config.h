// Strict JSON parsing and typed access to config fields. Every error is one line naming the file
// and, for field access, the field: `transformer/config.json: field "num_layers" is missing`.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "xdit/core/error.h"

namespace xdit {

// Escapes control characters and bytes that are not valid UTF-8 as \xNN, so text taken from a file
// cannot break a one-line error message.
std::string sanitize(std::string_view text);
// `"text"` sanitized and cut to at most `max_bytes` bytes (then ending in "...").
std::string quote(std::string_view text, size_t max_bytes = 200);

// "integer 5", "string \"abc\"", "array", ...: a JSON value described for an error message.
std::string describe_json(const nlohmann::json& value);

// Opens `path` read-only and returns the descriptor, with the file's size in `size`; throws naming
// the path when it cannot be opened or is not a regular file. The caller closes the descriptor.
int open_regular_file(const std::string& path, size_t& size);

// Reads a whole file; throws naming the path.
std::string read_text_file(const std::string& path);

// Parses JSON text. Unlike nlohmann's default, a duplicate key in any object is an error (the
// default silently keeps the last one), and so are NUL bytes and nesting deeper than
// kMaxJsonDepth. Errors name `label` and give line and column. The only exceptions thrown are
// xdit::Error (and std::bad_alloc).
inline constexpr int kMaxJsonDepth = 64;
nlohmann::json parse_json(std::string_view text, std::string_view label);

// A JSON object read from a file (or a nested object of one) with typed getters.
//
// Getters without a fallback throw when the field is missing, null or of the wrong type. Getters
// with a fallback return it when the field is missing or null, and still throw on a wrong type.
// Integers must be JSON integers within int64 range (2.0 is not an integer); floats accept any
// finite JSON number. NaN and Infinity literals are not JSON and 1e400 overflows, so both already
// fail at parse time.
class JsonConfig {
 public:
  JsonConfig(nlohmann::json value, std::string label, std::string field_prefix = {});

  static JsonConfig load(const std::string& path);                   // must hold a JSON object
  static JsonConfig parse(std::string_view text, std::string label);  // must be a JSON object

  const nlohmann::json& json() const { return value_; }
  const std::string& label() const { return label_; }

  bool has(std::string_view field) const;  // present and not null
  std::vector<std::string> keys() const;

  int64_t get_int(std::string_view field) const;
  int64_t get_int(std::string_view field, int64_t fallback) const;
  double get_float(std::string_view field) const;
  double get_float(std::string_view field, double fallback) const;
  bool get_bool(std::string_view field) const;
  bool get_bool(std::string_view field, bool fallback) const;
  std::string get_string(std::string_view field) const;
  std::string get_string(std::string_view field, std::string_view fallback) const;
  std::vector<int64_t> get_int_list(std::string_view field) const;
  std::vector<int64_t> get_int_list(std::string_view field, std::vector<int64_t> fallback) const;
  std::vector<double> get_float_list(std::string_view field) const;
  std::vector<double> get_float_list(std::string_view field, std::vector<double> fallback) const;
  std::vector<std::string> get_string_list(std::string_view field) const;
  JsonConfig get_object(std::string_view field) const;  // errors inside name "parent.field"

  // The pattern for typed config structs: members carry diffusers' defaults, and
  //   c.read("num_layers", cfg.num_layers);           // required
  //   c.read_optional("patch_size", cfg.patch_size);  // keeps the default when absent or null
  // Supported member types: int, int64_t, float, double, bool, std::string, std::vector of
  // int / int64_t / float / double / std::string, and std::optional of any of these.
  template <typename T>
  void read(std::string_view field, T& out) const {
    out = get_as<T>(field);
  }
  template <typename T>
  void read_optional(std::string_view field, T& out) const {
    if (has(field)) out = get_as<T>(field);
  }

  // An error naming this config and `field`, e.g. for a value that is well-typed but invalid.
  [[noreturn]] void fail_field(std::string_view field, std::string_view problem) const;
  // Checks that a model config read for `expected` is one: its _class_name, when present, must match.
  void check_class_name(std::string_view expected) const;
  // Fails naming `field` unless `value` (read from it) is above 0.
  void require_positive(std::string_view field, int64_t value) const;

 private:
  // The helpers below take `shown`, the field's full name as printed ("vae.block_out_channels[2]").
  const nlohmann::json& require(std::string_view field) const;
  std::string field_name(std::string_view field) const;
  [[noreturn]] void fail_shown(const std::string& shown, std::string_view problem) const;
  [[noreturn]] void fail_type(const std::string& shown, std::string_view expected, const nlohmann::json& got) const;
  int64_t to_int(const std::string& shown, const nlohmann::json& v, int64_t lo = INT64_MIN,
                 int64_t hi = INT64_MAX) const;
  double to_float(const std::string& shown, const nlohmann::json& v) const;

  template <typename T>
  T get_as(std::string_view field) const;

  nlohmann::json value_;
  std::string label_;
  std::string prefix_;  // "vae_config." for a nested object
};

namespace detail {
template <typename T>
struct is_optional : std::false_type {};
template <typename T>
struct is_optional<std::optional<T>> : std::true_type {};
}  // namespace detail

template <typename T>
T JsonConfig::get_as(std::string_view field) const {
  if constexpr (detail::is_optional<T>::value) {
    if (!has(field)) return std::nullopt;
    return get_as<typename T::value_type>(field);
  } else if constexpr (std::is_same_v<T, bool>) {
    return get_bool(field);
  } else if constexpr (std::is_same_v<T, int>) {
    return static_cast<int>(to_int(field_name(field), require(field), INT32_MIN, INT32_MAX));
  } else if constexpr (std::is_same_v<T, int64_t>) {
    return get_int(field);
  } else if constexpr (std::is_same_v<T, float>) {
    const double value = get_float(field);
    if (std::fabs(value) > std::numeric_limits<float>::max())
      fail_shown(field_name(field), concat_message("is ", value, ", out of float range"));
    return static_cast<float>(value);
  } else if constexpr (std::is_same_v<T, double>) {
    return get_float(field);
  } else if constexpr (std::is_same_v<T, std::string>) {
    return get_string(field);
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    return get_int_list(field);
  } else if constexpr (std::is_same_v<T, std::vector<int>>) {
    const nlohmann::json& v = require(field);
    if (!v.is_array()) fail_type(field_name(field), "a list of integers", v);
    std::vector<int> out;
    for (size_t i = 0; i < v.size(); ++i)
      out.push_back(static_cast<int>(
          to_int(field_name(field) + "[" + std::to_string(i) + "]", v[i], INT32_MIN, INT32_MAX)));
    return out;
  } else if constexpr (std::is_same_v<T, std::vector<double>>) {
    return get_float_list(field);
  } else if constexpr (std::is_same_v<T, std::vector<float>>) {
    const std::vector<double> values = get_float_list(field);
    return std::vector<float>(values.begin(), values.end());
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    return get_string_list(field);
  } else {
    static_assert(sizeof(T) == 0, "JsonConfig::read: unsupported member type");
  }
}

}  // namespace xdit
