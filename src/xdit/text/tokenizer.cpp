#include "xdit/text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "xdit/core/error.h"
#include "xdit/io/json_config.h"

namespace xdit {
namespace {

using nlohmann::json;

// obj[key], or null when obj is not an object or lacks the key.
const json& member(const json& obj, std::string_view key) {
  static const json null_value;
  auto it = obj.find(std::string(key));
  return it == obj.end() ? null_value : *it;
}

// The pattern the ByteLevel pre-tokenizer applies when its use_regex is true (GPT-2's).
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Cached BPE results per piece; cleared when full so memory stays bounded on long inputs.
constexpr size_t kCacheLimit = 20000;

using Regex = std::shared_ptr<pcre2_code>;

Regex compile_regex(std::string_view pattern, const std::string& where) {
  int code = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                 PCRE2_UTF | PCRE2_UCP, &code, &offset, nullptr);
  if (!re) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(code, message, sizeof message);
    fail(where, ": cannot compile regex at offset ", offset, ": ", reinterpret_cast<char*>(message));
  }
  pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);  // a failure only means the slower interpreter runs
  return Regex(re, pcre2_code_free);
}

// "Isolated" split: every match is a piece and so is every non-empty gap between matches.
std::vector<std::string> split_isolated(const std::string& text, const pcre2_code* re) {
  std::vector<std::string> pieces;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create_from_pattern(re, nullptr), pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0, last = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(re, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) fail("tokenizer: regex match failed with PCRE2 error ", rc);
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data.get());
    if (ov[0] == ov[1]) {  // an empty match carries no text: step over one character
      pos = ov[0] + 1;
      while (pos < text.size() && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (ov[0] > last) pieces.push_back(text.substr(last, ov[0] - last));
    pieces.push_back(text.substr(ov[0], ov[1] - ov[0]));
    last = pos = ov[1];
  }
  if (last < text.size()) pieces.push_back(text.substr(last));
  return pieces;
}

std::string encode_utf8(int32_t cp) {
  utf8proc_uint8_t buf[4];
  auto n = utf8proc_encode_char(cp, buf);
  return std::string(reinterpret_cast<char*>(buf), static_cast<size_t>(n));
}

// Decodes the code point at `pos` (the text is already validated) and advances `pos`.
int32_t next_char(std::string_view text, size_t& pos) {
  utf8proc_int32_t cp = 0;
  auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data()) + pos,
                            static_cast<utf8proc_ssize_t>(text.size() - pos), &cp);
  pos += static_cast<size_t>(n);
  return cp;
}

void check_utf8(std::string_view text, std::string_view what) {
  for (size_t pos = 0; pos < text.size();) {
    utf8proc_int32_t cp = 0;
    auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data()) + pos,
                              static_cast<utf8proc_ssize_t>(text.size() - pos), &cp);
    if (n < 0) {
      fail(what, " is not valid UTF-8: bad sequence at byte offset ", pos, " (byte 0x", std::hex,
           static_cast<int>(static_cast<uint8_t>(text[pos])), ")");
    }
    pos += static_cast<size_t>(n);
  }
}

std::string nfc(std::string_view text) {
  utf8proc_uint8_t* out = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                        static_cast<utf8proc_ssize_t>(text.size()), &out,
                        static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) fail("tokenizer: NFC normalisation failed: ", utf8proc_errmsg(n));
  std::string result(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

bool is_space(int32_t cp) {
  auto cat = utf8proc_category(cp);
  return (cp >= 9 && cp <= 13) || cp == 0x85 || cat == UTF8PROC_CATEGORY_ZS ||
         cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

// Letters, digits and '_' (what the `tokenizers` library treats as word characters).
bool is_word(int32_t cp) {
  auto cat = utf8proc_category(cp);
  return cp == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}

size_t prev_char_start(std::string_view text, size_t pos) {
  do --pos;
  while (pos > 0 && (static_cast<uint8_t>(text[pos]) & 0xC0) == 0x80);
  return pos;
}

// GPT-2's reversible map from bytes to printable code points: printable Latin-1 bytes map to
// themselves, the rest to 256, 257, ... in byte order.
std::array<int32_t, 256> byte_to_code_point() {
  std::array<int32_t, 256> table{};
  int32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    table[b] = printable ? b : next++;
  }
  return table;
}

}  // namespace

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool lstrip = false, rstrip = false, single_word = false;
};

