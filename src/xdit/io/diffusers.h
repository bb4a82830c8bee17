// The diffusers repository layout: model_index.json names the pipeline class and its components;
// each component lives in a folder of the same name with its config and safetensors weights.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "xdit/core/dtype.h"
#include "xdit/io/json_config.h"
#include "xdit/io/safetensors.h"

namespace xdit {

struct ComponentSpec {
  std::string name;        // "transformer"; also its folder name
  std::string library;     // "diffusers", "transformers"
  std::string class_name;  // "Flux2Transformer2DModel"
};

struct ModelIndex {
  std::string pipeline_class;     // _class_name
  std::string diffusers_version;  // _diffusers_version, empty when absent
  std::vector<ComponentSpec> components;  // sorted by name; null and [null, null] entries are left out
};

// Reads the fields of a parsed model_index.json (no filesystem access). Entries whose value is a
// list are components and must be [library, class] strings or [null, null]; other values (flags
// like "requires_safety_checker") are pipeline options, left in the JSON.
ModelIndex parse_model_index(const JsonConfig& model_index);

// The weights of a component folder, as a file name; variant "fp16" picks the diffusers variant
// files (diffusion_pytorch_model.fp16.safetensors, ...). Looks for, in order:
//   diffusion_pytorch_model[.variant].safetensors, model[.variant].safetensors,
//   diffusion_pytorch_model.safetensors.index[.variant].json, model.safetensors.index[.variant].json.
// nullopt when none exists.
std::optional<std::string> find_weights_file(const std::string& component_dir, std::string_view variant = {});

// Opens the weights found by find_weights_file (single file or sharded); throws naming the folder
// and the names looked for when there are none.
std::unique_ptr<TensorSource> open_weights(const std::string& component_dir, std::string_view variant = {});

// Parameter counts and bytes of a set of weights, by stored dtype.
struct WeightStats {
  std::map<DType, int64_t> params_by_dtype;
  int64_t params = 0;
  uint64_t bytes = 0;
  size_t tensors = 0;
};
WeightStats weight_stats(const TensorSource& source);

class DiffusersRepo {
 public:
  // Reads <folder>/model_index.json and checks that every listed component's folder exists.
  static DiffusersRepo open(const std::string& folder);

  const std::string& folder() const { return folder_; }
  const JsonConfig& model_index() const { return model_index_; }
  const std::string& pipeline_class() const { return index_.pipeline_class; }
  const std::string& diffusers_version() const { return index_.diffusers_version; }
  const std::vector<ComponentSpec>& components() const { return index_.components; }

  bool has_component(std::string_view name) const;
  const ComponentSpec& component(std::string_view name) const;  // throws naming the component
  std::string component_dir(std::string_view name) const;
  // A file of a component folder (tokenizer.json, ...); throws when it does not exist.
  std::string component_file(std::string_view name, std::string_view file) const;
  // config.json, or scheduler_config.json for schedulers.
  JsonConfig component_config(std::string_view name) const;
  std::optional<std::string> component_weights_file(std::string_view name, std::string_view variant = {}) const;
  std::unique_ptr<TensorSource> component_weights(std::string_view name, std::string_view variant = {}) const;

 private:
  DiffusersRepo(std::string folder, JsonConfig model_index, ModelIndex index);

  std::string folder_;
  JsonConfig model_index_;
  ModelIndex index_;
};

}  // namespace xdit
