"""Trains the shapes-demo model (a small FLUX.2 klein) on the CPU and saves it in the diffusers layout.

    python tools/train_demo/train.py [--out models/shapes-demo] [--minutes-vae M] [--minutes-dit M]
                                     [--size 64] [--seed 0] [--smoke]

Phases, each time-boxed:
1. tokenizer: a byte-level BPE with the Qwen2 pre-tokenizer and the Qwen3 chat template, learned
   from the grammar's prompts (tools/reference/text.py does the learning);
2. text encoder: a small random Qwen3ForCausalLM, frozen; the pipeline reads hidden_states
   (9, 18, 27), so it has 28 layers and the prompt embeddings are 3 x hidden wide;
3. VAE: AutoencoderKLFlux2 trained on the rendered pictures (L1 + MSE + a small KL), then its latent
   BatchNorm statistics (bn.running_mean / running_var, which the pipeline uses to normalise the
   patchified latents) are set from the encoded training set;
4. transformer: Flux2Transformer2DModel trained by rectified flow matching in the pipeline's
   convention: x_sigma = (1 - sigma) x0 + sigma noise, timestep = sigma (the pipeline passes t/1000),
   target = noise - x0 (FlowMatchEulerDiscreteScheduler.step does x + (sigma_next - sigma) * v);
   first with prompts padded to --text-len (64, cheap), then a last phase padded to --long-len (512,
   the pipeline's max_sequence_length default, since the transformer attends to every pad token);
5. tune phases at the sigmas the pipeline runs (1.0, 0.955, 0.875, 0.701 for 64 image tokens and 4
   steps) and at logit-normal sigmas shifted as it shifts them; --resume DIR runs only these on a
   saved model.
Each phase stops at its time box or at --steps-<phase>; training.json in the output records the counts.
"""
import argparse
import json
import math
import os
import pathlib
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tools/reference"))

import common  # noqa: E402  (tools/reference)
import flux2 as reference_flux2  # noqa: E402
import shapes  # noqa: E402
import text  # noqa: E402
from diffusers import AutoencoderKLFlux2, Flux2KleinPipeline, Flux2Transformer2DModel  # noqa: E402
from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

TAPS = (9, 18, 27)  # Flux2KleinPipeline's default text_encoder_out_layers
TEXT_HIDDEN = 64
LATENT_CHANNELS = 8  # the transformer sees 4 x this per token (2x2 patchify)
VAE_CHANNELS = (32, 64, 64)  # three levels: 8x spatial compression incl. the 2x2 patchify
DIT = dict(num_layers=2, num_single_layers=4, attention_head_dim=32, num_attention_heads=4, mlp_ratio=3.0,
           axes_dims_rope=(8, 8, 8, 8), timestep_guidance_channels=256, rope_theta=2000)


def log(*args):
    print(f"[{time.strftime('%H:%M:%S')}]", *args, flush=True)


def build_tokenizer(seed):
    """text.qwen_tokenizer learns its merges from text.CORPUS; here the corpus is the reference one
    plus a seeded sample of grammar prompts, so the shape words become single tokens."""
    train, _ = shapes.split()
    prompts = [shapes.sample(i, seed, train)[0] for i in range(2000)]
    words = sorted({*shapes.SHAPES, *shapes.COLOURS, *shapes.SIZES, *shapes.ROWS, *shapes.COLUMNS})
    saved = text.CORPUS
    text.CORPUS = saved + prompts + [" ".join(words)]
    try:
        return text.qwen_tokenizer(text.QWEN3_CHAT_TEMPLATE, eos_token="<|im_end|>", vocab_size=512)
    finally:
        text.CORPUS = saved


def build_text_encoder(vocab_size, seed):
    config = Qwen3Config(
        vocab_size=vocab_size, hidden_size=TEXT_HIDDEN, intermediate_size=2 * TEXT_HIDDEN,
        num_hidden_layers=TAPS[-1] + 1, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
        max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(seed)
    model = common.randomize_(Qwen3ForCausalLM(config), seed)
    model.requires_grad_(False)
    return model.eval()


def build_vae(size):
    return AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D",) * len(VAE_CHANNELS),
        up_block_types=("UpDecoderBlock2D",) * len(VAE_CHANNELS), block_out_channels=VAE_CHANNELS,
        layers_per_block=1, norm_num_groups=16, latent_channels=LATENT_CHANNELS, sample_size=size)


def build_transformer():
    return Flux2Transformer2DModel(patch_size=1, in_channels=4 * LATENT_CHANNELS, guidance_embeds=False,
                                   joint_attention_dim=len(TAPS) * TEXT_HIDDEN, **DIT)


