"""FLUX.2 klein (Flux2KleinPipeline, Qwen3ForCausalLM) and dev (Flux2Pipeline, Mistral3)."""
import numpy as np
import torch
from diffusers import (AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Pipeline,
                       Flux2Transformer2DModel)
from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu, format_input, retrieve_timesteps
from transformers import Mistral3Config, Mistral3ForConditionalGeneration, Qwen3Config, Qwen3ForCausalLM

import common
import text

# The pipelines read hidden_states (9, 18, 27) (klein) and (10, 20, 30) (dev) by default; the tiny
# text encoders are one layer deeper than the last tap so that every tap is a raw layer output.
KLEIN_LAYERS = (9, 18, 27)
DEV_LAYERS = (10, 20, 30)
HEIGHT, WIDTH = 32, 48  # non-square, so a swapped H/W shows
STEPS = 3
SEED = 42
SCHEDULER_STEPS = [1, 2, 4, 28, 50]
# Image token counts: the tiny pipeline at 32x48 and 64x64, the real model at 1024² and 2048²
# (the last takes the linear branch of compute_empirical_mu).
SCHEDULER_SEQ_LENS = [96, 256, 4096, 16384]


def scheduler():
    return FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
        base_image_seq_len=256, max_image_seq_len=4096, time_shift_type="exponential")


def vae(seed):
    model = AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(16, 16), layers_per_block=1, norm_num_groups=4, latent_channels=32, sample_size=64)
    common.randomize_(model, seed)
    # The latent BatchNorm statistics are buffers; give them non-trivial values too.
    generator = torch.Generator("cpu").manual_seed(seed + 1)
    model.bn.running_mean.copy_(0.2 * torch.randn(model.bn.running_mean.shape, generator=generator))
    model.bn.running_var.copy_(0.5 + torch.rand(model.bn.running_var.shape, generator=generator))
    return model


def transformer(joint_attention_dim, guidance_embeds, seed):
    model = Flux2Transformer2DModel(
        patch_size=1, in_channels=128, num_layers=2, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=joint_attention_dim, timestep_guidance_channels=256,
        mlp_ratio=3.0, axes_dims_rope=(4, 4, 4, 4), rope_theta=2000, guidance_embeds=guidance_embeds)
    return common.randomize_(model, seed)


def qwen3_text_encoder(vocab_size, seed):
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=KLEIN_LAYERS[-1] + 1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=2048,
        rms_norm_eps=1e-6, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    return common.randomize_(Qwen3ForCausalLM(config), seed)


