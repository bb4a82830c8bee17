// Z-Image (diffusers' ZImagePipeline, Turbo and base): encode the prompts, drop the text encoder,
// denoise with the transformer under flow-match Euler (static shift), with CFG against a negative
// prompt when the guidance scale is above 0, drop it, decode with the VAE. Each component's
// weights live only for its stage.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "xdit/core/dtype.h"
#include "xdit/core/rng.h"
#include "xdit/core/tensor.h"
#include "xdit/io/diffusers.h"
#include "xdit/runtime/generation.h"
#include "xdit/runtime/progress.h"
#include "xdit/runtime/run_options.h"
#include "xdit/runtime/timings.h"

namespace xdit::z_image {

// One pipeline call's settings: the command line over Z-Image-Turbo's defaults.
// flow_shift, when set, replaces the scheduler config's shift.
struct Settings : ImageSettings {
  double guidance_scale = 0.0;     // CFG runs above 0
  double cfg_normalization = 0.0;  // above 0: cap |guided| at this times |conditional|, per image
  double cfg_truncation = 1.0;     // no CFG on steps whose (1000 - t) / 1000 exceeds it (when <= 1)

  bool cfg() const { return guidance_scale > 0.0; }
};

class Pipeline {
 public:
  // Reads model_index.json and the component configs; loads no weights.
  static Pipeline open(const std::string& folder);

  // Height and width must be multiples of this: the VAE's scale factor times the 2x2 patchify.
  int64_t latent_multiple() const { return 2 * vae_scale_factor_; }
  const DiffusersRepo& repo() const { return repo_; }

  // Z-Image-Turbo's defaults (8 steps, no guidance, 1024x1024) under the command line's values.
  // Refuses --negative_prompt, --cfg_normalization and --cfg_truncation where no CFG runs.
  Settings settings_for(const RunOptions& options) const;

  using Result = ImageBatch;  // images [B, H, W, 3] F32 in [0, 1] and the call's timings
  // One call for a batch of prompts. `negative_prompts` is empty (diffusers' "") or one per prompt.
  Result generate(const std::vector<std::string>& prompts, const std::vector<std::string>& negative_prompts,
                  const Settings& settings, Progress& progress) const;

 private:
  Pipeline(DiffusersRepo repo, int64_t vae_scale_factor);

  DiffusersRepo repo_;
  int64_t vae_scale_factor_;
};

}  // namespace xdit::z_image
