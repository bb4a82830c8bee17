#include "xdit/runtime/pipeline_registry.h"

#include "xdit/io/diffusers.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <utility>

namespace xdit {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, PipelineSpec, std::less<>> specs;  // std::map: entries never move
};

// A function-local static, so families may register from their own static initialisers.
Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

void register_pipeline(PipelineSpec spec) {
  XDIT_CHECK(!spec.pipeline_class.empty(), "register_pipeline: the pipeline class name is empty");
  XDIT_CHECK(spec.spatial_multiple >= 1, "register_pipeline: ", spec.pipeline_class, " has spatial_multiple ",
             spec.spatial_multiple);
  XDIT_CHECK(static_cast<bool>(spec.run), "register_pipeline: ", spec.pipeline_class, " has no run function");
  const std::vector<std::string> known = model_specific_flags();
  for (const std::string& flag : spec.model_flags) {
    XDIT_CHECK(std::find(known.begin(), known.end(), flag) != known.end(), "register_pipeline: ",
               spec.pipeline_class, " lists ", flag, ", which is not a model-specific flag");
  }
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const std::string name = spec.pipeline_class;
  XDIT_CHECK(!r.specs.contains(name), "register_pipeline: ", name, " is registered twice");
  r.specs.emplace(name, std::move(spec));
}

const PipelineSpec* find_pipeline(std::string_view pipeline_class) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  const auto found = r.specs.find(pipeline_class);
  return found == r.specs.end() ? nullptr : &found->second;
}

std::vector<std::string> registered_pipelines() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, spec] : r.specs) names.push_back(name);
  return names;
}

std::string bundled_demo_model() {
  const char* environment = std::getenv("XDIT_DEMO_MODEL");
  const bool from_environment = environment && *environment;
  const std::string folder = from_environment ? environment : XDIT_DEMO_MODEL_DIR;
  if (!std::filesystem::is_regular_file(std::filesystem::path(folder) / "model_index.json")) {
    throw UsageError(concat_message("no --model given, and the bundled demo model is not at ", folder,
                                    from_environment ? " (XDIT_DEMO_MODEL)" : "", "; pass --model <diffusers folder>"));
  }
  return folder;
}

void run_generation(const RunOptions& options) {
  reject_unsupported(options);
  RunOptions resolved = options;
  if (!resolved.model) resolved.model = bundled_demo_model();
  const std::filesystem::path folder(*resolved.model);
  if (!std::filesystem::is_directory(folder)) {
    throw NotSupported(concat_message("--model ", *resolved.model, " is not a local folder; Hub repo ids"));
  }
  const std::string pipeline_class = DiffusersRepo::open(folder.string()).pipeline_class();
  const PipelineSpec* spec = find_pipeline(pipeline_class);
  if (!spec) throw NotSupported("pipeline class " + pipeline_class);
  validate_for_pipeline(resolved, *spec);
  spec->run(resolved);
}

}  // namespace xdit
