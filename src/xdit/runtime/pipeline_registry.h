// The pipeline registry: each model family registers the diffusers pipeline classes it runs, so
// the runtime finds a pipeline by the folder's model_index.json and never branches on the family.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "xdit/runtime/run_options.h"

namespace xdit {

struct PipelineSpec {
  std::string pipeline_class;  // diffusers _class_name in model_index.json, e.g. "Flux2KleinPipeline"
  int spatial_multiple = 16;   // height and width must be multiples of this
  std::function<void(const RunOptions&)> run;
  // The model_specific_flags() this pipeline takes; the others are usage errors for it.
  std::vector<std::string> model_flags;
};

// Throws Error when the class is already registered or the spec is incomplete.
void register_pipeline(PipelineSpec spec);

// nullptr when no family registered the class. The pointer stays valid for the process.
const PipelineSpec* find_pipeline(std::string_view pipeline_class);

std::vector<std::string> registered_pipelines();  // sorted

// The bundled demo model's folder: $XDIT_DEMO_MODEL when set, else models/shapes-demo in the
// source tree this binary was built from. Throws a usage error when it holds no model.
std::string bundled_demo_model();

// Runs a generation command: rejects what is not built yet, reads <model>/model_index.json (the
// bundled demo model's without --model), finds the pipeline for its _class_name, checks the
// options against it and runs it.
void run_generation(const RunOptions& options);

}  // namespace xdit