def mistral3_text_encoder(tokenizer, seed):
    """Mistral3ForConditionalGeneration: a 31-layer Mistral text model and a one-layer Pixtral
    vision tower with its projector (unused by text-to-image, but part of the class)."""
    config = Mistral3Config(
        text_config={
            "model_type": "mistral", "vocab_size": len(tokenizer), "hidden_size": 32, "intermediate_size": 32,
            "num_hidden_layers": DEV_LAYERS[-1] + 1, "num_attention_heads": 2, "num_key_value_heads": 1,
            "head_dim": 16, "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "sliding_window": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e9},
            "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id},
        vision_config={
            "model_type": "pixtral", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "head_dim": 16, "patch_size": 4, "image_size": 64, "num_channels": 3},
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"), spatial_merge_size=2, vision_feature_layer=-1,
        multimodal_projector_bias=False, projector_hidden_act="gelu", tie_word_embeddings=False)
    return common.randomize_(Mistral3ForConditionalGeneration(config), seed)


def add_transformer_forward(ref, model, joint_attention_dim, guidance=None):
    """One forward on a 6x8 latent grid with 20 text tokens of random features."""
    generator = torch.Generator("cpu").manual_seed(7)
    latents = torch.randn(1, 128, 6, 8, generator=generator)
    features = torch.randn(1, 20, joint_attention_dim, generator=generator)
    img_ids = Flux2KleinPipeline._prepare_latent_ids(latents)
    txt_ids = Flux2KleinPipeline._prepare_text_ids(features)
    hidden = Flux2KleinPipeline._pack_latents(latents)
    timestep = torch.tensor([0.75])
    kwargs = {} if guidance is None else {"guidance": torch.tensor([guidance])}
    with torch.no_grad():
        out = model(hidden_states=hidden, encoder_hidden_states=features, timestep=timestep, img_ids=img_ids,
                    txt_ids=txt_ids, return_dict=False, **kwargs)[0]
    ref.add("transformer.hidden_states", hidden, "packed latents [B, H*W, 128], row-major over the 6x8 grid")
    ref.add("transformer.encoder_hidden_states", features, "text features")
    ref.add("transformer.timestep", timestep, "timestep as the pipeline passes it (t / 1000 = sigma)")
    ref.add("transformer.img_ids", img_ids, "image position ids (t, h, w, l)")
    ref.add("transformer.txt_ids", txt_ids, "text position ids (t, h, w, l)")
    ref.add("transformer.output", out, "transformer output")
    if guidance is not None:
        ref.add("transformer.guidance", kwargs["guidance"], "guidance as the pipeline passes it")


def add_scheduler(ref, config):
    cases = []
    for steps in SCHEDULER_STEPS:
        for seq_len in SCHEDULER_SEQ_LENS:
            mu = compute_empirical_mu(image_seq_len=seq_len, num_steps=steps)
            sched = FlowMatchEulerDiscreteScheduler.from_config(config)
            sigmas = np.linspace(1.0, 1 / steps, steps)
            timesteps, _ = retrieve_timesteps(sched, steps, "cpu", sigmas=sigmas, mu=mu)
            name = f"scheduler.steps{steps}.seq{seq_len}"
            ref.add(f"{name}.sigmas", sched.sigmas, "scheduler.sigmas after set_timesteps (N + 1, ends in 0)")
            ref.add(f"{name}.timesteps", timesteps, "scheduler.timesteps")
            cases.append({"name": name, "steps": steps, "image_seq_len": seq_len, "mu": mu})
    return cases


def build_klein():
    family = "flux2-klein"
    tokenizer = text.qwen_tokenizer(text.QWEN3_CHAT_TEMPLATE, eos_token="<|im_end|>")
    text_encoder = qwen3_text_encoder(len(tokenizer), seed=1)
    joint_dim = 3 * text_encoder.config.hidden_size
    pipeline = Flux2KleinPipeline(scheduler=scheduler(), vae=vae(seed=2), text_encoder=text_encoder,
                                  tokenizer=tokenizer, transformer=transformer(joint_dim, False, seed=3),
                                  is_distilled=True)
    folder = common.save_pipeline(pipeline, family)
    pipeline = Flux2KleinPipeline.from_pretrained(folder, dtype=torch.float32)

    ref = common.Reference(family, "Flux2KleinPipeline")
    max_length = 512
    tokens = {}
    for key in text.PROMPT_ORDER:
        prompt = text.PROMPTS[key]
        formatted = pipeline.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True, enable_thinking=False)
        valid = common.add_tokens(ref, key, pipeline.tokenizer(
            formatted, return_tensors="pt", padding="max_length", truncation=True, max_length=max_length))
        tokens[key] = {"prompt": prompt, "formatted": formatted, "valid_tokens": valid,
                       "untruncated_tokens": len(pipeline.tokenizer(formatted).input_ids)}
        with torch.no_grad():
            embeds, _ = pipeline.encode_prompt(prompt=prompt, device="cpu", max_sequence_length=max_length)
        ref.add(f"text.{key}.prompt_embeds", embeds,
                "hidden_states (9, 18, 27) stacked per token as [h9 | h18 | h27]: the DiT's encoder_hidden_states")
    text.long_prompt_check(tokens["long"]["untruncated_tokens"], max_length, family)

    add_transformer_forward(ref, pipeline.transformer, joint_dim)
    ref.set("scheduler_cases", add_scheduler(ref, pipeline.scheduler.config))
    common.add_vae_2d(ref, pipeline.vae, 32, (6, 8), 2)
    call = {"prompt": text.PROMPTS["ascii"], "height": HEIGHT, "width": WIDTH, "num_inference_steps": STEPS}
    calls = {"pipeline": common.run_pipeline(ref, pipeline, "pipeline", True, SEED, guidance_scale=1.0, **call)}
    # klein base: the same weights run as a non-distilled model, with true CFG against "".
    pipeline.register_to_config(is_distilled=False)
    calls["pipeline_cfg"] = {**common.run_pipeline(ref, pipeline, "pipeline_cfg", False, SEED, guidance_scale=4.0,
                                                   **call), "is_distilled": False}
    ref.set("tokens", tokens)
    ref.set("text_encoder", {"hidden_states_layers": list(KLEIN_LAYERS), "max_sequence_length": max_length,
                             "chat_template_kwargs": {"add_generation_prompt": True, "enable_thinking": False}})
    ref.set("calls", calls)
    ref.set("components", common.component_summary(folder, pipeline))
    ref.write()