// One pre-tokenizer step, applied to every piece in turn.
struct PreStep {
  Regex split;                    // Split step: isolate the regex's matches
  bool byte_level = false;        // ByteLevel step
  bool add_prefix_space = false;  // ByteLevel: prepend ' ' to pieces not starting with one
};

struct Tokenizer::Impl {
  std::string path;
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> id_to_token;  // empty where no token has the id
  std::vector<bool> is_added;
  std::unordered_map<uint64_t, std::pair<int64_t, int64_t>> merges;  // (left, right) ids -> rank, merged id
  std::vector<AddedToken> added;  // longest first, so the longest match wins
  bool normalize_nfc = false;
  bool ignore_merges = false;
  std::vector<PreStep> steps;
  std::vector<int64_t> template_prefix, template_suffix;  // the post-processor's special tokens
  std::array<std::string, 256> byte_symbols;
  std::unordered_map<int32_t, uint8_t> symbol_bytes;

  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int64_t>> cache;

  [[noreturn]] void fail_field(std::string_view field, std::string_view problem) const {
    fail(path, ": field \"", field, "\" ", problem);
  }

  static uint64_t pair_key(int64_t a, int64_t b) { return (static_cast<uint64_t>(a) << 32) | static_cast<uint64_t>(b); }

  void load(const json& root);
  void load_model(const json& model);
  void load_added(const json& list);
  void load_pre_tokenizer(const json& pre, const std::string& field);
  void check_decoder(const json& root) const;
  void load_post_processor(const json& pp, const std::string& field);

  std::vector<std::pair<std::string_view, int64_t>> split_added(std::string_view text) const;
  std::vector<int64_t> bpe(const std::string& piece) const;
};

void Tokenizer::Impl::load_model(const json& model) {
  if (!model.is_object()) fail_field("model", "must be an object");
  if (model.value("type", std::string("BPE")) != "BPE")
    fail_field("model.type", "must be \"BPE\", got " + quote(model["type"].dump()));
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(affix) && !model[affix].is_null() && model[affix] != "")
      fail_field(std::string("model.") + affix, "is not supported by byte-level BPE");
  if (model.contains("dropout") && !model["dropout"].is_null() && model["dropout"] != 0)
    fail_field("model.dropout", "is not supported (encoding must be deterministic)");
  ignore_merges = model.value("ignore_merges", false);

  const json& v = member(model, "vocab");
  if (!v.is_object()) fail_field("model.vocab", "must be an object of token -> id");
  int64_t max_id = -1;
  for (const auto& [token, id] : v.items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
      fail_field("model.vocab", "gives token " + quote(token) + " the invalid id " + id.dump());
    vocab.emplace(token, id.get<int64_t>());
    max_id = std::max(max_id, id.get<int64_t>());
  }
  id_to_token.assign(static_cast<size_t>(max_id + 1), {});
  is_added.assign(id_to_token.size(), false);
  for (const auto& [token, id] : vocab) id_to_token[static_cast<size_t>(id)] = token;

  const json& m = member(model, "merges");
  if (!m.is_array()) fail_field("model.merges", "must be an array");
  auto id_of = [&](const std::string& token, size_t rank) {
    auto it = vocab.find(token);
    if (it == vocab.end())
      fail_field("model.merges",
                 "entry " + std::to_string(rank) + " uses " + quote(token) + ", which is not in model.vocab");
    return it->second;
  };
  for (size_t rank = 0; rank < m.size(); ++rank) {
    const json& e = m[rank];
    std::string a, b;
    if (e.is_string()) {
      const std::string s = e.get<std::string>();
      size_t space = s.find(' ');
      if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos)
        fail_field("model.merges", "entry " + std::to_string(rank) + " " + quote(s) + " is not \"left right\"");
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      a = e[0].get<std::string>();
      b = e[1].get<std::string>();
    } else {
      fail_field("model.merges", "entry " + std::to_string(rank) + " must be a string or a pair of strings");
    }
    merges.emplace(pair_key(id_of(a, rank), id_of(b, rank)), std::pair{static_cast<int64_t>(rank), id_of(a + b, rank)});
  }
}

