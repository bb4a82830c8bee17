#include "xdit/models/flux2/pipeline.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "xdit/core/allocator.h"
#include "xdit/core/error.h"
#include "xdit/models/flux2/latents.h"
#include "xdit/models/flux2/position_ids.h"
#include "xdit/models/flux2/text_conditioning.h"
#include "xdit/models/flux2/transformer.h"
#include "xdit/models/vae/autoencoder_kl.h"
#include "xdit/ops/ops.h"
#include "xdit/runtime/generation.h"
#include "xdit/runtime/pipeline_registry.h"
#include "xdit/sched/flow_match.h"
#include "xdit/text/tokenizer.h"

namespace xdit::flux2 {
namespace {

constexpr const char* kKleinPipeline = "Flux2KleinPipeline";
constexpr const char* kDevPipeline = "Flux2Pipeline";

// diffusers rounds the timestep to the latents' dtype before dividing by 1000 in that dtype.
Tensor timestep_as_pipeline_passes_it(float t, int64_t batch, DType dtype) {
  const float rounded = round_to_dtype(t, dtype);
  const float sigma = round_to_dtype(rounded / 1000.0f, dtype);
  return Tensor::from_floats(std::vector<float>(static_cast<size_t>(batch), sigma), {batch});
}

}  // namespace

std::string_view variant_name(Variant variant) {
  switch (variant) {
    case Variant::KleinDistilled:
      return "FLUX.2 klein (distilled)";
    case Variant::KleinBase:
      return "FLUX.2 klein (base)";
    case Variant::Dev:
      return "FLUX.2 dev";
  }
  return "FLUX.2";
}

Pipeline::Pipeline(DiffusersRepo repo, Variant variant, int64_t vae_scale_factor, int64_t default_size,
                   int64_t default_max_sequence_length)
    : repo_(std::move(repo)),
      variant_(variant),
      vae_scale_factor_(vae_scale_factor),
      default_size_(default_size),
      default_max_sequence_length_(default_max_sequence_length) {}

Pipeline Pipeline::open(const std::string& folder) {
  DiffusersRepo repo = DiffusersRepo::open(folder);
  const std::string& cls = repo.pipeline_class();
  Variant variant;
  if (cls == kKleinPipeline) {
    variant = repo.model_index().get_bool("is_distilled", false) ? Variant::KleinDistilled : Variant::KleinBase;
  } else if (cls == kDevPipeline) {
    variant = Variant::Dev;
  } else {
    fail(repo.folder(), "/model_index.json: _class_name ", cls, " is not a FLUX.2 pipeline");
  }
  for (const char* component : {"text_encoder", "tokenizer", "transformer", "vae", "scheduler"}) {
    repo.component(component);  // throws naming the component the folder lacks
  }
  const auto vae_config = vae::AutoencoderKLConfig::from_json(repo.component_config("vae"));
  const int64_t vae_scale_factor = vae_config.spatial_scale();
  // diffusers' default size is default_sample_size (128) x vae_scale_factor, which is the VAE's
  // sample_size (1024) for the published checkpoints. The VAE's sample_size comes first, so a
  // model trained at another size (the bundled demo model, 64) gets its own.
  const int64_t default_size = vae_config.sample_size.value_or(128 * vae_scale_factor);
  // diffusers pads prompts to max_sequence_length 512 whatever the tokenizer says. A tokenizer that
  // declares a shorter model_max_length (the demo model's 40: it was trained at that length) caps
  // the default, since the transformer attends to every padding token.
  const TokenizerConfig tokenizer = TokenizerConfig::load(repo.component_file("tokenizer", "tokenizer_config.json"));
  const int64_t default_max_sequence_length = std::min<int64_t>(512, tokenizer.model_max_length.value_or(512));
  return Pipeline(std::move(repo), variant, vae_scale_factor, default_size, default_max_sequence_length);
}

Settings Pipeline::settings_for(const RunOptions& options, Progress& progress) const {
  // diffusers' defaults: klein distilled 4 steps; klein base and dev 50 steps at guidance 4.
  Settings s;
  static_cast<ImageSettings&>(s) = image_settings(options, default_size_, variant_ == Variant::KleinDistilled ? 4 : 50,
                                                  default_max_sequence_length_);
  s.guidance_scale = options.guidance_scale.value_or(4.0);
  if (variant_ == Variant::KleinDistilled) {
    if (options.guidance_scale && *options.guidance_scale > 1.0) {
      progress.warning(concat_message("--guidance_scale ", *options.guidance_scale,
                                      " is ignored for step-wise distilled models"));
    }
  }
  s.true_cfg = variant_ == Variant::KleinBase && s.guidance_scale > 1.0;
  if (!options.negative_prompts.empty() && !s.true_cfg) {
    throw UsageError(concat_message("--negative_prompt: ", variant_name(variant_),
                                    variant_ == Variant::KleinBase ? " runs no CFG at --guidance_scale <= 1"
                                                                   : " has no negative prompt (it runs no CFG)"));
  }
  s.text_encoder_out_layers = options.text_encoder_out_layers;
  return s;
}

Pipeline::Result Pipeline::generate(const std::vector<std::string>& prompts,
                                    const std::vector<std::string>& negative_prompts, const Settings& s,
                                    Progress& progress) const {
  XDIT_CHECK(!prompts.empty(), "FLUX.2: no prompt");
  XDIT_CHECK(negative_prompts.empty() || negative_prompts.size() == prompts.size(), "FLUX.2: ",
             negative_prompts.size(), " negative prompts for ", prompts.size(), " prompts");
  const int64_t multiple = latent_multiple();
  check_image_size(s, multiple, repo_.folder());
  XDIT_CHECK(s.num_inference_steps >= 1, "FLUX.2: num_inference_steps must be >= 1, got ", s.num_inference_steps);
  Result result;
  CallTimings& timings = result.timings;
  const StopWatch call_watch;
  const int64_t batch = static_cast<int64_t>(prompts.size());

  // 1. Text: the encoder lives only for this block.
  TextConditioning::Encoded positive, negative;
  {
    progress.stage("text encoder");
    StopWatch watch;
    TextEncoderOptions text_options;
    text_options.compute_dtype = s.dtype;
    text_options.fp8_linear = s.fp8_text_encoder;
    text_options.max_sequence_length = s.max_sequence_length;
    text_options.taps = s.text_encoder_out_layers;
    const TextConditioning text = TextConditioning::load(repo_, text_options);
    timings.load_s += watch.seconds();
    watch = StopWatch();
    positive = text.encode(prompts);
    if (s.true_cfg) {
      negative = text.encode(negative_prompts.empty() ? std::vector<std::string>(prompts.size()) : negative_prompts);
    }
    timings.text_encode_s = watch.seconds();
    timings.peak_rss_after_text_encode = peak_rss_bytes();
  }
  CachingAllocator::instance().empty_cache();  // the encoder's activations, before the transformer loads

  // 2. Denoising.
  const LatentGrid grid{s.height / multiple, s.width / multiple};
  Tensor latents;
  {
    progress.stage("transformer");
    StopWatch watch;
    TransformerLoadOptions transformer_options;
    transformer_options.compute_dtype = s.dtype;
    transformer_options.fp8_linear = s.fp8_transformer;
    const std::unique_ptr<TensorSource> weights = repo_.component_weights("transformer");
    const Transformer transformer =
        Transformer::load(*weights, repo_.component_config("transformer"), transformer_options);
    timings.load_s += watch.seconds();

    const int64_t channels = transformer.config().in_channels;
    // prepare_latents: noise [B, in_channels, h, w] drawn in the prompt embeddings' dtype, then packed.
    const std::unique_ptr<NoiseGenerator> generator = make_noise_generator(s.rng, s.seed);
    latents = pack_latents(generator->randn({batch, channels, grid.height, grid.width}, s.dtype));
    const Tensor latent_ids = prepare_latent_ids(batch, grid);

    sched::FlowMatchConfig scheduler_config = sched::FlowMatchConfig::from_json(repo_.component_config("scheduler"));
    std::optional<double> mu;
    if (s.flow_shift) {
      scheduler_config.use_dynamic_shifting = false;
      scheduler_config.shift = *s.flow_shift;
    } else {
      mu = sched::compute_empirical_mu(grid.height * grid.width, s.num_inference_steps);
    }
    sched::FlowMatchEulerScheduler scheduler(scheduler_config);
    scheduler.set_timesteps(s.num_inference_steps, sched::linspace_sigmas(s.num_inference_steps), mu);

    const ops::RopeTable rope = transformer.rope(positive.text_ids, latent_ids);
    ops::RopeTable negative_rope;
    if (s.true_cfg) negative_rope = transformer.rope(negative.text_ids, latent_ids);
    Tensor guidance;
    if (variant_ == Variant::Dev) {
      guidance = Tensor::from_floats(std::vector<float>(static_cast<size_t>(batch), static_cast<float>(s.guidance_scale)),
                                     {batch});
    }

    watch = StopWatch();
    const int64_t steps = scheduler.num_steps();
    for (int64_t i = 0; i < steps; ++i) {
      const StopWatch step_watch;
      const Tensor timestep = timestep_as_pipeline_passes_it(scheduler.timesteps()[static_cast<size_t>(i)], batch,
                                                             s.dtype);
      Tensor noise_pred = transformer.forward(latents, positive.prompt_embeds, timestep, guidance, rope);
      if (s.true_cfg) {
        const Tensor negative_pred =
            transformer.forward(latents, negative.prompt_embeds, timestep, guidance, negative_rope);
        noise_pred = ops::add(negative_pred,
                              ops::scale(ops::sub(noise_pred, negative_pred), static_cast<float>(s.guidance_scale)));
      }
      latents = scheduler.step(noise_pred, latents, i);
      timings.step_s.push_back(step_watch.seconds());
      progress.step(i + 1, steps);
    }
    timings.denoise_s = watch.seconds();
    timings.peak_rss_after_denoise = peak_rss_bytes();
  }
  CachingAllocator::instance().empty_cache();

  // 3. VAE decode.
  {
    progress.stage("vae decode");
    StopWatch watch;
    const std::unique_ptr<TensorSource> weights = repo_.component_weights("vae");
    const vae::AutoencoderKL vae = vae::AutoencoderKL::load(*weights, repo_.component_config("vae"), s.dtype);
    timings.load_s += watch.seconds();
    watch = StopWatch();
    const Tensor latent_ids = prepare_latent_ids(batch, grid);
    Tensor latent = unpack_latents_with_ids(latents, latent_ids, grid.height, grid.width);
    latent = batch_norm_denormalize(latent, vae.batch_norm_mean(), vae.batch_norm_var(),
                                    vae.config().batch_norm_eps);
    result.images = vae::to_unit_image(vae.decode(unpatchify_latents(latent)));
    timings.vae_decode_s = watch.seconds();
    timings.peak_rss_after_vae_decode = peak_rss_bytes();
  }
  CachingAllocator::instance().empty_cache();
  timings.total_s = call_watch.seconds();
  return result;
}

namespace {

void run(const RunOptions& options) {
  Progress progress(options.quiet);
  const Pipeline pipeline = Pipeline::open(*options.model);
  const Settings settings = pipeline.settings_for(options, progress);
  // A distilled klein runs no guidance at all, whatever --guidance_scale says.
  const std::optional<double> guidance =
      pipeline.variant() == Variant::KleinDistilled ? std::nullopt : std::optional(settings.guidance_scale);
  run_image_generation(
      options, image_metadata(options, variant_name(pipeline.variant()), settings, guidance),
      [&](const std::vector<std::string>& prompts, const std::vector<std::string>& negatives) {
        return pipeline.generate(prompts, negatives, settings, progress);
      },
      progress);
}

const bool kRegistered = [] {
  const std::vector<std::string> flags = {"--guidance_scale", "--negative_prompt", "--flow_shift",
                                          "--text_encoder_out_layers"};
  register_pipeline({kKleinPipeline, 16, run, flags});
  register_pipeline({kDevPipeline, 16, run, {"--guidance_scale", "--flow_shift", "--text_encoder_out_layers"}});
  return true;
}();

}  // namespace
}  // namespace xdit::flux2
