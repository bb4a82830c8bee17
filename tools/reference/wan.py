"""Wan 2.2 (WanPipeline: WanTransformer3DModel, AutoencoderKLWan, UMT5EncoderModel, T5 tokenizer,
UniPCMultistepScheduler): the TI2V-5B form (one transformer, z48 VAE with 2x2 patching,
expand_timesteps) and the A14B form (two experts switched at boundary_ratio, z16 VAE)."""
import torch
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
from transformers import UMT5Config, UMT5EncoderModel

import common
import text

HEIGHT, WIDTH, FRAMES = 32, 48, 5
STEPS = 4  # UniPC is order 2 with a corrector: 4 steps take every branch, including lower_order_final
SEED = 42
TEXT_WIDTH = 32
MAX_LENGTH = 512
SCHEDULER_STEPS = [1, 2, 4, 40, 50]


def scheduler(flow_shift):
    return UniPCMultistepScheduler(
        num_train_timesteps=1000, prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=flow_shift,
        solver_order=2, solver_type="bh2", predict_x0=True, lower_order_final=True, final_sigmas_type="zero",
        timestep_spacing="linspace")


def text_encoder(vocab_size, seed):
    config = UMT5Config(
        vocab_size=vocab_size, d_model=TEXT_WIDTH, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
        relative_attention_num_buckets=32, relative_attention_max_distance=128, feed_forward_proj="gated-gelu",
        tie_word_embeddings=False, is_encoder_decoder=False, use_cache=False)
    return common.randomize_(UMT5EncoderModel(config), seed)


def transformer(channels, seed):
    model = WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=16, in_channels=channels,
        out_channels=channels, text_dim=TEXT_WIDTH, freq_dim=256, ffn_dim=64, num_layers=2, cross_attn_norm=True,
        qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
    return common.randomize_(model, seed)


def vae_ti2v(seed):
    """The Wan 2.2 VAE layout: z48, residual blocks, 2x2 pixel patching; two levels that both
    halve time (4x, as the 1 + 4k frame chunking of the VAE needs) and space (x2 patch = 8x).
    The 48 per-channel latent statistics are seeded random values."""
    generator = torch.Generator("cpu").manual_seed(seed + 1)
    model = AutoencoderKLWan(
        base_dim=8, decoder_base_dim=8, z_dim=48, dim_mult=[1, 1, 1], num_res_blocks=1, attn_scales=[],
        temperal_downsample=[True, True], is_residual=True, in_channels=12, out_channels=12, patch_size=2,
        scale_factor_temporal=4, scale_factor_spatial=8,
        latents_mean=[round(v, 4) for v in (0.5 * torch.randn(48, generator=generator)).tolist()],
        latents_std=[round(v, 4) for v in (1.0 + torch.rand(48, generator=generator)).tolist()])
    return common.randomize_(model, seed)


def vae_a14b(seed):
    """The Wan 2.1 VAE layout: z16, no patching, 4x in time and space (8x in the real one)."""
    model = AutoencoderKLWan(
        base_dim=8, z_dim=16, dim_mult=[1, 1, 1], num_res_blocks=1, attn_scales=[], temperal_downsample=[True, True],
        scale_factor_temporal=4, scale_factor_spatial=4)
    return common.randomize_(model, seed)


def add_text(ref, pipeline):
    tokens = {}
    for key in text.PROMPT_ORDER:
        prompt = text.PROMPTS[key]
        cleaned = pipeline_prompt_clean(prompt)
        inputs = pipeline.tokenizer([cleaned], padding="max_length", max_length=MAX_LENGTH, truncation=True,
                                    add_special_tokens=True, return_attention_mask=True, return_tensors="pt")
        valid = common.add_tokens(ref, key, inputs)
        tokens[key] = {"prompt": prompt, "cleaned": cleaned, "valid_tokens": valid,
                       "untruncated_tokens": len(pipeline.tokenizer(cleaned).input_ids)}
        with torch.no_grad():
            embeds, _ = pipeline.encode_prompt(prompt=prompt, do_classifier_free_guidance=False,
                                               max_sequence_length=MAX_LENGTH, device="cpu")
        ref.add(f"text.{key}.prompt_embeds", embeds,
                "UMT5 last_hidden_state with the padding positions set to zero: [1, 512, d_model]")
    text.long_prompt_check(tokens["long"]["untruncated_tokens"], MAX_LENGTH, ref.family)
    return tokens


def pipeline_prompt_clean(prompt):
    from diffusers.pipelines.wan.pipeline_wan import prompt_clean

    return prompt_clean(prompt)


