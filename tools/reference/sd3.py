"""Stable Diffusion 3.5 (StableDiffusion3Pipeline: SD3Transformer2DModel, AutoencoderKL, CLIP-L and
CLIP-G (CLIPTextModelWithProjection), T5EncoderModel)."""
import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel

import common
import text

FAMILY = "sd35"
HEIGHT, WIDTH = 32, 48
STEPS = 3
SEED = 42
SCHEDULER_STEPS = [1, 2, 4, 28, 40]
CLIP_WIDTH = 32
T5_WIDTH = 64  # the CLIP features (2 x 32) are zero-padded to the T5 width


def scheduler():
    return FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)


def vae(seed):
    """The SD3 VAE layout: 16 latent channels, scaling 1.5305, shift 0.0609, no quant convs."""
    model = AutoencoderKL(
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(16, 16), layers_per_block=1, norm_num_groups=4, latent_channels=16, sample_size=64,
        scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False, use_post_quant_conv=False)
    return common.randomize_(model, seed)


def transformer(seed):
    # Block 0 is an MMDiT-X block with the second (dual) attention, as in SD3.5 Medium; block 1 is
    # a plain one and, being last, context_pre_only. pos_embed_max_size 16 keeps the stored sin-cos
    # table small; the 8x12-patch pictures below still take the centre crop.
    model = SD3Transformer2DModel(
        sample_size=32, patch_size=2, in_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=T5_WIDTH, caption_projection_dim=32, pooled_projection_dim=2 * CLIP_WIDTH,
        out_channels=16, pos_embed_max_size=16, dual_attention_layers=(0,), qk_norm="rms_norm")
    return common.randomize_(model, seed)


def clip_encoder(vocab_size, hidden_act, seed):
    config = CLIPTextConfig(
        vocab_size=vocab_size, hidden_size=CLIP_WIDTH, intermediate_size=64, projection_dim=CLIP_WIDTH,
        num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=77, hidden_act=hidden_act,
        # The ids of the released SD3 configs; eos_token_id 2 selects the pooled token by argmax of the ids.
        bos_token_id=0, eos_token_id=2, pad_token_id=1)
    return common.randomize_(CLIPTextModelWithProjection(config), seed)


def t5_encoder(vocab_size, seed):
    config = T5Config(
        vocab_size=vocab_size, d_model=T5_WIDTH, d_kv=32, d_ff=64, num_layers=2, num_heads=2,
        relative_attention_num_buckets=32, relative_attention_max_distance=128, feed_forward_proj="gated-gelu",
        tie_word_embeddings=False, is_encoder_decoder=False, use_cache=False)
    return common.randomize_(T5EncoderModel(config), seed)


def add_transformer_forward(ref, model):
    """One forward on a [1, 16, 12, 16] latent (6x8 patches) with 20 context tokens."""
    generator = torch.Generator("cpu").manual_seed(7)
    latents = torch.randn(1, 16, 12, 16, generator=generator)
    context = torch.randn(1, 20, T5_WIDTH, generator=generator)
    pooled = torch.randn(1, 2 * CLIP_WIDTH, generator=generator)
    timestep = torch.tensor([750.0])
    with torch.no_grad():
        out = model(hidden_states=latents, timestep=timestep, encoder_hidden_states=context,
                    pooled_projections=pooled, return_dict=False)[0]
    ref.add("transformer.hidden_states", latents, "latents [B, 16, H, W]")
    ref.add("transformer.encoder_hidden_states", context, "context tokens [B, L, joint_attention_dim]")
    ref.add("transformer.pooled_projections", pooled, "pooled CLIP-L | CLIP-G text embeds")
    ref.add("transformer.timestep", timestep, "timestep as the pipeline passes it (sigma * 1000)")
    ref.add("transformer.output", out, "transformer output [B, 16, H, W]")


def add_scheduler(ref, config):
    cases = []
    for steps in SCHEDULER_STEPS:
        sigmas, timesteps = common.flow_match_schedule(FlowMatchEulerDiscreteScheduler, config, steps)
        name = f"scheduler.steps{steps}"
        ref.add(f"{name}.sigmas", sigmas, "scheduler.sigmas after set_timesteps(N) (N + 1, ends in 0)")
        ref.add(f"{name}.timesteps", timesteps, "scheduler.timesteps")
        cases.append({"name": name, "steps": steps})
    return cases