def count(module):
    return sum(p.numel() for p in module.parameters())


def encode_prompts(text_encoder, tokenizer, prompts, text_len, batch=32):
    """The pipeline's own prompt encoding (chat template, padding to text_len, taps stacked),
    in float16 to keep the cache small."""
    out = []
    with torch.no_grad():
        for i in range(0, len(prompts), batch):
            embeds = Flux2KleinPipeline._get_qwen3_prompt_embeds(
                text_encoder, tokenizer, prompts[i:i + batch], dtype=torch.float32, device="cpu",
                max_sequence_length=text_len, hidden_states_layers=TAPS)
            out.append(embeds.half())
    return torch.cat(out)


def train_vae(vae, images, minutes, max_steps, batch, seed, kl_weight=1e-6):
    generator = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(vae.parameters(), lr=1e-3, weight_decay=0.0)
    vae.train()
    start, step = time.time(), 0
    while step < max_steps and time.time() - start < 60 * minutes:
        idx = torch.randint(len(images), (batch,), generator=generator)
        x = images[idx]
        dist = vae.encode(x).latent_dist
        z = dist.mean + dist.std * torch.randn(dist.mean.shape, generator=generator)
        recon = vae.decode(z).sample
        rec = F.l1_loss(recon, x) + F.mse_loss(recon, x)
        kl = 0.5 * (dist.mean.pow(2) + dist.var - 1.0 - dist.logvar).sum(dim=(1, 2, 3)).mean()
        loss = rec + kl_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            log(f"vae step {step}: rec {rec.item():.4f} kl {kl.item():.1f}")
        step += 1
    log(f"vae: {step} steps in {time.time() - start:.0f}s")
    return vae.eval(), step


def encode_latents(vae, images, batch=64):
    """Patchified latent means [N, 4C, H/8, W/8] (what the pipeline's latents are, before BN)."""
    out = []
    with torch.no_grad():
        for i in range(0, len(images), batch):
            mean = vae.encode(images[i:i + batch]).latent_dist.mean
            out.append(Flux2KleinPipeline._patchify_latents(mean))
    return torch.cat(out)


def set_bn_statistics(vae, latents):
    """The pipeline normalises latents as (z - running_mean) / sqrt(running_var + eps); set those
    from the encoded training set."""
    with torch.no_grad():
        vae.bn.running_mean.copy_(latents.mean(dim=(0, 2, 3)))
        vae.bn.running_var.copy_(latents.var(dim=(0, 2, 3), unbiased=False))
        vae.bn.num_batches_tracked.fill_(len(latents))


def inference_shift(image_tokens, steps):
    """(shift, sigmas): exp(mu) for FLUX.2's empirical mu at this many image tokens and steps, and
    the sigmas the pipeline runs, its linear schedule mapped by s -> shift s / (1 + (shift - 1) s).
    For the demo (64 tokens, 4 steps) the shift is 7.0 and the sigmas 1.0, 0.955, 0.875, 0.701."""
    shift = math.exp(compute_empirical_mu(image_seq_len=image_tokens, num_steps=steps))
    linear = torch.linspace(1.0, 1.0 / steps, steps)
    return shift, shift * linear / (1 + (shift - 1) * linear)


def train_dit(model, latents, embeds, minutes, max_steps, batch, seed, lr=5e-4, opt=None, first_step=0,
              inference_sigmas=None):
    """latents: BN-normalised patchified [N, C, h, w]; embeds: [N, L, D] float16. Returns the model,
    the optimiser and the step count, so that a second phase (longer prompt padding) continues.
    sigma is logit-normal; with inference_sigmas, half the batch instead takes one of those sigmas
    and the other half is shifted as the pipeline shifts them (see inference_shift)."""
    generator = torch.Generator().manual_seed(seed)
    opt = opt or torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    img_ids = Flux2KleinPipeline._prepare_latent_ids(latents[:1])
    txt_ids = Flux2KleinPipeline._prepare_text_ids(embeds[:1])
    model.train()
    start, step, ema = time.time(), first_step, None
    warmup = 100
    while step - first_step < max_steps and time.time() - start < 60 * minutes:
        idx = torch.randint(len(latents), (batch,), generator=generator)
        x0 = Flux2KleinPipeline._pack_latents(latents[idx])
        noise = torch.randn(x0.shape, generator=generator)
        # logit-normal sigma (SD3 / FLUX training), shape [B, 1, 1]
        sigma = torch.sigmoid(torch.randn(batch, generator=generator))
        if inference_sigmas is not None:
            shift, exact = inference_sigmas
            shifted = shift * sigma / (1 + (shift - 1) * sigma)
            picked = exact[torch.randint(len(exact), (batch,), generator=generator)]
            sigma = torch.where(torch.arange(batch) % 2 == 0, picked, shifted)
        s = sigma.view(-1, 1, 1)
        xt = (1 - s) * x0 + s * noise
        pred = model(hidden_states=xt, encoder_hidden_states=embeds[idx].float(), timestep=sigma,
                     img_ids=img_ids.expand(batch, -1, -1), txt_ids=txt_ids.expand(batch, -1, -1),
                     guidance=None, return_dict=False)[0]
        loss = F.mse_loss(pred, noise - x0)
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        if (step - first_step) % 25 == 0:
            rate = (time.time() - start) / (step - first_step + 1)
            log(f"dit step {step}: loss {loss.item():.4f} (ema {ema:.4f}), {rate:.2f}s/step")
        step += 1
    log(f"dit ({embeds.shape[1]} text tokens): {step - first_step} steps in {time.time() - start:.0f}s")
    return model.eval(), opt, step


