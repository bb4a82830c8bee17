#!/usr/bin/env python3
"""Write a Z-Image-Turbo-shaped diffusers folder with random bf16 weights, for the CPU benchmark.

Usage: z_image_make_model.py OUT_DIR [--layers 2] [--refiner-layers 1] [--encoder-layers 3] [--seed 0]
                             [--no-check]

Every width is the real Z-Image-Turbo one (see /work/shared/MODELS.md):
  transformer  ZImageTransformer2DModel, dim 3840 = 30 heads x 128 (n_kv_heads 30), SwiGLU 10240,
               cap_feat_dim 2560, in_channels 16, patch 2x2 (f_patch 1), qk-norm, norm eps 1e-5,
               RoPE axes_dims (32, 48, 48), axes_lens (1536, 512, 512), theta 256, t_scale 1000;
               only the depth is reduced: --layers main blocks (Turbo has 30) and --refiner-layers
               noise-refiner + as many context-refiner blocks (Turbo has 2 + 2).
  text_encoder Qwen3Model with the Qwen3-4B widths (2560, 32/8 heads, head dim 128, FFN 9728, vocab
               151936) and --encoder-layers layers. The pipeline takes hidden_states[-2], the output of
               layer N-1; it still runs layer N and discards it (xdit skips it).
  vae          AutoencoderKL with the real FLUX.1 VAE config (channels 128/256/512/512, 2 layers per
               block, 16 latent channels, scaling 0.3611, shift 0.1159, no quant convs).
  scheduler    FlowMatchEulerDiscreteScheduler as in Z-Image-Turbo: 1000 train steps, shift 3.0, static.
  tokenizer    copied from tests/fixtures/models/z-image-tiny.

Weights are deterministic in --seed (bench_common.random_state). Unless --no-check, the folder is
loaded with ZImagePipeline.from_pretrained and run twice at 64x64 with one step and the same seed: the
images must be finite and identical.
"""
import bench_common as bc  # first: the shared helpers

import argparse
import os
import sys
import time


def transformer_config(num_layers, num_refiner_layers):
    return dict(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=16,
        dim=3840,
        n_layers=num_layers,
        n_refiner_layers=num_refiner_layers,
        n_heads=30,
        n_kv_heads=30,
        norm_eps=1e-5,
        qk_norm=True,
        cap_feat_dim=2560,
        rope_theta=256.0,
        t_scale=1000.0,
        axes_dims=[32, 48, 48],
        axes_lens=[1536, 512, 512],
    )


def vae_config():
    """black-forest-labs/FLUX.1 vae/config.json, which Z-Image uses."""
    return dict(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(128, 256, 512, 512),
        layers_per_block=2,
        act_fn="silu",
        latent_channels=16,
        norm_num_groups=32,
        sample_size=1024,
        scaling_factor=0.3611,
        shift_factor=0.1159,
        latents_mean=None,
        latents_std=None,
        force_upcast=True,
        use_quant_conv=False,
        use_post_quant_conv=False,
        mid_block_add_attention=True,
    )


def check(out, args):
    import torch
    from diffusers import ZImagePipeline

    t1 = time.perf_counter()
    pipe = ZImagePipeline.from_pretrained(out, dtype=torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    assert pipe.transformer.config.n_layers == args.layers
    assert pipe.text_encoder.config.num_hidden_layers == args.encoder_layers
    load_s = time.perf_counter() - t1
    images = []
    for _ in range(2):
        gen = torch.Generator("cpu").manual_seed(args.seed)
        images.append(pipe(prompt="a red fox in the snow", height=64, width=64, num_inference_steps=1,
                           guidance_scale=0.0, generator=gen, output_type="pt").images)
    assert torch.isfinite(images[0]).all(), "the image has NaN/Inf"
    assert torch.equal(images[0], images[1]), "two runs with the same seed differ"
    print(f"check: ZImagePipeline.from_pretrained loads it ({load_s:.1f} s); a 64x64 one-step image is finite "
          f"(std {images[0].float().std():.3f}) and the same for the same seed ({time.perf_counter() - t1:.1f} s)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--layers", type=int, default=2, help="main blocks (Z-Image has 30)")
    ap.add_argument("--refiner-layers", type=int, default=1,
                    help="noise-refiner and context-refiner blocks, each (Z-Image has 2)")
    ap.add_argument("--encoder-layers", type=int, default=3, help="Qwen3 layers (Qwen3-4B has 36)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-check", action="store_true", help="skip the ZImagePipeline load-and-run check")
    args = ap.parse_args()
    if args.encoder_layers < 2:
        sys.exit("--encoder-layers must be >= 2 (the pipeline takes hidden_states[-2])")

    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImageTransformer2DModel
    from transformers import Qwen3Model

    t0 = time.perf_counter()
    out = os.path.abspath(args.out_dir)
    os.makedirs(out, exist_ok=True)
    gen = torch.Generator().manual_seed(args.seed)  # one stream, in this order: transformer, text encoder, VAE
    params = {}

    tcfg = transformer_config(args.layers, args.refiner_layers)
    params["transformer"] = bc.save_component(bc.build(lambda: ZImageTransformer2DModel(**tcfg), gen), out,
                                              "transformer")
    qcfg = bc.qwen3_config(args.encoder_layers, "Qwen3Model")
    params["text_encoder"] = bc.save_component(bc.build(lambda: Qwen3Model(qcfg), gen), out, "text_encoder")
    params["vae"] = bc.save_component(bc.build(lambda: AutoencoderKL(**vae_config()), gen), out, "vae")

    bc.copy_fixture("z-image-tiny", out, ("tokenizer",))
    FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False) \
        .save_pretrained(os.path.join(out, "scheduler"))
    bc.finish_model(out, t0, "ZImagePipeline", {
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3Model"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "ZImageTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKL"],
    }, {
        "generator": "tools/bench/z_image_make_model.py",
        "seed": args.seed,
        "layers": args.layers,
        "refiner_layers": args.refiner_layers,
        "encoder_layers": args.encoder_layers,
        "params": params,
    })
    if not args.no_check:
        check(out, args)


if __name__ == "__main__":
    main()