void Tokenizer::Impl::load_added(const json& list) {
  if (list.is_null()) return;
  if (!list.is_array()) fail_field("added_tokens", "must be an array");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& e = list[i];
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    if (!e.is_object() || !e.contains("id") || !e["id"].is_number_integer() || e["id"].get<int64_t>() < 0 ||
        e["id"].get<int64_t>() > INT32_MAX || !e.contains("content") || !e["content"].is_string() ||
        e["content"].get<std::string>().empty())
      fail_field(field, "must have a non-negative integer \"id\" and a non-empty string \"content\"");
    AddedToken t{e["content"].get<std::string>(), e["id"].get<int64_t>()};
    auto flag = [&](const char* name) {
      if (!e.contains(name) || e[name].is_null()) return false;
      if (!e[name].is_boolean()) fail_field(field + "." + name, "must be a boolean");
      return e[name].get<bool>();
    };
    t.lstrip = flag("lstrip");
    t.rstrip = flag("rstrip");
    t.single_word = flag("single_word");
    flag("special");     // type-checked only: special tokens are matched like any added token
    flag("normalized");  // type-checked only: added tokens are matched on the raw text
    check_utf8(t.content, path + ": field \"" + field + ".content\"");
    if (static_cast<size_t>(t.id) >= id_to_token.size()) {
      id_to_token.resize(static_cast<size_t>(t.id) + 1);
      is_added.resize(id_to_token.size(), false);
    }
    id_to_token[static_cast<size_t>(t.id)] = t.content;
    is_added[static_cast<size_t>(t.id)] = true;
    added.push_back(std::move(t));
  }
  std::stable_sort(added.begin(), added.end(),
                   [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
}

void Tokenizer::Impl::load_pre_tokenizer(const json& pre, const std::string& field) {
  if (!pre.is_object() || !pre.contains("type") || !pre["type"].is_string())
    fail_field(field, "must be an object with a string \"type\"");
  const std::string type = pre["type"].get<std::string>();
  if (type == "Sequence") {
    const json& list = member(pre, "pretokenizers");
    if (!list.is_array()) fail_field(field + ".pretokenizers", "must be an array");
    for (size_t i = 0; i < list.size(); ++i)
      load_pre_tokenizer(list[i], field + ".pretokenizers[" + std::to_string(i) + "]");
  } else if (type == "Split") {
    const json& pattern = member(pre, "pattern");
    if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string())
      fail_field(field + ".pattern", "must be {\"Regex\": ...} (other pattern kinds are not supported)");
    if (pre.value("behavior", std::string()) != "Isolated")
      fail_field(field + ".behavior", "must be \"Isolated\", got " + quote(member(pre, "behavior").dump()));
    if (pre.value("invert", false)) fail_field(field + ".invert", "must be false");
    steps.push_back({compile_regex(pattern["Regex"].get<std::string>(), path + ": field \"" + field + ".pattern\"")});
  } else if (type == "ByteLevel") {
    PreStep step;
    step.byte_level = true;
    step.add_prefix_space = pre.value("add_prefix_space", false);
    if (pre.value("use_regex", true)) step.split = compile_regex(kGpt2Pattern, path + ": GPT-2 pattern");
    steps.push_back(std::move(step));
  } else {
    fail_field(field + ".type", "has unsupported type " + quote(type));
  }
}

// The decoder does nothing to our bytes; accept only the kinds that do not.
void Tokenizer::Impl::check_decoder(const json& root) const {
  const json& c = member(root, "decoder");
  if (c.is_null()) return;
  const std::string type = c.is_object() ? c.value("type", std::string()) : std::string();
  if (type != "ByteLevel") fail_field("decoder.type", "has unsupported type " + quote(type));
}