def folder_size(folder):
    return sum(p.stat().st_size for p in pathlib.Path(folder).rglob("*") if p.is_file())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "models/shapes-demo"))
    parser.add_argument("--minutes-vae", type=float, default=15.0)
    parser.add_argument("--minutes-dit", type=float, default=53.0)
    parser.add_argument("--size", type=int, default=64, help="picture side in pixels (multiple of 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=4096, help="size of the fixed training set")
    parser.add_argument("--text-len", type=int, default=64,
                        help="prompt padding length of the main transformer phase (a prompt is ~33 tokens)")
    parser.add_argument("--long-len", type=int, default=512,
                        help="prompt padding length of the last phase: the pipeline's max_sequence_length default")
    parser.add_argument("--minutes-long", type=float, default=12.0,
                        help="minutes of the last transformer phase, at --long-len (0 skips it)")
    parser.add_argument("--long-samples", type=int, default=1024,
                        help="training samples whose prompts are also encoded at --long-len")
    parser.add_argument("--batch", type=int, default=32, help="batch of the VAE and main transformer phases "
                        "(the --long-len phase uses a quarter of it)")
    parser.add_argument("--minutes-tune-short", type=float, default=0.0,
                        help="minutes of a tuning phase like --minutes-tune but at --text-len and the full batch, "
                             "before it (0 skips it)")
    parser.add_argument("--minutes-tune", type=float, default=6.5,
                        help="minutes of the tuning phase at --long-len: half of each batch at the sigmas the "
                             "pipeline runs by default (4 steps), half at sigmas shifted as they are (0 skips it)")
    parser.add_argument("--resume", metavar="DIR",
                        help="load a saved model and run only the tune phases (how the committed model's last "
                             "phases ran; the same as in one run, since each starts a fresh optimiser)")
    for phase in ("vae", "dit", "long", "tune_short", "tune"):
        parser.add_argument(f"--steps-{phase}", type=int, default=None,
                            help=f"stop the {phase} phase after this many steps (with a generous --minutes-{phase}, "
                                 "a run that does not depend on the machine's speed)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="a few steps per phase, a tiny data set")
    args = parser.parse_args()
    if args.size % 8:
        parser.error("--size must be a multiple of 8")

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    def max_steps(phase):
        given = getattr(args, f"steps_{phase}")
        return given if given is not None else (3 if args.smoke else 10 ** 9)
    samples = 64 if args.smoke else args.samples
    batch = 8 if args.smoke else args.batch
    t0 = time.time()

    # Data: a fixed, seeded set of (prompt, picture) from the training split.
    train_attrs, held = shapes.split()
    data = [shapes.sample(i, args.seed, train_attrs) for i in range(samples)]
    prompts = [prompt for prompt, _, _ in data]
    pictures = np.stack([shapes.render(attrs, args.size, s) for _, attrs, s in data])
    images = torch.from_numpy(pictures).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    log(f"data: {samples} samples ({len(set(prompts))} prompts) at {args.size}px; "
        f"{len(train_attrs)} train / {len(held)} held-out prompts in the grammar")

    previous = {}
    if args.resume:
        saved = Flux2KleinPipeline.from_pretrained(args.resume, dtype=torch.float32)
        tokenizer, text_encoder, vae, transformer = saved.tokenizer, saved.text_encoder, saved.vae, saved.transformer
        text_encoder.requires_grad_(False)
        previous = json.loads((pathlib.Path(args.resume) / "training.json").read_text())
        log(f"resumed {args.resume}: {previous.get('dit_steps')} transformer steps so far")
    else:
        tokenizer = build_tokenizer(args.seed)
        text_encoder = build_text_encoder(len(tokenizer), args.seed + 1)
        torch.manual_seed(args.seed + 2)
        vae = build_vae(args.size)
        torch.manual_seed(args.seed + 3)
        transformer = build_transformer()
    log(f"parameters: text encoder {count(text_encoder):,}, vae {count(vae):,}, transformer {count(transformer):,}")

    def encode(subset, length):
        unique = sorted(set(subset))
        cache = encode_prompts(text_encoder, tokenizer, unique, length)
        row = {p: i for i, p in enumerate(unique)}
        log(f"text: {len(unique)} prompts encoded to {tuple(cache.shape)} (std {cache.float().std():.3f})")
        return cache[torch.tensor([row[p] for p in subset])]

    needs_short = not args.resume or args.minutes_tune_short > 0
    embeds = encode(prompts, args.text_len) if needs_short else None
    long_count = min(samples, 16 if args.smoke else args.long_samples)
    needs_long = args.minutes_tune > 0 or (args.minutes_long > 0 and not args.resume)
    long_embeds = encode(prompts[:long_count], args.long_len) if needs_long else None

    if args.resume:
        vae_steps = previous["vae_steps"]
        latents = encode_latents(vae, images)
    else:
        vae, vae_steps = train_vae(vae, images, args.minutes_vae, max_steps("vae"), batch, args.seed + 4)
        latents = encode_latents(vae, images)
        set_bn_statistics(vae, latents)
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    normalised = (latents - mean) / std
    log(f"latents {tuple(latents.shape)}: bn mean |.| {mean.abs().mean():.3f}, std {std.mean():.3f}")

    if args.resume:
        steps = previous["dit_steps"]
    else:
        transformer, opt, steps = train_dit(transformer, normalised, embeds, args.minutes_dit, max_steps("dit"),
                                            batch, args.seed + 5)
        if args.minutes_long > 0:
            # The pipeline pads prompts to max_sequence_length (512 by default) and the transformer
            # attends to every padding token; the main phase uses short padding (8x cheaper), this
            # phase teaches the model the pipeline's default padding.
            transformer, opt, steps = train_dit(transformer, normalised[:long_count], long_embeds, args.minutes_long,
                                                max_steps("long"), max(1, batch // 4), args.seed + 6, opt=opt,
                                                first_step=steps)
    # Logit-normal sigmas seldom exceed 0.9, yet the pipeline's 4 steps all run at 0.70 and above,
    # where only the prompt tells what to draw; the tune phases train there, each with a fresh optimiser.
    sigmas = inference_shift((args.size // 8) ** 2, 4)
    tune_short_steps = tune_steps = 0
    if args.minutes_tune_short > 0:
        transformer, _, tune_short_steps = train_dit(transformer, normalised, embeds, args.minutes_tune_short,
                                                     max_steps("tune_short"), batch, args.seed + 8, lr=2e-4,
                                                     inference_sigmas=sigmas)
    if args.minutes_tune > 0:
        transformer, _, tune_steps = train_dit(transformer, normalised[:long_count], long_embeds, args.minutes_tune,
                                               max_steps("tune"), max(1, batch // 4), args.seed + 7, lr=2e-4,
                                               inference_sigmas=sigmas)

    scheduler = reference_flux2.scheduler()
    pipeline = Flux2KleinPipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                                  transformer=transformer, is_distilled=True)
    out = pathlib.Path(args.out)
    pipeline.save_pretrained(out, safe_serialization=True)
    info = {**previous, "seed": args.seed, "size": args.size, "samples": samples, "text_len": args.text_len,
            "long_len": args.long_len, "vae_steps": vae_steps, "long_samples": long_count, "dit_steps": steps,
            "smoke": args.smoke,
            "held_out_fraction": 0.1, "seconds": previous.get("seconds", 0) + round(time.time() - t0)}
    if not args.resume:
        info.update(minutes_vae=args.minutes_vae, minutes_dit=args.minutes_dit, minutes_long=args.minutes_long)
    # Every run appends its tune phases, so a resumed model's lineage stays on record.
    info["tune_runs"] = previous.get("tune_runs", []) + [
        {"minutes_tune_short": args.minutes_tune_short, "tune_short_steps": tune_short_steps,
         "minutes_tune": args.minutes_tune, "tune_steps": tune_steps, "seconds": round(time.time() - t0)}]
    (out / "training.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    size = folder_size(out)
    log(f"saved {out}: {size / 1e6:.2f} MB ({'OK' if size <= 20 * 10 ** 6 else 'OVER 20 MB'})")


if __name__ == "__main__":
    main()