def add_text(ref, pipeline, key, prompt):
    """Token ids of the three tokenizers and the features the transformer receives."""
    tokenizers = {"tokenizer": (pipeline.tokenizer, pipeline.tokenizer_max_length),
                  "tokenizer_2": (pipeline.tokenizer_2, pipeline.tokenizer_max_length),
                  "tokenizer_3": (pipeline.tokenizer_3, 256)}
    info = {"prompt": prompt}
    for name, (tokenizer, max_length) in tokenizers.items():
        inputs = tokenizer(prompt, padding="max_length", max_length=max_length, truncation=True,
                           add_special_tokens=True, return_tensors="pt")
        common.add_tokens(ref, f"{key}.{name}", inputs)
        info[name] = {"valid_tokens": int(inputs["attention_mask"].sum()), "max_length": max_length,
                      "untruncated_tokens": len(tokenizer(prompt).input_ids)}
    with torch.no_grad():
        embeds, _, pooled, _ = pipeline.encode_prompt(prompt=prompt, prompt_2=None, prompt_3=None, device="cpu",
                                                      do_classifier_free_guidance=False, max_sequence_length=256)
    ref.add(f"text.{key}.prompt_embeds", embeds,
            "[CLIP-L hidden_states[-2] | CLIP-G hidden_states[-2]] zero-padded to the T5 width (77 tokens), "
            "then the T5 output (256 tokens)")
    ref.add(f"text.{key}.pooled_prompt_embeds", pooled, "[CLIP-L text_embeds | CLIP-G text_embeds]")
    return info


def build():
    clip_l_tokenizer = text.clip_tokenizer()
    clip_g_tokenizer = text.clip_tokenizer(pad_token="!")  # SD3's tokenizer_2 pads with "!"
    t5_tokenizer = text.t5_tokenizer()
    pipeline = StableDiffusion3Pipeline(
        transformer=transformer(seed=3), scheduler=scheduler(), vae=vae(seed=2),
        text_encoder=clip_encoder(len(clip_l_tokenizer), "quick_gelu", seed=4), tokenizer=clip_l_tokenizer,
        text_encoder_2=clip_encoder(len(clip_g_tokenizer), "gelu", seed=5), tokenizer_2=clip_g_tokenizer,
        text_encoder_3=t5_encoder(len(t5_tokenizer), seed=6), tokenizer_3=t5_tokenizer)
    folder = common.save_pipeline(pipeline, FAMILY)
    pipeline = StableDiffusion3Pipeline.from_pretrained(folder, dtype=torch.float32)

    ref = common.Reference(FAMILY, "StableDiffusion3Pipeline")
    tokens = {key: add_text(ref, pipeline, key, text.PROMPTS[key]) for key in text.PROMPT_ORDER}
    for name in ("tokenizer", "tokenizer_3"):
        text.long_prompt_check(tokens["long"][name]["untruncated_tokens"], tokens["long"][name]["max_length"], FAMILY)
    # The checks shared by every family read the first tokenizer's counts.
    for info in tokens.values():
        info["valid_tokens"] = info["tokenizer"]["valid_tokens"]
        info["untruncated_tokens"] = info["tokenizer"]["untruncated_tokens"]

    add_transformer_forward(ref, pipeline.transformer)
    ref.set("scheduler_cases", add_scheduler(ref, pipeline.scheduler.config))
    common.add_vae_2d(ref, pipeline.vae, 16, (6, 8), 2)
    call = {"prompt": text.PROMPTS["ascii"], "height": HEIGHT, "width": WIDTH, "num_inference_steps": STEPS}
    calls = {
        # Medium/Large: CFG against the empty negative prompt.
        "pipeline": common.run_pipeline(ref, pipeline, "pipeline", True, SEED, guidance_scale=4.5, **call),
        # Large Turbo: no guidance.
        "pipeline_no_cfg": common.run_pipeline(ref, pipeline, "pipeline_no_cfg", False, SEED, guidance_scale=0.0,
                                               **call),
    }
    ref.set("tokens", tokens)
    ref.set("text_encoder", {"clip_hidden_states_index": -2, "clip_max_length": 77, "t5_max_sequence_length": 256,
                             "t5_gets_attention_mask": False})
    ref.set("calls", calls)
    ref.set("components", common.component_summary(folder, pipeline))
    ref.write()
