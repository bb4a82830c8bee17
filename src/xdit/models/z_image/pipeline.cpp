#include "xdit/models/z_image/pipeline.h"

#include <cmath>
#include <cstddef>
#include <memory>
#include <utility>

#include "xdit/core/allocator.h"
#include "xdit/core/error.h"
#include "xdit/models/vae/autoencoder_kl.h"
#include "xdit/models/z_image/text_conditioning.h"
#include "xdit/models/z_image/transformer.h"
#include "xdit/ops/ops.h"
#include "xdit/runtime/generation.h"
#include "xdit/runtime/pipeline_registry.h"
#include "xdit/sched/flow_match.h"

namespace xdit::z_image {
namespace {

constexpr const char* kPipelineClass = "ZImagePipeline";

// torch.linalg.vector_norm of the whole tensor, as an f32 scalar.
float l2_norm(const Tensor& x) {
  return static_cast<float>(std::sqrt(ops::sum(ops::mul(x, x)).to_doubles().front()));
}

// One item's [C, 1, h, w] transformer output as [1, C, h, w] F32.
Tensor as_f32_batch_item(const Tensor& out) {
  return out.to(DType::F32).reshape({1, out.size(0), out.size(2), out.size(3)});
}

// diffusers' CFG for item j of `batch`: the outputs hold the conditional items, then the
// unconditional ones. pred = pos + g (pos - neg) in f32, its norm capped at cfg_normalization
// times the conditional's.
Tensor guided_prediction(const std::vector<Tensor>& out, size_t j, size_t batch, const Settings& s) {
  const Tensor pos = as_f32_batch_item(out[j]);
  const Tensor neg = as_f32_batch_item(out[batch + j]);
  Tensor pred = ops::add(pos, ops::scale(ops::sub(pos, neg), static_cast<float>(s.guidance_scale)));
  if (s.cfg_normalization > 0.0) {
    const float max_norm = l2_norm(pos) * static_cast<float>(s.cfg_normalization);
    const float norm = l2_norm(pred);
    if (norm > max_norm) pred = ops::scale(pred, max_norm / norm);
  }
  return pred;
}

}  // namespace

Pipeline::Pipeline(DiffusersRepo repo, int64_t vae_scale_factor)
    : repo_(std::move(repo)), vae_scale_factor_(vae_scale_factor) {}

Pipeline Pipeline::open(const std::string& folder) {
  DiffusersRepo repo = DiffusersRepo::open(folder);
  if (repo.pipeline_class() != kPipelineClass) {
    fail(repo.folder(), "/model_index.json: _class_name ", repo.pipeline_class(), " is not a Z-Image pipeline");
  }
  for (const char* component : {"text_encoder", "tokenizer", "transformer", "vae", "scheduler"}) {
    repo.component(component);  // throws naming the component the folder lacks
  }
  const int64_t vae_scale_factor =
      vae::AutoencoderKLConfig::from_json(repo.component_config("vae")).spatial_scale();
  return Pipeline(std::move(repo), vae_scale_factor);
}

Settings Pipeline::settings_for(const RunOptions& options) const {
  Settings s;
  static_cast<ImageSettings&>(s) = image_settings(options, 1024, 8, /*default_max_sequence_length=*/512);
  s.guidance_scale = options.guidance_scale.value_or(0.0);
  const char* no_cfg = " has no effect: Z-Image runs no CFG at --guidance_scale <= 0";
  if (!s.cfg()) {
    if (!options.negative_prompts.empty()) throw UsageError(concat_message("--negative_prompt", no_cfg));
    if (options.cfg_normalization) throw UsageError(concat_message("--cfg_normalization", no_cfg));
    if (options.cfg_truncation) throw UsageError(concat_message("--cfg_truncation", no_cfg));
  }
  s.cfg_normalization = options.cfg_normalization.value_or(0.0);
  s.cfg_truncation = options.cfg_truncation.value_or(1.0);
  return s;
}

Pipeline::Result Pipeline::generate(const std::vector<std::string>& prompts,
                                    const std::vector<std::string>& negative_prompts, const Settings& s,
                                    Progress& progress) const {
  XDIT_CHECK(!prompts.empty(), "Z-Image: no prompt");
  XDIT_CHECK(negative_prompts.empty() || negative_prompts.size() == prompts.size(), "Z-Image: ",
             negative_prompts.size(), " negative prompts for ", prompts.size(), " prompts");
  XDIT_CHECK(negative_prompts.empty() || s.cfg(), "Z-Image: negative prompts need guidance_scale > 0, got ",
             s.guidance_scale);
  check_image_size(s, latent_multiple(), repo_.folder());
  XDIT_CHECK(s.num_inference_steps >= 1, "Z-Image: num_inference_steps must be >= 1, got ", s.num_inference_steps);
  Result result;
  CallTimings& timings = result.timings;
  const StopWatch call_watch;
  const size_t batch = prompts.size();

  // 1. Text: the encoder lives only for this block. Caption features keep only valid tokens.
  std::vector<Tensor> positive, negative;
  {
    progress.stage("text encoder");
    StopWatch watch;
    const TextConditioning text =
        TextConditioning::load(repo_, {s.dtype, s.fp8_text_encoder, s.max_sequence_length});
    timings.load_s += watch.seconds();
    watch = StopWatch();
    positive = text.encode(prompts);
    if (s.cfg()) negative = text.encode(negative_prompts.empty() ? std::vector<std::string>(batch) : negative_prompts);
    timings.text_encode_s = watch.seconds();
    timings.peak_rss_after_text_encode = peak_rss_bytes();
  }
  CachingAllocator::instance().empty_cache();  // the encoder's activations, before the transformer loads

  // 2. Denoising. The latents stay [B, C, h, w] F32, as diffusers keeps them; the transformer
  // sees them in the compute dtype.
  const int64_t latent_height = s.height / vae_scale_factor_, latent_width = s.width / vae_scale_factor_;
  Tensor latents;
  {
    progress.stage("transformer");
    StopWatch watch;
    const std::unique_ptr<TensorSource> weights = repo_.component_weights("transformer");
    const Transformer transformer =
        Transformer::load(*weights, repo_.component_config("transformer"), {s.dtype, s.fp8_transformer});
    timings.load_s += watch.seconds();

    const std::unique_ptr<NoiseGenerator> generator = make_noise_generator(s.rng, s.seed);
    latents = generator->randn(
        {static_cast<int64_t>(batch), transformer.config().in_channels, latent_height, latent_width}, DType::F32);

    sched::FlowMatchConfig scheduler_config = sched::FlowMatchConfig::from_json(repo_.component_config("scheduler"));
    if (s.flow_shift) scheduler_config.shift = *s.flow_shift;
    // diffusers passes mu; the scheduler uses it only with dynamic shifting, which Z-Image turns off.
    const double mu = sched::calculate_shift((latent_height / 2) * (latent_width / 2), scheduler_config);
    sched::FlowMatchEulerScheduler scheduler(scheduler_config);
    scheduler.set_timesteps(s.num_inference_steps, sched::linspace_sigmas_f32(s.num_inference_steps), mu);

    // The CFG batch: the conditional items, then the unconditional ones.
    std::vector<Tensor> captions = positive;
    captions.insert(captions.end(), negative.begin(), negative.end());

    watch = StopWatch();
    const int64_t steps = scheduler.num_steps();
    for (int64_t i = 0; i < steps; ++i) {
      const StopWatch step_watch;
      const float t = scheduler.timesteps()[static_cast<size_t>(i)];
      const float t_norm = (1000.0f - t) / 1000.0f;  // in f32, as the pipeline computes it
      const bool truncated = s.cfg_truncation <= 1.0 && static_cast<double>(t_norm) > s.cfg_truncation;
      const bool apply_cfg = s.cfg() && !truncated;

      const size_t items = apply_cfg ? 2 * batch : batch;
      const Tensor model_latents = latents.to(s.dtype);
      std::vector<Tensor> x;
      x.reserve(items);
      for (size_t k = 0; k < items; ++k)
        x.push_back(model_latents.select(0, static_cast<int64_t>(k % batch)).unsqueeze(1));
      const std::vector<Tensor> caption_input(captions.begin(), captions.begin() + static_cast<std::ptrdiff_t>(items));
      const Tensor timestep = Tensor::full({static_cast<int64_t>(items)}, t_norm, DType::F32);
      const std::vector<Tensor> out = transformer.forward(x, timestep, caption_input);

      std::vector<Tensor> predictions;
      predictions.reserve(batch);
      for (size_t j = 0; j < batch; ++j)
        predictions.push_back(apply_cfg ? guided_prediction(out, j, batch, s) : as_f32_batch_item(out[j]));
      // The transformer predicts the negated flow.
      const Tensor noise_pred = ops::scale(ops::concat(predictions, 0), -1.0f);
      latents = scheduler.step(noise_pred, latents, i);
      timings.step_s.push_back(step_watch.seconds());
      progress.step(i + 1, steps);
    }
    timings.denoise_s = watch.seconds();
    timings.peak_rss_after_denoise = peak_rss_bytes();
  }
  positive.clear();  // the caption features' blocks, so that empty_cache returns them
  negative.clear();
  CachingAllocator::instance().empty_cache();

  // 3. VAE decode of latents / scaling_factor + shift_factor, in the VAE's dtype.
  {
    progress.stage("vae decode");
    StopWatch watch;
    const std::unique_ptr<TensorSource> weights = repo_.component_weights("vae");
    const vae::AutoencoderKL vae = vae::AutoencoderKL::load(*weights, repo_.component_config("vae"), s.dtype);
    timings.load_s += watch.seconds();
    watch = StopWatch();
    const vae::AutoencoderKLConfig& c = vae.config();
    const Tensor scaling = Tensor::full({1}, static_cast<float>(c.scaling_factor), DType::F32);
    const Tensor shift = Tensor::full({1}, static_cast<float>(c.shift_factor), DType::F32);
    const Tensor raw = ops::add(ops::div(latents.to(s.dtype), scaling), shift);
    result.images = vae::to_unit_image(vae.decode(raw));
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
  const Settings settings = pipeline.settings_for(options);
  run_image_generation(
      options, image_metadata(options, "Z-Image", settings, settings.guidance_scale),
      [&](const std::vector<std::string>& prompts, const std::vector<std::string>& negatives) {
        return pipeline.generate(prompts, negatives, settings, progress);
      },
      progress);
}

const bool kRegistered = [] {
  register_pipeline({kPipelineClass, 16, run,
                     {"--guidance_scale", "--negative_prompt", "--flow_shift", "--cfg_normalization",
                      "--cfg_truncation"}});
  return true;
}();

}  // namespace
}  // namespace xdit::z_image