def build_dev():
    family = "flux2-dev"
    # The real repo's tokenizer folder holds a PixtralProcessor, which needs torchvision; the tiny
    # one holds the tokenizer alone, which takes the same apply_chat_template call.
    tokenizer = text.tekken_tokenizer()
    tokenizer.chat_template = text.MISTRAL3_CHAT_TEMPLATE
    text_encoder = mistral3_text_encoder(tokenizer, seed=1)
    joint_dim = 3 * text_encoder.config.text_config.hidden_size
    pipeline = Flux2Pipeline(scheduler=scheduler(), vae=vae(seed=2), text_encoder=text_encoder, tokenizer=tokenizer,
                             transformer=transformer(joint_dim, True, seed=3))
    folder = common.save_pipeline(pipeline, family)
    pipeline = Flux2Pipeline.from_pretrained(folder, dtype=torch.float32)

    ref = common.Reference(family, "Flux2Pipeline")
    max_length = 512
    tokens = {}
    for key in text.PROMPT_ORDER:
        prompt = text.PROMPTS[key]
        messages = format_input(prompts=[prompt], system_message=pipeline.system_message)
        formatted = pipeline.tokenizer.apply_chat_template(messages[0], tokenize=False, add_generation_prompt=False)
        valid = common.add_tokens(ref, key, pipeline.tokenizer.apply_chat_template(
            messages, add_generation_prompt=False, tokenize=True, return_dict=True, return_tensors="pt",
            padding="max_length", truncation=True, max_length=max_length))
        tokens[key] = {"prompt": prompt, "formatted": formatted, "valid_tokens": valid,
                       "untruncated_tokens": len(pipeline.tokenizer(formatted, add_special_tokens=False).input_ids)}
        with torch.no_grad():
            embeds, _ = pipeline.encode_prompt(prompt=prompt, device="cpu", max_sequence_length=max_length)
        ref.add(f"text.{key}.prompt_embeds", embeds,
                "hidden_states (10, 20, 30) stacked per token as [h10 | h20 | h30]: the DiT's encoder_hidden_states")
    text.long_prompt_check(tokens["long"]["untruncated_tokens"], max_length, family)

    add_transformer_forward(ref, pipeline.transformer, joint_dim, guidance=4.0)
    ref.set("scheduler_cases", add_scheduler(ref, pipeline.scheduler.config))
    common.add_vae_2d(ref, pipeline.vae, 32, (6, 8), 2)
    call = {"prompt": text.PROMPTS["ascii"], "height": HEIGHT, "width": WIDTH, "num_inference_steps": STEPS}
    calls = {"pipeline": common.run_pipeline(ref, pipeline, "pipeline", True, SEED, guidance_scale=4.0, **call)}
    ref.set("tokens", tokens)
    ref.set("text_encoder", {"hidden_states_layers": list(DEV_LAYERS), "max_sequence_length": max_length,
                             "system_message": pipeline.system_message,
                             "chat_template_kwargs": {"add_generation_prompt": False}})
    ref.set("calls", calls)
    ref.set("components", common.component_summary(folder, pipeline))
    ref.write()