// ByteLevel only adjusts offsets; TemplateProcessing wraps a single sequence in special tokens;
// a Sequence applies its processors in order, each wrapping the result of the one before.
void Tokenizer::Impl::load_post_processor(const json& pp, const std::string& field) {
  if (pp.is_null()) return;
  const std::string type = pp.is_object() ? pp.value("type", std::string()) : std::string();
  if (type == "ByteLevel") return;
  if (type == "Sequence") {
    const json& list = member(pp, "processors");
    if (!list.is_array()) fail_field(field + ".processors", "must be an array");
    for (size_t i = 0; i < list.size(); ++i)
      load_post_processor(list[i], field + ".processors[" + std::to_string(i) + "]");
    return;
  }
  if (type != "TemplateProcessing") fail_field(field + ".type", "has unsupported type " + quote(type));

  const json& single = member(pp, "single");
  if (!single.is_array()) fail_field(field + ".single", "must be an array");
  const json& specials = member(pp, "special_tokens");
  std::vector<int64_t> before, after;
  bool seen_sequence = false;
  for (size_t i = 0; i < single.size(); ++i) {
    const std::string item = field + ".single[" + std::to_string(i) + "]";
    const json& e = single[i];
    if (e.contains("Sequence")) {
      if (seen_sequence || e["Sequence"].value("id", std::string()) != "A")
        fail_field(item, "must be the one sequence \"A\" of a single-sequence template");
      seen_sequence = true;
      continue;
    }
    const std::string name = member(member(e, "SpecialToken"), "id").is_string()
                                 ? e["SpecialToken"]["id"].get<std::string>()
                                 : std::string();
    if (name.empty()) fail_field(item, "must be {\"Sequence\": ...} or {\"SpecialToken\": {\"id\": ...}}");
    const json& ids = member(member(specials, name), "ids");
    if (!ids.is_array() || ids.empty()) fail_field(field + ".special_tokens", "has no ids for " + quote(name));
    for (const json& id : ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
          id.get<int64_t>() >= static_cast<int64_t>(id_to_token.size()))
        fail_field(field + ".special_tokens", "gives " + quote(name) + " the unknown id " + id.dump());
      (seen_sequence ? after : before).push_back(id.get<int64_t>());
    }
  }
  if (!seen_sequence) fail_field(field + ".single", "has no sequence \"A\"");
  template_prefix.insert(template_prefix.begin(), before.begin(), before.end());
  template_suffix.insert(template_suffix.end(), after.begin(), after.end());
}

// Splits `text` into runs of plain text (id -1) and added tokens (their id), leftmost-longest.
std::vector<std::pair<std::string_view, int64_t>> Tokenizer::Impl::split_added(std::string_view text) const {
  std::vector<std::pair<std::string_view, int64_t>> parts;
  size_t plain = 0;  // start of the pending plain text
  for (size_t pos = 0; pos < text.size();) {
    const AddedToken* hit = nullptr;
    for (const AddedToken& t : added) {
      if (text.compare(pos, t.content.size(), t.content) != 0) continue;
      if (t.single_word) {
        size_t before = pos, after = pos + t.content.size();
        if (before > 0 && (before = prev_char_start(text, before), is_word(next_char(text, before)))) continue;
        if (after < text.size() && is_word(next_char(text, after))) continue;
      }
      hit = &t;
      break;
    }
    if (!hit) {
      next_char(text, pos);
      continue;
    }
    size_t start = pos, end = pos + hit->content.size();
    while (hit->lstrip && start > plain) {
      size_t prev = prev_char_start(text, start), probe = prev;
      if (!is_space(next_char(text, probe))) break;
      start = prev;
    }
    while (hit->rstrip && end < text.size()) {
      size_t probe = end;
      if (!is_space(next_char(text, probe))) break;
      end = probe;
    }
    if (start > plain) parts.emplace_back(text.substr(plain, start - plain), -1);
    parts.emplace_back(text.substr(start, end - start), hit->id);
    plain = pos = end;
  }
  if (plain < text.size()) parts.emplace_back(text.substr(plain), -1);
  return parts;
}

std::vector<int64_t> Tokenizer::Impl::bpe(const std::string& piece) const {
  {
    std::lock_guard lock(cache_mutex);
    if (auto it = cache.find(piece); it != cache.end()) return it->second;
  }
  std::string mapped;
  for (char c : piece) mapped += byte_symbols[static_cast<uint8_t>(c)];
  std::vector<int64_t> ids;
  if (auto it = vocab.find(mapped); ignore_merges && it != vocab.end()) {
    ids.push_back(it->second);
  } else {
    for (char c : piece) {
      const std::string& symbol = byte_symbols[static_cast<uint8_t>(c)];
      auto found = vocab.find(symbol);
      if (found == vocab.end()) fail(path, ": model.vocab lacks the byte symbol ", quote(symbol));
      ids.push_back(found->second);
    }
    // Merge the lowest-ranked adjacent pair (leftmost on ties) until no pair has a merge.
    while (ids.size() > 1) {
      int64_t best_rank = INT64_MAX, merged = 0;
      size_t best = 0;
      for (size_t i = 0; i + 1 < ids.size(); ++i) {
        auto it = merges.find(pair_key(ids[i], ids[i + 1]));
        if (it != merges.end() && it->second.first < best_rank) {
          best_rank = it->second.first;
          merged = it->second.second;
          best = i;
        }
      }
      if (best_rank == INT64_MAX) break;
      ids[best] = merged;
      ids.erase(ids.begin() + static_cast<std::ptrdiff_t>(best) + 1);
    }
  }
  std::lock_guard lock(cache_mutex);
  if (cache.size() >= kCacheLimit) cache.clear();
  cache.emplace(piece, ids);
  return ids;
}

