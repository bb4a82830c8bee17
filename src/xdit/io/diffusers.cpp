#include "xdit/io/diffusers.h"

#include <algorithm>
#include <filesystem>

namespace xdit {

namespace fs = std::filesystem;

namespace {

bool is_file(const fs::path& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

bool is_dir(const fs::path& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

// Component names become folder names, so they must not reach outside the repository.
bool is_safe_folder_name(std::string_view name) {
  if (name.empty() || name == "." || name == "..") return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-' ||
           c == '.';
  });
}

std::vector<std::string> weight_file_candidates(std::string_view variant) {
  std::string v;
  if (!variant.empty()) v = concat_message('.', variant);
  return {"diffusion_pytorch_model" + v + ".safetensors", "model" + v + ".safetensors",
          "diffusion_pytorch_model.safetensors.index" + v + ".json", "model.safetensors.index" + v + ".json"};
}

}  // namespace

ModelIndex parse_model_index(const JsonConfig& model_index) {
  ModelIndex out;
  out.pipeline_class = model_index.get_string("_class_name");
  out.diffusers_version = model_index.get_string("_diffusers_version", "");
  for (const auto& item : model_index.json().items()) {
    const std::string& name = item.key();
    const nlohmann::json& value = item.value();
    if (name.starts_with("_") || !value.is_array()) continue;
    if (value.size() == 2 && value[0].is_null() && value[1].is_null()) continue;
    if (value.size() != 2 || !value[0].is_string() || !value[1].is_string())
      model_index.fail_field(name, "must be a component [library, class] of two strings or [null, null]");
    if (!is_safe_folder_name(name))
      model_index.fail_field(name, "is not a valid component folder name");
    out.components.push_back({name, value[0].get<std::string>(), value[1].get<std::string>()});
  }
  return out;
}

std::optional<std::string> find_weights_file(const std::string& component_dir, std::string_view variant) {
  for (const std::string& name : weight_file_candidates(variant)) {
    const fs::path path = fs::path(component_dir) / name;
    if (is_file(path)) return path.string();
  }
  return std::nullopt;
}

std::unique_ptr<TensorSource> open_weights(const std::string& component_dir, std::string_view variant) {
  const std::optional<std::string> path = find_weights_file(component_dir, variant);
  if (!path) {
    std::string looked_for;
    for (const std::string& name : weight_file_candidates(variant))
      looked_for += (looked_for.empty() ? "" : ", ") + name;
    const bool has_bin = is_file(fs::path(component_dir) / "diffusion_pytorch_model.bin") ||
                         is_file(fs::path(component_dir) / "pytorch_model.bin");
    fail(component_dir, ": no safetensors weights (looked for ", looked_for, ")",
         has_bin ? "; PyTorch .bin weights are not supported, convert them to safetensors" : "");
  }
  if (path->ends_with(".json")) return std::make_unique<ShardedSafetensors>(ShardedSafetensors::open(*path));
  return std::make_unique<SafetensorsFile>(SafetensorsFile::open(*path));
}

WeightStats weight_stats(const TensorSource& source) {
  WeightStats stats;
  for (const std::string& name : source.names()) {
    const TensorInfo& info = source.info(name);
    const int64_t n = shape_numel(info.shape);
    stats.params_by_dtype[info.dtype] += n;
    stats.params += n;
    stats.bytes += info.nbytes();
    ++stats.tensors;
  }
  return stats;
}

DiffusersRepo::DiffusersRepo(std::string folder, JsonConfig model_index, ModelIndex index)
    : folder_(std::move(folder)), model_index_(std::move(model_index)), index_(std::move(index)) {}

DiffusersRepo DiffusersRepo::open(const std::string& folder) {
  if (!is_dir(folder)) fail(folder, ": no such folder");
  const fs::path index_path = fs::path(folder) / "model_index.json";
  if (!is_file(index_path)) fail(folder, ": not a diffusers model folder (no model_index.json)");
  JsonConfig model_index = JsonConfig::load(index_path.string());
  ModelIndex index = parse_model_index(model_index);
  for (const ComponentSpec& c : index.components) {
    const fs::path dir = fs::path(folder) / c.name;
    if (!is_dir(dir))
      fail(index_path.string(), ": component ", quote(c.name), " (", c.library, " ", c.class_name,
           ") has no folder ", dir.string());
  }
  return DiffusersRepo(folder, std::move(model_index), std::move(index));
}

bool DiffusersRepo::has_component(std::string_view name) const {
  return std::any_of(index_.components.begin(), index_.components.end(),
                     [&](const ComponentSpec& c) { return c.name == name; });
}

const ComponentSpec& DiffusersRepo::component(std::string_view name) const {
  for (const ComponentSpec& c : index_.components)
    if (c.name == name) return c;
  fail(folder_, ": model_index.json lists no component ", quote(name));
}

std::string DiffusersRepo::component_dir(std::string_view name) const {
  return (fs::path(folder_) / component(name).name).string();
}

std::string DiffusersRepo::component_file(std::string_view name, std::string_view file) const {
  const fs::path path = fs::path(component_dir(name)) / file;
  if (!is_file(path)) fail(path.string(), ": missing (component ", quote(name), ")");
  return path.string();
}

JsonConfig DiffusersRepo::component_config(std::string_view name) const {
  const fs::path dir = component_dir(name);
  for (const char* file : {"config.json", "scheduler_config.json"}) {
    if (is_file(dir / file)) return JsonConfig::load((dir / file).string());
  }
  fail(dir.string(), ": no config.json or scheduler_config.json for component ", quote(name));
}

std::optional<std::string> DiffusersRepo::component_weights_file(std::string_view name,
                                                                 std::string_view variant) const {
  return find_weights_file(component_dir(name), variant);
}

std::unique_ptr<TensorSource> DiffusersRepo::component_weights(std::string_view name, std::string_view variant) const {
  return open_weights(component_dir(name), variant);
}

}  // namespace xdit
