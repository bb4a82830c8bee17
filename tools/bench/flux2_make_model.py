#!/usr/bin/env python3
"""Write a FLUX.2-klein-4B-shaped diffusers folder with random bf16 weights, for the CPU benchmark.

Usage: flux2_make_model.py OUT_DIR [--double 2] [--single 4] [--encoder-layers 4] [--seed 0]

Every width is the real klein-4B one (see /work/shared/MODELS.md):
  transformer  Flux2Transformer2DModel, hidden 3072 = 24 heads x 128, joint_attention_dim 7680 = 3 x 2560,
               in_channels 128, mlp_ratio 3, RoPE axes (32,32,32,32) theta 2000, no guidance embeds;
               only the depth is reduced (--double double blocks, --single single blocks).
  text_encoder Qwen3ForCausalLM with the Qwen3-4B widths (2560, 32/8 heads, head dim 128, FFN 9728,
               vocab 151936, tied embeddings) and --encoder-layers layers.
  vae          AutoencoderKLFlux2 with the real FLUX.2 VAE config (channels 128/256/512/512, 32 latent
               channels, 2x2 patch, BatchNorm latent statistics).
  tokenizer, scheduler  copied from tests/fixtures/models/flux2-klein-tiny.

Weights are deterministic in --seed: matrices and convolution kernels are N(0, 0.02), norm weights are
ones, biases are zeros, and the VAE's BatchNorm statistics are mildly non-trivial (mean N(0, 0.05),
var 1 + 0.1|N|). Nothing is trained; the point is the shapes and the cost, while keeping activations
finite through a full 4-step run.

With only --encoder-layers layers the pipeline's default text-encoder taps (9, 18, 27) do not exist:
call Flux2KleinPipeline with text_encoder_out_layers=(1, 2, 3) (the xdit CLI takes
--text_encoder_out_layers 1,2,3). The chosen taps are also written to OUT_DIR/bench_info.json.
"""
import bench_common as bc  # first: it starts the clock and sets up the shared helpers

import argparse
import os
import sys
import time


def transformer_config(num_double, num_single):
    return dict(
        patch_size=1,
        in_channels=128,
        out_channels=None,
        num_layers=num_double,
        num_single_layers=num_single,
        attention_head_dim=128,
        num_attention_heads=24,
        joint_attention_dim=7680,
        timestep_guidance_channels=256,
        mlp_ratio=3.0,
        axes_dims_rope=(32, 32, 32, 32),
        rope_theta=2000,
        eps=1e-6,
        guidance_embeds=False,
    )


def vae_config():
    return dict(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(128, 256, 512, 512),
        decoder_block_out_channels=None,
        layers_per_block=2,
        act_fn="silu",
        latent_channels=32,
        norm_num_groups=32,
        sample_size=1024,
        use_quant_conv=True,
        use_post_quant_conv=True,
        mid_block_add_attention=True,
        batch_norm_eps=1e-4,
        batch_norm_momentum=0.1,
        patch_size=(2, 2),
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("--double", type=int, default=2, help="double-stream blocks (klein-4B has 5)")
    ap.add_argument("--single", type=int, default=4, help="single-stream blocks (klein-4B has 20)")
    ap.add_argument("--encoder-layers", type=int, default=4, help="Qwen3 layers (Qwen3-4B has 36)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-check", action="store_true", help="skip the Flux2KleinPipeline.from_pretrained check")
    args = ap.parse_args()
    if args.encoder_layers < 3:
        sys.exit("--encoder-layers must be >= 3 (the pipeline taps three hidden states)")

    import torch
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel
    from transformers import Qwen3ForCausalLM

    t0 = time.perf_counter()
    out = os.path.abspath(args.out_dir)
    os.makedirs(out, exist_ok=True)
    gen = torch.Generator().manual_seed(args.seed)  # one stream, in this order: transformer, text encoder, VAE
    params = {}

    tcfg = transformer_config(args.double, args.single)
    params["transformer"] = bc.save_component(bc.build(lambda: Flux2Transformer2DModel(**tcfg), gen), out, "transformer")

    # Text encoder (tied embeddings: lm_head shares embed_tokens).
    qcfg = bc.qwen3_config(args.encoder_layers, "Qwen3ForCausalLM")
    text_encoder = bc.build(lambda: Qwen3ForCausalLM(qcfg), gen)
    text_encoder.tie_weights()
    assert text_encoder.lm_head.weight.data_ptr() == text_encoder.model.embed_tokens.weight.data_ptr()
    params["text_encoder"] = bc.save_component(text_encoder, out, "text_encoder")
    del text_encoder

    params["vae"] = bc.save_component(bc.build(lambda: AutoencoderKLFlux2(**vae_config()), gen), out, "vae")

    bc.copy_fixture("flux2-klein-tiny", out, ("tokenizer", "scheduler"))
    taps = [1, 2, 3] if args.encoder_layers < 27 else [9, 18, 27]
    bc.finish_model(out, t0, "Flux2KleinPipeline", {
        "is_distilled": True,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3ForCausalLM"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "Flux2Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLFlux2"],
    }, {
        "generator": "tools/bench/flux2_make_model.py",
        "seed": args.seed,
        "double_blocks": args.double,
        "single_blocks": args.single,
        "encoder_layers": args.encoder_layers,
        "text_encoder_out_layers": taps,
        "params": params,
    })

    if not args.no_check:
        from diffusers import Flux2KleinPipeline

        t1 = time.perf_counter()
        pipe = Flux2KleinPipeline.from_pretrained(out, torch_dtype=torch.bfloat16)
        assert pipe.transformer.config.num_layers == args.double
        assert pipe.text_encoder.config.num_hidden_layers == args.encoder_layers
        bad = [n for n, p in pipe.transformer.named_parameters() if not torch.isfinite(p).all()]
        assert not bad, bad
        print(f"check: Flux2KleinPipeline.from_pretrained loads it ({time.perf_counter() - t1:.1f} s); "
              f"use text_encoder_out_layers={tuple(taps)}")


if __name__ == "__main__":
    main()
