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
import argparse
import json
import os
import shutil
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(ROOT, "tests", "fixtures", "models", "flux2-klein-tiny")


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


def qwen3_config(num_layers):
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151936,
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=num_layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        hidden_act="silu",
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        attention_bias=False,
        attention_dropout=0.0,
        tie_word_embeddings=True,
        use_cache=True,
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=num_layers,
        layer_types=["full_attention"] * num_layers,
        architectures=["Qwen3ForCausalLM"],
    )


def random_state(model, gen):
    """Deterministic bf16 tensors for every persistent entry of model.state_dict() (in name order)."""
    import torch

    out = {}
    for name, ref in sorted(model.state_dict().items()):
        shape = tuple(ref.shape)
        if not ref.dtype.is_floating_point:  # e.g. BatchNorm's num_batches_tracked
            out[name] = torch.zeros(shape, dtype=ref.dtype)
            continue
        t = torch.empty(shape, dtype=torch.bfloat16)
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "running_mean":
            t.normal_(0.0, 0.05, generator=gen)
        elif leaf == "running_var":
            t.copy_(1.0 + 0.1 * torch.randn(shape, generator=gen).abs())
        elif leaf == "bias":
            t.zero_()
        elif len(shape) >= 2:  # linear, conv, embedding
            t.normal_(0.0, 0.02, generator=gen)
        else:  # RMSNorm / GroupNorm / LayerNorm weights
            t.fill_(1.0)
        out[name] = t
    return out


def build(model_cls_factory, gen):
    """Build a model on the meta device (no init cost), then assign deterministic random weights."""
    import torch

    with torch.device("meta"):
        model = model_cls_factory()
    state = random_state(model, gen)
    model.load_state_dict(state, strict=True, assign=True)
    return model.to(torch.bfloat16)


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
    from diffusers import AutoencoderKLFlux2, FlowMatchEulerDiscreteScheduler, Flux2Transformer2DModel
    from transformers import Qwen3ForCausalLM

    t0 = time.perf_counter()
    out = os.path.abspath(args.out_dir)
    os.makedirs(out, exist_ok=True)
    gen = torch.Generator().manual_seed(args.seed)

    # Transformer.
    tcfg = transformer_config(args.double, args.single)
    transformer = build(lambda: Flux2Transformer2DModel(**tcfg), gen)
    transformer.save_pretrained(os.path.join(out, "transformer"), safe_serialization=True)
    n_transformer = sum(p.numel() for p in transformer.parameters())
    del transformer

    # Text encoder (tied embeddings: lm_head shares embed_tokens).
    qcfg = qwen3_config(args.encoder_layers)
    text_encoder = build(lambda: Qwen3ForCausalLM(qcfg), gen)
    text_encoder.tie_weights()
    assert text_encoder.lm_head.weight.data_ptr() == text_encoder.model.embed_tokens.weight.data_ptr()
    # Non-persistent buffers (RoPE inv_freq) are still on the meta device; they are not saved and
    # from_pretrained recomputes them.
    text_encoder.config.dtype = torch.bfloat16
    text_encoder.save_pretrained(os.path.join(out, "text_encoder"), safe_serialization=True)
    n_text = sum(p.numel() for p in text_encoder.parameters())
    del text_encoder

    # VAE.
    vae = build(lambda: AutoencoderKLFlux2(**vae_config()), gen)
    vae.save_pretrained(os.path.join(out, "vae"), safe_serialization=True)
    n_vae = sum(p.numel() for p in vae.parameters())
    del vae

    # Tokenizer and scheduler from the tiny fixture.
    for sub in ("tokenizer", "scheduler"):
        dst = os.path.join(out, sub)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(os.path.join(TINY, sub), dst)
    FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(out, "scheduler"))  # sanity

    import diffusers

    model_index = {
        "_class_name": "Flux2KleinPipeline",
        "_diffusers_version": diffusers.__version__,
        "is_distilled": True,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3ForCausalLM"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "Flux2Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLFlux2"],
    }
    with open(os.path.join(out, "model_index.json"), "w") as f:
        json.dump(model_index, f, indent=2)
        f.write("\n")
    taps = [1, 2, 3] if args.encoder_layers < 27 else [9, 18, 27]
    info = {
        "generator": "tools/bench/flux2_make_model.py",
        "seed": args.seed,
        "double_blocks": args.double,
        "single_blocks": args.single,
        "encoder_layers": args.encoder_layers,
        "text_encoder_out_layers": taps,
        "params": {"transformer": n_transformer, "text_encoder": n_text, "vae": n_vae},
    }
    with open(os.path.join(out, "bench_info.json"), "w") as f:
        json.dump(info, f, indent=2)
        f.write("\n")

    size = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(out) for n in ns)
    print(f"wrote {out}: {size / 1e9:.2f} GB on disk, params transformer {n_transformer / 1e6:.0f}M, "
          f"text encoder {n_text / 1e6:.0f}M, vae {n_vae / 1e6:.1f}M ({time.perf_counter() - t0:.1f} s)")

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
