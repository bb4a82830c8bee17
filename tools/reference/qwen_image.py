"""Qwen-Image (QwenImagePipeline: QwenImageTransformer2DModel, AutoencoderKLQwenImage,
Qwen2_5_VLForConditionalGeneration with a tiny vision tower, Qwen2Tokenizer)."""
import numpy as np
import torch
from diffusers import (AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline,
                       QwenImageTransformer2DModel)
from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift, retrieve_timesteps
from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

import common
import text

FAMILY = "qwen-image"
HEIGHT, WIDTH = 32, 48
STEPS = 3
SEED = 42
TEXT_WIDTH = 32
# One step is left out: shift_terminal stretches by 0/0 there, and diffusers gives NaN sigmas.
SCHEDULER_STEPS = [2, 4, 30, 50]
SCHEDULER_SEQ_LENS = [96, 256, 4096, 16384]


def scheduler():
    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=0.9,
        base_image_seq_len=256, max_image_seq_len=8192, shift_terminal=0.02, time_shift_type="exponential")


def vae(seed):
    # One spatial downsampling level (8x in the real model); latents_mean/std keep the real values.
    model = AutoencoderKLQwenImage(base_dim=16, z_dim=16, dim_mult=[1, 1], num_res_blocks=1, attn_scales=[],
                                   temperal_downsample=[False])
    return common.randomize_(model, seed)


def transformer(seed):
    model = QwenImageTransformer2DModel(
        patch_size=2, in_channels=64, out_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=TEXT_WIDTH, guidance_embeds=False, axes_dims_rope=(4, 6, 6))
    return common.randomize_(model, seed)


def text_encoder(tokenizer, seed):
    ids = tokenizer.convert_tokens_to_ids
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": len(tokenizer), "hidden_size": TEXT_WIDTH, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6,
                                                       "mrope_section": [2, 3, 3]},
            "bos_token_id": ids("<|endoftext|>"), "eos_token_id": ids("<|im_end|>")},
        vision_config={
            "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 4,
            "temporal_patch_size": 2, "spatial_merge_size": 2, "window_size": 32, "out_hidden_size": TEXT_WIDTH,
            "fullatt_block_indexes": [0]},
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"))
    return common.randomize_(Qwen2_5_VLForConditionalGeneration(config), seed)


def add_transformer_forward(ref, model):
    """One forward on 6x8 packed latents with 20 text tokens, the last 5 of them masked out."""
    generator = torch.Generator("cpu").manual_seed(7)
    hidden = torch.randn(1, 48, 64, generator=generator)
    context = torch.randn(1, 20, TEXT_WIDTH, generator=generator)
    mask = torch.ones(1, 20, dtype=torch.long)
    mask[:, 15:] = 0
    timestep = torch.tensor([0.75])
    img_shapes = [[(1, 6, 8)]]
    with torch.no_grad():
        out = model(hidden_states=hidden, encoder_hidden_states=context, encoder_hidden_states_mask=mask,
                    timestep=timestep, img_shapes=img_shapes, return_dict=False)[0]
    ref.add("transformer.hidden_states", hidden, "packed latents [B, H*W, 64] over a 6x8 grid (img_shapes)")
    ref.add("transformer.encoder_hidden_states", context, "text features")
    ref.add("transformer.encoder_hidden_states_mask", mask, "1 for real text tokens, 0 for padding")
    ref.add("transformer.timestep", timestep, "timestep as the pipeline passes it (t / 1000 = sigma)")
    ref.add("transformer.output", out, "transformer output [B, H*W, 64]")
    return {"img_shapes": [[list(s) for s in shapes] for shapes in img_shapes]}


