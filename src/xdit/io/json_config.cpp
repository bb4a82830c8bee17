#include "xdit/io/json_config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

namespace xdit {

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is not one (overlong forms,
// surrogates and code points above U+10FFFF are invalid).
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n;
  uint32_t cp;
  if ((c & 0xE0) == 0xC0) {
    n = 2;
    cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3;
    cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  static constexpr uint32_t kMinForLength[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLength[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

std::string hex_byte(unsigned char c) {
  static constexpr char kDigits[] = "0123456789abcdef";
  return {'\\', 'x', kDigits[c >> 4], kDigits[c & 15]};
}

}  // namespace

std::string describe_json(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::boolean:
      return v.get<bool>() ? "boolean true" : "boolean false";
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
      return "integer " + v.dump();
    case nlohmann::json::value_t::number_float: {
      // dump() would print non-finite values as null.
      const double d = v.get<double>();
      if (std::isnan(d)) return "float NaN";
      if (std::isinf(d)) return d > 0 ? "float Infinity" : "float -Infinity";
      return "float " + v.dump();
    }
    case nlohmann::json::value_t::string:
      return "string " + quote(v.get_ref<const std::string&>(), 60);
    case nlohmann::json::value_t::array:
      return "array";
    case nlohmann::json::value_t::object:
      return "object";
    default:
      return v.type_name();
  }
}

std::string sanitize(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t n = utf8_sequence_length(text, i);
    if (n == 0 || c < 0x20 || c == 0x7F) {
      out += hex_byte(c);
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string quote(std::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return "\"" + sanitize(text) + "\"";
  // Cut at a character boundary so the cut does not show up as an invalid byte.
  size_t cut = max_bytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return "\"" + sanitize(text.substr(0, cut)) + "...\"";
}

int open_regular_file(const std::string& path, size_t& size) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("cannot read ", path, ": not a regular file");
  }
  size = static_cast<size_t>(st.st_size);
  return fd;
}

std::string read_text_file(const std::string& path) {
  size_t size = 0;
  const int fd = open_regular_file(path, size);
  std::string text(size, '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t got = ::read(fd, text.data() + done, text.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const int err = got < 0 ? errno : 0;
      ::close(fd);
      fail("cannot read ", path, ": ", err ? std::strerror(err) : "file shrank while reading");
    }
    done += static_cast<size_t>(got);
  }
  ::close(fd);
  return text;
}

nlohmann::json parse_json(std::string_view text, std::string_view label) {
  // One key set per open object, to find duplicate keys; `key` is the last key seen in that object,
  // to say where a duplicate sits.
  struct OpenObject {
    std::set<std::string, std::less<>> keys;
    std::string key;
  };
  std::vector<OpenObject> open;
  const auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if ((event == Event::object_start || event == Event::array_start) && depth >= kMaxJsonDepth)
      fail(label, ": invalid JSON: nesting deeper than ", kMaxJsonDepth, " levels");
    if (event == Event::object_start) {
      open.emplace_back();
    } else if (event == Event::object_end) {
      open.pop_back();
    } else if (event == Event::key) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!open.back().keys.insert(key).second) {
        std::string where;
        if (open.size() > 1) where = " in object " + quote(open[open.size() - 2].key);
        fail(label, ": duplicate key ", quote(key), where);
      }
      open.back().key = key;
    }
    return true;
  };
  // nlohmann stops at a NUL byte as if the input ended there; raw NUL is never valid JSON.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    fail(label, ": invalid JSON: NUL byte at offset ", nul);
  try {
    return nlohmann::json::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::exception& e) {
    std::string what = e.what();
    if (const size_t bracket = what.find("] "); what.starts_with("[json.exception.") && bracket != std::string::npos)
      what.erase(0, bracket + 2);
    // Python's json module writes NaN and Infinity; say so when the parser stopped on one.
    std::string hint;
    if (const auto* pe = dynamic_cast<const nlohmann::json::parse_error*>(&e); pe && pe->byte > 0) {
      const std::string_view rest = text.substr(std::min(static_cast<size_t>(pe->byte) - 1, text.size()));
      if (rest.starts_with("NaN") || rest.starts_with("Infinity"))
        hint = " (NaN and Infinity are not valid JSON numbers)";
    }
    fail(label, ": invalid JSON: ", sanitize(what), hint);
  }
}

JsonConfig::JsonConfig(nlohmann::json value, std::string label, std::string field_prefix)
    : value_(std::move(value)), label_(std::move(label)), prefix_(std::move(field_prefix)) {
  if (!value_.is_object()) fail(label_, ": expected a JSON object, got ", describe_json(value_));
}

JsonConfig JsonConfig::load(const std::string& path) { return parse(read_text_file(path), path); }

JsonConfig JsonConfig::parse(std::string_view text, std::string label) {
  nlohmann::json value = parse_json(text, label);
  return JsonConfig(std::move(value), std::move(label));
}

bool JsonConfig::has(std::string_view field) const {
  const auto it = value_.find(field);
  return it != value_.end() && !it->is_null();
}

std::vector<std::string> JsonConfig::keys() const {
  std::vector<std::string> out;
  for (const auto& item : value_.items()) out.push_back(item.key());
  return out;
}

