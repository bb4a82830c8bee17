// The FLUX.2 pipelines (diffusers' Flux2KleinPipeline and Flux2Pipeline): encode the prompts, drop
// the text encoder, denoise with the transformer under flow-match Euler, drop it, decode with the
// VAE. Each component's weights live only for its stage, so the peak is the largest component
// plus activations, not their sum.
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

namespace xdit::flux2 {

enum class Variant {
  KleinDistilled,  // Flux2KleinPipeline, is_distilled: 4 steps, no guidance
  KleinBase,       // Flux2KleinPipeline: true CFG against a negative prompt
  Dev,             // Flux2Pipeline: guidance embedded in the transformer
};

std::string_view variant_name(Variant variant);

// One pipeline call's settings: the command line over the variant's defaults. flow_shift, when
// set, is a static shift instead of FLUX.2's empirical mu.
struct Settings : ImageSettings {
  double guidance_scale = 1.0;
  bool true_cfg = false;  // klein base with guidance_scale > 1: a second pass on the negative prompt
  std::vector<int> text_encoder_out_layers;
};

class Pipeline {
 public:
  // Reads model_index.json and the component configs; loads no weights.
  static Pipeline open(const std::string& folder);

  Variant variant() const { return variant_; }
  // Height and width must be multiples of this: the VAE's scale factor times the 2x2 patchify.
  int64_t latent_multiple() const { return 2 * vae_scale_factor_; }
  const DiffusersRepo& repo() const { return repo_; }

  // The variant's defaults under the command line's values. Warns, as diffusers does, when a
  // distilled model is given a guidance scale; refuses a negative prompt where no CFG runs.
  Settings settings_for(const RunOptions& options, Progress& progress) const;

  using Result = ImageBatch;  // images [B, H, W, 3] F32 in [0, 1] and the call's timings
  // One call for a batch of prompts. `negative_prompts` is empty (diffusers' "") or one per prompt.
  Result generate(const std::vector<std::string>& prompts, const std::vector<std::string>& negative_prompts,
                  const Settings& settings, Progress& progress) const;

 private:
  Pipeline(DiffusersRepo repo, Variant variant, int64_t vae_scale_factor, int64_t default_size,
           int64_t default_max_sequence_length);

  DiffusersRepo repo_;
  Variant variant_;
  int64_t vae_scale_factor_;
  int64_t default_size_;                 // height and width when the command line gives none
  int64_t default_max_sequence_length_;  // prompt tokens when the command line gives none
};

}  // namespace xdit::flux2
