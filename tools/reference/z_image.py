"""Z-Image (ZImagePipeline, ZImageTransformer2DModel, Qwen3Model, FLUX.1-style AutoencoderKL)."""
import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
from diffusers.pipelines.z_image.pipeline_z_image import calculate_shift, get_default_z_image_sigmas, retrieve_timesteps
from transformers import Qwen3Config, Qwen3Model

import common
import text

FAMILY = "z-image"
HEIGHT, WIDTH = 32, 48
STEPS = 3
SEED = 42
SCHEDULER_STEPS = [1, 2, 4, 8, 9, 50]
SCHEDULER_SIZES = [(32, 48), (64, 64), (1024, 1024)]


def scheduler():
    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)


def vae(seed):
    """The FLUX.1 VAE layout: 16 latent channels, scaling 0.3611, shift 0.1159, no quant convs."""
    model = AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(16, 16), layers_per_block=1, norm_num_groups=4, latent_channels=16, sample_size=64,
        scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False)
    return common.randomize_(model, seed)


def transformer(cap_feat_dim, seed):
    # Most of its bytes are the time embedder, fixed at 256 -> 1024 -> min(dim, 256) by the class.
    model = ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32, n_layers=2, n_refiner_layers=1,
        n_heads=2, n_kv_heads=2, norm_eps=1e-5, qk_norm=True, cap_feat_dim=cap_feat_dim, rope_theta=256.0,
        t_scale=1000.0, axes_dims=[4, 6, 6], axes_lens=[1024, 512, 512])
    return common.randomize_(model, seed)


def text_encoder(vocab_size, seed):
    # The pipeline reads hidden_states[-2]: with 3 layers that is the raw output of the second.
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=2048, rms_norm_eps=1e-6,
        tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = Qwen3Model(config)
    return common.randomize_(model, seed)


def add_transformer_forward(ref, model, cap_feat_dim):
    """One forward on a [16, 1, 12, 16] latent (6x8 patches) with 13 caption tokens (padded to 32
    inside the model)."""
    generator = torch.Generator("cpu").manual_seed(7)
    latent = torch.randn(16, 1, 12, 16, generator=generator)
    features = torch.randn(13, cap_feat_dim, generator=generator)
    timestep = torch.tensor([0.25])
    with torch.no_grad():
        out = model([latent], timestep, [features], return_dict=False)[0][0]
    ref.add("transformer.x", latent, "x[0]: one latent [C, F=1, H, W]")
    ref.add("transformer.cap_feats", features, "cap_feats[0]: caption features [L, cap_feat_dim]")
    ref.add("transformer.t", timestep, "t as the pipeline passes it: (1000 - timestep) / 1000 = 1 - sigma")
    ref.add("transformer.output", out, "output[0] [C, F, H, W]; the pipeline negates it before scheduler.step")


def add_scheduler(ref, pipeline):
    cases = []
    config = pipeline.scheduler.config
    for steps in SCHEDULER_STEPS:
        for height, width in SCHEDULER_SIZES:
            # As the pipeline computes it; mu is ignored while use_dynamic_shifting is off.
            latent_h, latent_w = 2 * (height // (pipeline.vae_scale_factor * 2)), 2 * (width // (pipeline.vae_scale_factor * 2))
            seq_len = (latent_h // 2) * (latent_w // 2)
            mu = calculate_shift(seq_len, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                                 config.get("base_shift", 0.5), config.get("max_shift", 1.15))
            sched = FlowMatchEulerDiscreteScheduler.from_config(config)
            timesteps, _ = retrieve_timesteps(sched, steps, "cpu", sigmas=get_default_z_image_sigmas(steps), mu=mu)
            name = f"scheduler.steps{steps}.{height}x{width}"
            ref.add(f"{name}.sigmas", sched.sigmas, "scheduler.sigmas after set_timesteps (N + 1, ends in 0)")
            ref.add(f"{name}.timesteps", timesteps, "scheduler.timesteps")
            cases.append({"name": name, "steps": steps, "height": height, "width": width, "image_seq_len": seq_len})
    return cases


def build():
    tokenizer = text.qwen_tokenizer(text.QWEN3_CHAT_TEMPLATE, eos_token="<|im_end|>")
    encoder = text_encoder(len(tokenizer), seed=1)
    cap_dim = encoder.config.hidden_size
    pipeline = ZImagePipeline(scheduler=scheduler(), vae=vae(seed=2), text_encoder=encoder, tokenizer=tokenizer,
                              transformer=transformer(cap_dim, seed=3))
    folder = common.save_pipeline(pipeline, FAMILY)
    pipeline = ZImagePipeline.from_pretrained(folder, dtype=torch.float32)

    ref = common.Reference(FAMILY, "ZImagePipeline")
    max_length = 512
    tokens = {}
    for key in text.PROMPT_ORDER:
        prompt = text.PROMPTS[key]
        formatted = pipeline.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=True)
        valid = common.add_tokens(ref, key, pipeline.tokenizer(
            [formatted], padding="max_length", max_length=max_length, truncation=True, return_tensors="pt"))
        tokens[key] = {"prompt": prompt, "formatted": formatted, "valid_tokens": valid,
                       "untruncated_tokens": len(pipeline.tokenizer(formatted).input_ids)}
        with torch.no_grad():
            embeds, _ = pipeline.encode_prompt(prompt=prompt, device="cpu", do_classifier_free_guidance=False,
                                               max_sequence_length=max_length)
        ref.add(f"text.{key}.prompt_embeds", embeds[0],
                "hidden_states[-2] of the valid (unmasked) tokens only: [valid_tokens, hidden]")
    text.long_prompt_check(tokens["long"]["untruncated_tokens"], max_length, FAMILY)

    add_transformer_forward(ref, pipeline.transformer, cap_dim)
    ref.set("scheduler_cases", add_scheduler(ref, pipeline))
    common.add_vae_2d(ref, pipeline.vae, 16, (6, 8), 2)
    call = {"prompt": text.PROMPTS["ascii"], "height": HEIGHT, "width": WIDTH, "num_inference_steps": STEPS}
    calls = {
        # Turbo: no guidance.
        "pipeline": common.run_pipeline(ref, pipeline, "pipeline", True, SEED, guidance_scale=0.0, **call),
        # Base: CFG against "" with the norm cap.
        "pipeline_cfg": common.run_pipeline(ref, pipeline, "pipeline_cfg", False, SEED, guidance_scale=4.0,
                                            cfg_normalization=True, **call),
    }
    ref.set("tokens", tokens)
    ref.set("text_encoder", {"hidden_states_index": -2, "max_sequence_length": max_length,
                             "chat_template_kwargs": {"add_generation_prompt": True, "enable_thinking": True}})
    ref.set("calls", calls)
    ref.set("components", common.component_summary(folder, pipeline))
    ref.write()