std::string JsonConfig::field_name(std::string_view field) const { return prefix_ + std::string(field); }

void JsonConfig::fail_shown(const std::string& shown, std::string_view problem) const {
  fail(label_, ": field ", quote(shown), " ", problem);
}

void JsonConfig::fail_field(std::string_view field, std::string_view problem) const {
  fail_shown(field_name(field), problem);
}

void JsonConfig::check_class_name(std::string_view expected) const {
  if (!has("_class_name")) return;
  const std::string name = get_string("_class_name");
  if (name != expected) fail_field("_class_name", "is " + quote(name) + ", expected \"" + std::string(expected) + "\"");
}

void JsonConfig::require_positive(std::string_view field, int64_t value) const {
  if (value <= 0) fail_field(field, "must be positive, got " + std::to_string(value));
}

void JsonConfig::fail_type(const std::string& shown, std::string_view expected, const nlohmann::json& got) const {
  fail_shown(shown, concat_message("must be ", expected, ", got ", describe_json(got)));
}

const nlohmann::json& JsonConfig::require(std::string_view field) const {
  const auto it = value_.find(field);
  if (it == value_.end()) fail_shown(field_name(field), "is missing");
  return *it;
}

int64_t JsonConfig::to_int(const std::string& shown, const nlohmann::json& v, int64_t lo, int64_t hi) const {
  int64_t value;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(INT64_MAX)) fail_shown(shown, concat_message("is ", u, ", out of range"));
    value = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    value = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) && std::fabs(v.get<double>()) >= 9.2e18 &&
             std::trunc(v.get<double>()) == v.get<double>()) {
    // A literal too long for 64 bits is stored as a float by the parser.
    fail_shown(shown, concat_message("is ", v.dump(), ", out of the 64-bit integer range"));
  } else {
    fail_type(shown, "an integer", v);
  }
  if (value < lo || value > hi)
    fail_shown(shown, concat_message("is ", value, ", out of range [", lo, ", ", hi, "]"));
  return value;
}

double JsonConfig::to_float(const std::string& shown, const nlohmann::json& v) const {
  if (!v.is_number()) fail_type(shown, "a number", v);
  const double value = v.get<double>();
  if (!std::isfinite(value)) fail_shown(shown, "must be a finite number");
  return value;
}

int64_t JsonConfig::get_int(std::string_view field) const { return to_int(field_name(field), require(field)); }
int64_t JsonConfig::get_int(std::string_view field, int64_t fallback) const {
  return has(field) ? get_int(field) : fallback;
}

double JsonConfig::get_float(std::string_view field) const { return to_float(field_name(field), require(field)); }
double JsonConfig::get_float(std::string_view field, double fallback) const {
  return has(field) ? get_float(field) : fallback;
}

bool JsonConfig::get_bool(std::string_view field) const {
  const nlohmann::json& v = require(field);
  if (!v.is_boolean()) fail_type(field_name(field), "a boolean", v);
  return v.get<bool>();
}
bool JsonConfig::get_bool(std::string_view field, bool fallback) const {
  return has(field) ? get_bool(field) : fallback;
}

std::string JsonConfig::get_string(std::string_view field) const {
  const nlohmann::json& v = require(field);
  if (!v.is_string()) fail_type(field_name(field), "a string", v);
  return v.get<std::string>();
}
std::string JsonConfig::get_string(std::string_view field, std::string_view fallback) const {
  return has(field) ? get_string(field) : std::string(fallback);
}

std::vector<int64_t> JsonConfig::get_int_list(std::string_view field) const {
  const nlohmann::json& v = require(field);
  if (!v.is_array()) fail_type(field_name(field), "a list of integers", v);
  std::vector<int64_t> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) out.push_back(to_int(field_name(field) + "[" + std::to_string(i) + "]", v[i]));
  return out;
}
std::vector<int64_t> JsonConfig::get_int_list(std::string_view field, std::vector<int64_t> fallback) const {
  return has(field) ? get_int_list(field) : fallback;
}

std::vector<double> JsonConfig::get_float_list(std::string_view field) const {
  const nlohmann::json& v = require(field);
  if (!v.is_array()) fail_type(field_name(field), "a list of numbers", v);
  std::vector<double> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out.push_back(to_float(field_name(field) + "[" + std::to_string(i) + "]", v[i]));
  return out;
}
std::vector<double> JsonConfig::get_float_list(std::string_view field, std::vector<double> fallback) const {
  return has(field) ? get_float_list(field) : fallback;
}

std::vector<std::string> JsonConfig::get_string_list(std::string_view field) const {
  const nlohmann::json& v = require(field);
  if (!v.is_array()) fail_type(field_name(field), "a list of strings", v);
  std::vector<std::string> out;
  out.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) fail_type(field_name(field) + "[" + std::to_string(i) + "]", "a string", v[i]);
    out.push_back(v[i].get<std::string>());
  }
  return out;
}

JsonConfig JsonConfig::get_object(std::string_view field) const {
  const nlohmann::json& v = require(field);
  if (!v.is_object()) fail_type(field_name(field), "an object", v);
  return JsonConfig(v, label_, field_name(field) + ".");
}

}  // namespace xdit