def add_transformer_forward(ref, model, prefix, channels, expand_timesteps):
    """One forward on a [1, C, 2, 4, 6] latent (2 frames of 2x3 patches) with 20 text tokens."""
    generator = torch.Generator("cpu").manual_seed(7)
    latents = torch.randn(1, channels, 2, 4, 6, generator=generator)
    context = torch.randn(1, 20, TEXT_WIDTH, generator=generator)
    if expand_timesteps:
        # TI2V: one timestep per patch token, as the pipeline builds it for text-to-video.
        timestep = torch.full((1, 2 * 2 * 3), 750.0)
    else:
        timestep = torch.tensor([750.0])
    with torch.no_grad():
        out = model(hidden_states=latents, timestep=timestep, encoder_hidden_states=context, return_dict=False)[0]
    ref.add(f"{prefix}.hidden_states", latents, "latents [B, C, F, H, W]")
    ref.add(f"{prefix}.encoder_hidden_states", context, "text features")
    ref.add(f"{prefix}.timestep", timestep, "timestep as the pipeline passes it (scheduler timestep, 0..1000)"
            + (", one per patch token" if expand_timesteps else ""))
    ref.add(f"{prefix}.output", out, "transformer output [B, C, F, H, W]")


def add_scheduler(ref, config):
    cases = []
    for steps in SCHEDULER_STEPS:
        sched = UniPCMultistepScheduler.from_config(config)
        sched.set_timesteps(steps, device="cpu")
        name = f"scheduler.steps{steps}"
        ref.add(f"{name}.sigmas", sched.sigmas, "scheduler.sigmas after set_timesteps(N) (N + 1, ends in 0)")
        ref.add(f"{name}.timesteps", sched.timesteps, "scheduler.timesteps (int64)")
        cases.append({"name": name, "steps": steps})
    return cases


def add_vae(ref, model, latent_channels, pixel_scale):
    """Decode of a 2-latent-frame latent (5 frames out) and encode of 5 frames."""
    generator = torch.Generator("cpu").manual_seed(11)
    latent = torch.randn(1, latent_channels, 2, 2, 3, generator=generator)
    video = torch.rand(1, 3, 5, 2 * pixel_scale, 3 * pixel_scale, generator=generator) * 2 - 1
    with torch.no_grad():
        decoded = model.decode(latent, return_dict=False)[0]
        dist = model.encode(video).latent_dist
    ref.add("vae.decode.latent", latent, "input of vae.decode (raw latent: latents_mean/std not applied)")
    ref.add("vae.decode.image", decoded, "vae.decode output [B, 3, F, H, W], clamped to [-1, 1] by the VAE")
    ref.add("vae.encode.image", video, "input of vae.encode: 5 frames in [-1, 1]")
    ref.add("vae.encode.mean", dist.mean, "latent_dist.mean")
    ref.add("vae.encode.logvar", dist.logvar, "latent_dist.logvar (clamped to [-30, 20])")


def build(family, pipeline, channels, pixel_scale, **guidance):
    folder = common.save_pipeline(pipeline, family)
    pipeline = WanPipeline.from_pretrained(folder, dtype=torch.float32)
    ref = common.Reference(family, "WanPipeline")
    tokens = add_text(ref, pipeline)
    expand = pipeline.config.expand_timesteps
    add_transformer_forward(ref, pipeline.transformer, "transformer", channels, expand)
    if pipeline.transformer_2 is not None:
        add_transformer_forward(ref, pipeline.transformer_2, "transformer_2", channels, expand)
    ref.set("scheduler_cases", add_scheduler(ref, pipeline.scheduler.config))
    add_vae(ref, pipeline.vae, channels, pixel_scale)
    call = {"prompt": text.PROMPTS["ascii"], "height": HEIGHT, "width": WIDTH, "num_frames": FRAMES,
            "num_inference_steps": STEPS, **guidance}
    calls = {"pipeline": common.run_pipeline(ref, pipeline, "pipeline", True, SEED, **call)}
    ref.set("tokens", tokens)
    ref.set("text_encoder", {"max_sequence_length": MAX_LENGTH,
                             "prompt_clean": "html.unescape twice, whitespace collapsed, stripped (ftfy absent)"})
    ref.set("calls", calls)
    ref.set("components", common.component_summary(folder, pipeline))
    ref.write()


def build_ti2v():
    tokenizer = text.t5_tokenizer()
    pipeline = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder(len(tokenizer), seed=1),
                           vae=vae_ti2v(seed=2), scheduler=scheduler(flow_shift=5.0),
                           transformer=transformer(48, seed=3), expand_timesteps=True)
    build("wan22-ti2v", pipeline, 48, 8, guidance_scale=5.0)


def build_a14b():
    tokenizer = text.t5_tokenizer()
    pipeline = WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder(len(tokenizer), seed=1),
                           vae=vae_a14b(seed=2), scheduler=scheduler(flow_shift=3.0),
                           transformer=transformer(16, seed=3), transformer_2=transformer(16, seed=4),
                           boundary_ratio=0.875)
    # guidance 4.0 for the high-noise expert and 3.0 for the low-noise one, as T2V-A14B.
    build("wan22-a14b", pipeline, 16, 4, guidance_scale=4.0, guidance_scale_2=3.0)