TokenizerConfig TokenizerConfig::load(const std::filesystem::path& path) {
  const JsonConfig config = JsonConfig::load(path.string());
  auto token = [&](std::string_view field) -> std::optional<std::string> {
    if (!config.has(field)) return std::nullopt;
    const json& value = config.json().at(std::string(field));
    if (value.is_string()) return value.get<std::string>();
    if (value.is_object()) return config.get_object(field).get_string("content");  // a serialized AddedToken
    config.fail_field(field, "must be a string or an object with \"content\", got " + describe_json(value));
  };
  auto side = [&](std::string_view field) {
    std::string value = config.get_string(field, "right");
    if (value != "left" && value != "right")
      config.fail_field(field, "is " + quote(value) + "; expected \"left\" or \"right\"");
    return value;
  };
  auto max_length = [&]() -> std::optional<int64_t> {
    constexpr std::string_view kField = "model_max_length";
    if (!config.has(kField)) return std::nullopt;
    const json& value = config.json().at(std::string(kField));
    if (value.is_number_float() && value.get<double>() > static_cast<double>(std::numeric_limits<int64_t>::max()))
      return std::nullopt;
    const int64_t length = config.get_int(kField);
    if (length < 1) config.fail_field(kField, concat_message("is ", length, "; expected a positive token count"));
    return length;
  };
  return {token("bos_token"),    token("eos_token"),       token("pad_token"),
          side("padding_side"), side("truncation_side"), max_length()};
}

int64_t right_padding_id(const Tokenizer& tokenizer, const TokenizerConfig& config,
                         const std::filesystem::path& config_path) {
  if (!config.pad_token) fail(config_path.string(), ": field \"pad_token\" is missing; the prompts are padded with it");
  for (const auto& [field, value] :
       {std::pair{"padding_side", config.padding_side}, std::pair{"truncation_side", config.truncation_side}}) {
    if (value != "right")
      fail(config_path.string(), ": field \"", field, "\" is ", quote(value), "; only \"right\" is supported");
  }
  return tokenizer.token_id(*config.pad_token);
}