def add_scheduler(ref, config):
    cases = []
    for steps in SCHEDULER_STEPS:
        for seq_len in SCHEDULER_SEQ_LENS:
            mu = calculate_shift(seq_len, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                                 config.get("base_shift", 0.5), config.get("max_shift", 1.15))
            sched = FlowMatchEulerDiscreteScheduler.from_config(config)
            timesteps, _ = retrieve_timesteps(sched, steps, "cpu", sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
            name = f"scheduler.steps{steps}.seq{seq_len}"
            ref.add(f"{name}.sigmas", sched.sigmas, "scheduler.sigmas after set_timesteps (N + 1, ends in 0)")
            ref.add(f"{name}.timesteps", timesteps, "scheduler.timesteps")
            cases.append({"name": name, "steps": steps, "image_seq_len": seq_len, "mu": mu})
    return cases


def add_vae(ref, model):
    """Decode and encode of one frame: the VAE is a causal 3D one, [B, C, F, H, W]."""
    generator = torch.Generator("cpu").manual_seed(11)
    latent = torch.randn(1, 16, 1, 6, 8, generator=generator)
    image = torch.rand(1, 3, 1, 12, 16, generator=generator) * 2 - 1
    with torch.no_grad():
        decoded = model.decode(latent, return_dict=False)[0]
        dist = model.encode(image).latent_dist
    ref.add("vae.decode.latent", latent, "input of vae.decode (raw latent: latents_mean/std not applied)")
    ref.add("vae.decode.image", decoded, "vae.decode output [B, 3, F, H, W], clamped to [-1, 1] by the VAE")
    ref.add("vae.encode.image", image, "input of vae.encode, in [-1, 1]")
    ref.add("vae.encode.mean", dist.mean, "latent_dist.mean")
    ref.add("vae.encode.logvar", dist.logvar, "latent_dist.logvar (clamped to [-30, 20])")


def build():
    tokenizer = text.qwen_tokenizer(text.QWEN2_5_VL_CHAT_TEMPLATE, eos_token="<|im_end|>")
    pipeline = QwenImagePipeline(scheduler=scheduler(), vae=vae(seed=2), text_encoder=text_encoder(tokenizer, seed=1),
                                 tokenizer=tokenizer, transformer=transformer(seed=3))
    folder = common.save_pipeline(pipeline, FAMILY)
    pipeline = QwenImagePipeline.from_pretrained(folder, dtype=torch.float32)

    ref = common.Reference(FAMILY, "QwenImagePipeline")
    drop = pipeline.prompt_template_encode_start_idx
    max_length = pipeline.tokenizer_max_length + drop
    tokens = {}
    for key in text.PROMPT_ORDER:
        prompt = text.PROMPTS[key]
        formatted = pipeline.prompt_template_encode.format(prompt)
        valid = common.add_tokens(ref, key, pipeline.tokenizer(
            [formatted], max_length=max_length, padding=True, truncation=True, return_tensors="pt"))
        tokens[key] = {"prompt": prompt, "formatted": formatted, "valid_tokens": valid,
                       "untruncated_tokens": len(pipeline.tokenizer(formatted).input_ids)}
        with torch.no_grad():
            embeds, mask = pipeline.encode_prompt(prompt=prompt, device="cpu")
        ref.add(f"text.{key}.prompt_embeds", embeds,
                f"hidden_states[-1] of the valid tokens with the first {drop} (template) tokens dropped")
        assert mask is None  # encode_prompt drops an all-ones mask: one prompt has no padding
    text.long_prompt_check(tokens["long"]["untruncated_tokens"], max_length, FAMILY)

    forward = add_transformer_forward(ref, pipeline.transformer)
    ref.set("scheduler_cases", add_scheduler(ref, pipeline.scheduler.config))
    add_vae(ref, pipeline.vae)
    call = {"prompt": text.PROMPTS["ascii"], "height": HEIGHT, "width": WIDTH, "num_inference_steps": STEPS}
    calls = {
        "pipeline": common.run_pipeline(ref, pipeline, "pipeline", True, SEED, true_cfg_scale=1.0, **call),
        # True CFG with the per-token rescale to the conditional norm.
        "pipeline_cfg": common.run_pipeline(ref, pipeline, "pipeline_cfg", False, SEED, true_cfg_scale=4.0,
                                            negative_prompt=" ", **call),
    }
    ref.set("tokens", tokens)
    ref.set("transformer_forward", forward)
    ref.set("text_encoder", {"hidden_states_index": -1, "drop_tokens": drop, "max_length": max_length,
                             "prompt_template": pipeline.prompt_template_encode,
                             "prompt_embeds_mask": "None: encode_prompt drops a mask that is all ones"})
    ref.set("calls", calls)
    ref.set("components", common.component_summary(folder, pipeline))
    ref.write()
