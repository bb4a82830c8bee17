#include "xdit/io/weights.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "xdit/io/json_config.h"

namespace xdit {

std::string DTypeSet::str() const {
  std::string out;
  for (DType d : {DType::F32, DType::BF16, DType::F16, DType::F8E4M3, DType::F8E5M2, DType::I32, DType::I64}) {
    if (!contains(d)) continue;
    if (!out.empty()) out += '|';
    out += dtype_name(d);
  }
  return out.empty() ? "none" : out;
}

struct WeightBinder::State {
  const TensorSource* source = nullptr;
  std::string root;  // tensors under it must all be declared or ignored
  BindOptions options;
  std::vector<ParamSpec> params;
  std::set<std::string, std::less<>> declared;
  std::vector<std::string> ignored;  // full name prefixes
  bool finished = false;
};

namespace {

bool shape_matches(const Shape& expected, const Shape& found) {
  if (expected.size() != found.size()) return false;
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] != -1 && expected[i] != found[i]) return false;
  }
  return true;
}

std::string plural(size_t n, const char* word) { return std::to_string(n) + " " + word; }

}  // namespace

WeightBinder::WeightBinder(const TensorSource& source, std::string prefix, BindOptions options)
    : state_(std::make_shared<State>()), prefix_(std::move(prefix)) {
  state_->source = &source;
  state_->root = prefix_;
  state_->options = options;
}

WeightBinder::WeightBinder(std::shared_ptr<State> state, std::string prefix)
    : state_(std::move(state)), prefix_(std::move(prefix)) {}

WeightBinder WeightBinder::scoped(std::string_view prefix) const { return WeightBinder(state_, prefix_ + std::string(prefix)); }

const TensorSource& WeightBinder::source() const { return *state_->source; }

void WeightBinder::declare(std::string_view name, Shape shape, Tensor* target, DTypeSet allowed, bool optional) {
  std::string full = prefix_ + std::string(name);
  XDIT_CHECK(!state_->finished, "weight ", quote(full), " declared after finish()");
  XDIT_CHECK(target != nullptr, "weight ", quote(full), " declared without a target");
  XDIT_CHECK(state_->declared.insert(full).second, "weight ", quote(full), " declared twice");
  state_->params.push_back({std::move(full), std::move(shape), allowed, optional, target});
}

void WeightBinder::ignore(std::string_view name_prefix) {
  state_->ignored.push_back(prefix_ + std::string(name_prefix));
}

bool WeightBinder::has(std::string_view name) const { return state_->source->contains(prefix_ + std::string(name)); }

void WeightBinder::finish() {
  State& s = *state_;
  XDIT_CHECK(!s.finished, "WeightBinder::finish() called twice for ", s.source->label());
  const TensorSource& source = *s.source;

  std::vector<std::string> missing, unexpected, wrong_shape, wrong_dtype;
  for (const ParamSpec& p : s.params) {
    if (!source.contains(p.name)) {
      if (!p.optional) missing.push_back(quote(p.name) + " " + shape_str(p.shape));
      continue;
    }
    const TensorInfo& info = source.info(p.name);
    if (!shape_matches(p.shape, info.shape))
      wrong_shape.push_back(quote(p.name) + ": expected " + shape_str(p.shape) + ", found " + shape_str(info.shape));
    if (!p.allowed.contains(info.dtype))
      wrong_dtype.push_back(quote(p.name) + ": expected " + p.allowed.str() + ", found " +
                            std::string(dtype_name(info.dtype)));
  }
  for (const std::string& name : source.names()) {
    if (!name.starts_with(s.root) || s.declared.contains(name)) continue;
    const bool is_ignored =
        std::any_of(s.ignored.begin(), s.ignored.end(), [&](const std::string& p) { return name.starts_with(p); });
    if (!is_ignored) unexpected.push_back(quote(name));
  }

  const size_t problems = missing.size() + unexpected.size() + wrong_shape.size() + wrong_dtype.size();
  if (problems > 0) {
    std::ostringstream msg;
    msg << problems << " weight problem" << (problems == 1 ? "" : "s") << " in " << source.label() << ":";
    const char* sep = " ";
    for (const auto& [list, what] : {std::pair{&missing, "missing"}, std::pair{&unexpected, "unexpected"},
                                     std::pair{&wrong_shape, "wrong shape"}, std::pair{&wrong_dtype, "wrong dtype"}}) {
      if (list->empty()) continue;
      msg << sep << plural(list->size(), what);
      sep = ", ";
    }
    for (const auto& [list, what] : {std::pair{&missing, "missing"}, std::pair{&unexpected, "unexpected"},
                                     std::pair{&wrong_shape, "wrong shape"}, std::pair{&wrong_dtype, "wrong dtype"}}) {
      for (const std::string& line : *list) msg << "\n  " << what << ": " << line;
    }
    throw Error(msg.str());
  }

  for (const ParamSpec& p : s.params) {
    if (!source.contains(p.name)) continue;
    Tensor t = source.tensor(p.name);
    if (s.options.convert_to && is_floating(t.dtype()) && t.dtype() != *s.options.convert_to) {
      const Tensor stored = t;
      t = t.to(*s.options.convert_to);
      drop_file_pages(stored);
    }
    *p.target = std::move(t);
  }
  s.finished = true;
}

}  // namespace xdit