void warn_truncated_prompts(const PaddedTokens& tokens, int64_t max_length) {
  for (size_t i = 0; i < tokens.untruncated_tokens.size(); ++i) {
    if (tokens.untruncated_tokens[i] > max_length)
      std::fprintf(stderr, "xdit: warning: prompt %zu has %lld tokens; truncated to max_sequence_length %lld\n", i,
                   static_cast<long long>(tokens.untruncated_tokens[i]), static_cast<long long>(max_length));
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  auto impl = std::make_unique<Impl>();
  impl->path = path.string();
  try {
    impl->load(parse_json(read_text_file(impl->path), impl->path));
  } catch (const json::exception& e) {  // a field of an unexpected JSON type deep in a component
    fail(impl->path, ": unexpected JSON value: ", e.what());
  }
  return Tokenizer(std::move(impl));
}

void Tokenizer::Impl::load(const json& root) {
  if (!root.is_object()) fail(path, ": expected a JSON object, got ", describe_json(root));

  load_model(member(root, "model"));
  load_added(member(root, "added_tokens"));

  const json& norm = member(root, "normalizer");
  if (!norm.is_null()) {
    const std::string type = norm.is_object() ? norm.value("type", std::string()) : std::string();
    if (type != "NFC")
      fail_field("normalizer.type", "has unsupported type " + quote(type) + " (only NFC or null)");
    normalize_nfc = true;
  }

  if (member(root, "pre_tokenizer").is_null())
    fail_field("pre_tokenizer", "is missing (byte-level BPE needs a ByteLevel pre-tokenizer)");
  load_pre_tokenizer(member(root, "pre_tokenizer"), "pre_tokenizer");
  if (std::none_of(steps.begin(), steps.end(), [](const PreStep& s) { return s.byte_level; }))
    fail_field("pre_tokenizer", "has no ByteLevel step");

  check_decoder(root);
  load_post_processor(member(root, "post_processor"), "post_processor");

  const auto table = byte_to_code_point();
  for (int b = 0; b < 256; ++b) {
    byte_symbols[b] = encode_utf8(table[b]);
    symbol_bytes.emplace(table[b], static_cast<uint8_t>(b));
  }
}

std::vector<int64_t> Tokenizer::encode(std::string_view text) const {
  check_utf8(text, "tokenizer input");
  std::vector<int64_t> ids;
  for (const auto& [part, id] : impl_->split_added(text)) {
    if (id >= 0) {
      ids.push_back(id);
      continue;
    }
    std::vector<std::string> pieces{impl_->normalize_nfc ? nfc(part) : std::string(part)};
    for (const PreStep& step : impl_->steps) {
      std::vector<std::string> next;
      for (std::string& piece : pieces) {
        if (step.add_prefix_space && piece.front() != ' ') piece.insert(0, 1, ' ');
        if (!step.split) {
          next.push_back(std::move(piece));
          continue;
        }
        for (std::string& sub : split_isolated(piece, step.split.get())) next.push_back(std::move(sub));
      }
      pieces = std::move(next);
    }
    for (const std::string& piece : pieces) {
      std::vector<int64_t> piece_ids = impl_->bpe(piece);
      ids.insert(ids.end(), piece_ids.begin(), piece_ids.end());
    }
  }
  return ids;
}

std::vector<int64_t> Tokenizer::encode(std::string_view text, size_t max_length) const {
  std::vector<int64_t> ids = encode(text);
  if (ids.size() > max_length) ids.resize(max_length);
  return ids;
}

std::vector<int64_t> Tokenizer::with_special_tokens(std::span<const int64_t> ids) const {
  std::vector<int64_t> out(impl_->template_prefix);
  out.insert(out.end(), ids.begin(), ids.end());
  out.insert(out.end(), impl_->template_suffix.begin(), impl_->template_suffix.end());
  return out;
}

PaddedTokens Tokenizer::encode_padded(const std::vector<std::string>& texts, size_t length, int64_t pad_id) const {
  XDIT_CHECK(length > 0, "tokenizer: the padded length must be > 0");
  XDIT_CHECK(pad_id >= 0 && pad_id < vocab_size(), impl_->path, ": padding id ", pad_id,
             " is outside the vocabulary of ", vocab_size());
  const auto batch = static_cast<int64_t>(texts.size());
  const auto width = static_cast<int64_t>(length);
  PaddedTokens out{Tensor::empty({batch, width}, DType::I64), Tensor::zeros({batch, width}, DType::I64), {}};
  int64_t* ids = out.input_ids.data<int64_t>();
  int64_t* mask = out.attention_mask.data<int64_t>();
  std::fill_n(ids, batch * width, pad_id);
  for (int64_t b = 0; b < batch; ++b) {
    const std::vector<int64_t> row = encode(texts[static_cast<size_t>(b)]);
    out.untruncated_tokens.push_back(static_cast<int64_t>(row.size()));
    const size_t kept = std::min(row.size(), length);
    std::copy_n(row.begin(), kept, ids + b * width);
    std::fill_n(mask + b * width, kept, int64_t{1});
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int64_t> ids) const {
  std::string out;
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size() || impl_->id_to_token[static_cast<size_t>(id)].empty())
      fail(impl_->path, ": cannot decode unknown token id ", id);
    const std::string& token = impl_->id_to_token[static_cast<size_t>(id)];
    if (impl_->is_added[static_cast<size_t>(id)]) {
      out += token;
      continue;
    }
    for (size_t pos = 0; pos < token.size();) {
      auto it = impl_->symbol_bytes.find(next_char(token, pos));
      if (it == impl_->symbol_bytes.end())
        fail(impl_->path, ": token ", quote(token), " (id ", id, ") is not byte-level");
      out += static_cast<char>(it->second);
    }
  }
  check_utf8(out, "decoded text");
  return out;
}

int64_t Tokenizer::token_id(std::string_view token) const {
  for (const AddedToken& t : impl_->added)
    if (t.content == token) return t.id;
  auto it = impl_->vocab.find(std::string(token));
  if (it == impl_->vocab.end()) fail(impl_->path, ": no token ", quote(token));
  return it->second;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_token.size()); }

}  // namespace xdit
