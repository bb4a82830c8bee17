"""Trains the shapes-demo model (a small FLUX.2 klein) on the CPU and saves it in the diffusers layout.

    python tools/train_demo/train.py [--out models/shapes-demo] [--minutes-vae M] [--minutes-dit M]
                                     [--minutes-tune M] [--minutes-retune M] [--seed 0] [--smoke]

One run from a fixed seed, in phases that each stop at a time box (--minutes-<phase>) or a step
count (--steps-<phase>); training.json in the output records the steps each phase ran.
1. data: grammar prompts and their pictures; a byte-level BPE tokenizer (Qwen2 pre-tokenizer,
   Qwen3 chat template) learned by tools/reference/text.py; a small random Qwen3ForCausalLM text
   encoder, frozen (the pipeline reads hidden_states 9, 18 and 27, so it has 28 layers); the
   prompt embeddings the pipeline computes, padded to --text-len, which the saved tokenizer
   declares as its model_max_length (xdit's default max_sequence_length for this model);
2. vae: AutoencoderKLFlux2 on the pictures (L1 + MSE + a small KL) with a near-deterministic
   posterior from the first step; its latent BatchNorm statistics (the pipeline normalises the
   patchified latents with them) are then set from the encoded pictures;
3. dit: Flux2Transformer2DModel by flow matching in the pipeline's convention: x_sigma = (1 - sigma)
   x0 + sigma noise, timestep = sigma (the pipeline passes t / 1000), target noise - x0
   (FlowMatchEulerDiscreteScheduler.step does x + (sigma_next - sigma) v); half of each batch at
   fixed high sigmas, where only the prompt says what to draw (see dit_sigmas);
4. tune: the same as a klein base model: shifted logit-normal sigmas over the whole schedule, and
   PROMPT_DROPOUT of the prompts replaced by "", so that classifier-free guidance has an
   unconditional prediction to push against;
5. retune: the tune phase again at half the peak learning rate, from a fresh optimiser (a second
   cosine cycle drew more shapes right than one cycle of the same length).
The saved transformer is the exponential moving average of the trained weights. --from DIR continues
a saved model with one more retune cycle: it loads the model's tokenizer, text encoder, VAE and
transformer, rebuilds the same data, and skips phases 2 to 4.
"""
import argparse
import copy
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
VAE_CHANNELS = (16, 32, 64)  # three levels: 8x spatial compression incl. the 2x2 patchify
VAE_GROUPS = 8
INITIAL_LOGVAR = -10.0  # posterior std exp(-5): the decoder sees the latent, not noise, from the start
DIT = dict(num_layers=2, num_single_layers=4, attention_head_dim=32, num_attention_heads=4, mlp_ratio=3.0,
           axes_dims_rope=(8, 8, 8, 8), timestep_guidance_channels=256, rope_theta=2000)
INFERENCE_STEPS = 50  # klein base: the pipeline's default step count
PROMPT_DROPOUT = 0.1  # how often a tune prompt is replaced by "", the negative prompt CFG runs against
# The dit phase's fixed sigmas: those of FLUX.2's 4-step schedule at 64 image tokens (shift 7.02).
# Measured: with half of each batch here the model learns the colours several times faster than
# with logit-normal sigmas alone, which seldom reach sigma 1, the step that decides the colours.
HIGH_SIGMAS = (1.0, 0.9547, 0.8754, 0.7007)
HIGH_SHIFT = 7.02
WARMUP_STEPS = 100


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
    vae = AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D",) * len(VAE_CHANNELS),
        up_block_types=("UpDecoderBlock2D",) * len(VAE_CHANNELS), block_out_channels=VAE_CHANNELS,
        layers_per_block=1, norm_num_groups=VAE_GROUPS, latent_channels=LATENT_CHANNELS, sample_size=size)
    # The encoder's last conv gives the posterior mean, then its log-variance. With diffusers' init
    # the posterior std is ~1, as large as the mean, and the decoder learns to blur through the noise.
    with torch.no_grad():
        vae.encoder.conv_out.weight[LATENT_CHANNELS:].zero_()
        vae.encoder.conv_out.bias[LATENT_CHANNELS:].fill_(INITIAL_LOGVAR)
    return vae


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


def cosine_lr(peak, phase):
    """A linear warm-up over the first WARMUP_STEPS, then a cosine decay to 0 over the phase. The
    warm-up counts steps, not time: the first step's torch.compile takes as long as many steps."""
    warmup = min(1.0, (phase.step + 1) / WARMUP_STEPS)
    return peak * warmup * 0.5 * (1 + math.cos(math.pi * min(1.0, phase.fraction())))


class Phase:
    """The progress of a phase that ends at a time box or a step count, whichever comes first;
    fraction() (of whichever bounds it) drives the learning-rate schedule."""

    def __init__(self, name, minutes, max_steps):
        self.name, self.seconds, self.max_steps = name, 60 * minutes, max_steps
        self.start, self.step = time.time(), 0

    def running(self):
        return self.step < self.max_steps and time.time() - self.start < self.seconds

    def fraction(self):
        return max(self.step / self.max_steps, (time.time() - self.start) / self.seconds)

    def done(self):
        log(f"{self.name}: {self.step} steps in {time.time() - self.start:.0f}s")
        return self.step


def train_vae(vae, images, phase, batch, seed, lr=2e-3, kl_weight=1e-6):
    generator = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(vae.parameters(), lr=lr, weight_decay=0.0)
    vae.train()
    while phase.running():
        for group in opt.param_groups:
            group["lr"] = cosine_lr(lr, phase)
        x = images[torch.randint(len(images), (batch,), generator=generator)]
        dist = vae.encode(x).latent_dist
        z = dist.mean + dist.std * torch.randn(dist.mean.shape, generator=generator)
        recon = vae.decode(z).sample
        rec = F.l1_loss(recon, x) + F.mse_loss(recon, x)
        kl = 0.5 * (dist.mean.pow(2) + dist.var - 1.0 - dist.logvar).sum(dim=(1, 2, 3)).mean()
        opt.zero_grad(set_to_none=True)
        (rec + kl_weight * kl).backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        if phase.step % 100 == 0:
            log(f"vae step {phase.step}: rec {rec.item():.4f} kl {kl.item():.1f}")
        phase.step += 1
    return vae.eval(), phase.done()


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


def inference_shift(image_tokens, steps=INFERENCE_STEPS):
    """exp(mu) for FLUX.2's empirical mu at this many image tokens and steps: the pipeline maps its
    linear schedule by s -> shift s / (1 + (shift - 1) s). For the demo (64 tokens, 50 steps) it is 4.96."""
    return math.exp(compute_empirical_mu(image_seq_len=image_tokens, num_steps=steps))


def shifted_logit_normal(batch, generator, shift):
    """Logit-normal sigmas shifted as the pipeline shifts its schedule (median 0.83 at shift 4.96).
    Unshifted logit-normal sigmas (SD3, FLUX) seldom exceed 0.9, where only the prompt says what
    to draw: a model trained on them learns to denoise and hardly follows the prompt."""
    u = torch.sigmoid(torch.randn(batch, generator=generator))
    return shift * u / (1 + (shift - 1) * u)


def dit_sigmas(batch, generator):
    """Even batch rows at one of HIGH_SIGMAS, odd ones shifted logit-normal (shift HIGH_SHIFT)."""
    fixed = torch.tensor(HIGH_SIGMAS)[torch.randint(len(HIGH_SIGMAS), (batch,), generator=generator)]
    spread = shifted_logit_normal(batch, generator, HIGH_SHIFT)
    return torch.where(torch.arange(batch) % 2 == 0, fixed, spread)


class Ema:
    """The exponential moving average of a model's weights, the weights the model is saved with."""

    def __init__(self, model, decay):
        self.model, self.decay, self.updates = copy.deepcopy(model).eval(), decay, 0
        self.model.requires_grad_(False)

    def update(self, model):
        self.updates += 1
        decay = min(self.decay, (1 + self.updates) / (10 + self.updates))
        with torch.no_grad():
            for average, current in zip(self.model.parameters(), model.parameters()):
                average.lerp_(current, 1 - decay)


def train_dit(model, ema, latents, embeds, empty, phase, batch, seed, lr, base, compiled=None):
    """latents: BN-normalised patchified [N, C, h, w]; embeds: [N, L, D] float16; empty: [1, L, D],
    the embedding of "". `base` trains as a klein base model: shifted logit-normal sigmas, and ""
    in place of PROMPT_DROPOUT of the prompts, so that the model also predicts without one
    (classifier-free guidance); otherwise dit_sigmas and every prompt. `compiled` is the
    torch.compile'd model, when it runs the steps."""
    generator = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    img_ids = Flux2KleinPipeline._prepare_latent_ids(latents[:1]).expand(batch, -1, -1)
    txt_ids = Flux2KleinPipeline._prepare_text_ids(embeds[:1]).expand(batch, -1, -1)
    shift = inference_shift(latents.shape[2] * latents.shape[3])
    forward = model if compiled is None else compiled
    model.train()
    average = None
    while phase.running():
        for group in opt.param_groups:
            group["lr"] = cosine_lr(lr, phase)
        idx = torch.randint(len(latents), (batch,), generator=generator)
        x0 = Flux2KleinPipeline._pack_latents(latents[idx])
        noise = torch.randn(x0.shape, generator=generator)
        sigma = shifted_logit_normal(batch, generator, shift) if base else dit_sigmas(batch, generator)
        s = sigma.view(-1, 1, 1)
        dropped = (torch.rand(batch, generator=generator) < (PROMPT_DROPOUT if base else 0.0)).view(-1, 1, 1)
        prompt_embeds = torch.where(dropped, empty, embeds[idx]).float()
        pred = forward(hidden_states=(1 - s) * x0 + s * noise, encoder_hidden_states=prompt_embeds,
                       timestep=sigma, img_ids=img_ids, txt_ids=txt_ids, guidance=None, return_dict=False)[0]
        loss = F.mse_loss(pred, noise - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema.update(model)
        average = loss.item() if average is None else 0.98 * average + 0.02 * loss.item()
        if phase.step % 100 == 0:
            rate = (time.time() - phase.start) / (phase.step + 1)
            log(f"{phase.name} step {phase.step}: loss {loss.item():.4f} (average {average:.4f}), {rate:.2f}s/step")
        phase.step += 1
    return phase.done()


def folder_size(folder):
    return sum(p.stat().st_size for p in pathlib.Path(folder).rglob("*") if p.is_file())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "models/shapes-demo"))
    parser.add_argument("--size", type=int, default=64, help="picture side in pixels (multiple of 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=16384, help="size of the fixed training set")
    parser.add_argument("--text-len", type=int, default=40,
                        help="prompt padding (a grammar prompt is at most 33 tokens); saved as the tokenizer's "
                             "model_max_length")
    parser.add_argument("--batch-vae", type=int, default=16)
    parser.add_argument("--batch-dit", type=int, default=32, help="batch of the dit and tune phases")
    parser.add_argument("--lr-dit", type=float, default=5e-4)
    parser.add_argument("--ema", type=float, default=0.999, help="decay of the saved weights' moving average")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="run the transformer steps through torch.compile (~1.4x faster on the CPU)")
    budgets = {"vae": 19.0, "dit": 32.0, "tune": 16.0, "retune": 18.0}
    for phase, minutes in budgets.items():
        parser.add_argument(f"--minutes-{phase}", type=float, default=minutes, help=f"time box of the {phase} phase")
        parser.add_argument(f"--steps-{phase}", type=int, default=None,
                            help=f"stop the {phase} phase after this many steps (with a generous --minutes-{phase}, "
                                 "a run that does not depend on the machine's speed)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--smoke", action="store_true", help="a few steps per phase, a tiny data set")
    parser.add_argument("--from", dest="start", metavar="DIR",
                        help="continue this saved model with one more retune cycle (phases 2 to 4 skipped)")
    args = parser.parse_args()
    if args.size % 8:
        parser.error("--size must be a multiple of 8")
    if args.start and pathlib.Path(args.start).resolve() == pathlib.Path(args.out).resolve():
        parser.error("--from and --out must be different folders: the model is saved while its files are read")

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)

    def phase(name):
        given = getattr(args, f"steps_{name}")
        steps = given if given is not None else (3 if args.smoke else 10 ** 9)
        return Phase(name, getattr(args, f"minutes_{name}"), steps)

    samples = 64 if args.smoke else args.samples
    t0 = time.time()

    # Data: a fixed, seeded set of (prompt, picture) from the training split.
    train_attrs, held = shapes.split()
    data = [shapes.sample(i, args.seed, train_attrs) for i in range(samples)]
    prompts = [prompt for prompt, _, _ in data]
    pictures = np.stack([shapes.render(attrs, args.size, s) for _, attrs, s in data])
    images = torch.from_numpy(pictures).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    log(f"data: {samples} samples ({len(set(prompts))} prompts) at {args.size}px; "
        f"{len(train_attrs)} train / {len(held)} held-out prompts in the grammar")

    if args.start:
        start = Flux2KleinPipeline.from_pretrained(args.start)
        tokenizer, text_encoder, vae, transformer = start.tokenizer, start.text_encoder, start.vae, start.transformer
        earlier = json.loads((pathlib.Path(args.start) / "training.json").read_text())
        if (earlier["seed"], earlier["size"], earlier["samples"]) != (args.seed, args.size, samples):
            parser.error(f"--from {args.start}: trained with seed {earlier['seed']}, size {earlier['size']} and "
                         f"{earlier['samples']} samples; pass the same --seed, --size and --samples")
        args.text_len = tokenizer.model_max_length
        log(f"continuing {args.start}: {earlier.get('retune_cycles', 1)} retune cycle(s) so far")
    else:
        tokenizer = build_tokenizer(args.seed)
        text_encoder = build_text_encoder(len(tokenizer), args.seed + 1)
        torch.manual_seed(args.seed + 2)
        vae = build_vae(args.size)
        torch.manual_seed(args.seed + 3)
        transformer = build_transformer()
        earlier = None
    log(f"parameters: text encoder {count(text_encoder):,}, vae {count(vae):,}, transformer {count(transformer):,}")

    def encode(subset, length):
        unique = sorted(set(subset))
        cache = encode_prompts(text_encoder, tokenizer, unique, length)
        row = {p: i for i, p in enumerate(unique)}
        log(f"text: {len(unique)} prompts encoded to {tuple(cache.shape)}")
        return cache[torch.tensor([row[p] for p in subset])]

    embeds = encode(prompts, args.text_len)
    empty = encode_prompts(text_encoder, tokenizer, [""], args.text_len)

    if earlier is None:
        vae, vae_steps = train_vae(vae, images, phase("vae"), 8 if args.smoke else args.batch_vae, args.seed + 4)
        latents = encode_latents(vae, images)
        set_bn_statistics(vae, latents)
    else:
        latents = encode_latents(vae.eval(), images)
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    normalised = (latents - mean) / std
    log(f"latents {tuple(latents.shape)}: bn mean |.| {mean.abs().mean():.3f}, std {std.mean():.3f}")

    ema = Ema(transformer, args.ema)
    compiled = torch.compile(transformer, dynamic=False) if args.compile else None
    batch_dit = 8 if args.smoke else args.batch_dit
    if earlier is None:
        dit_steps = train_dit(transformer, ema, normalised, embeds, empty, phase("dit"), batch_dit, args.seed + 5,
                              args.lr_dit, False, compiled)
        tune_steps = train_dit(transformer, ema, normalised, embeds, empty, phase("tune"), batch_dit,
                               args.seed + 6, args.lr_dit, True, compiled)
    cycles = 1 if earlier is None else earlier.get("retune_cycles", 1) + 1
    retune_steps = train_dit(transformer, ema, normalised, embeds, empty, phase("retune"), batch_dit,
                             args.seed + 6 + cycles, args.lr_dit / 2, True, compiled)

    tokenizer.model_max_length = args.text_len

    pipeline = Flux2KleinPipeline(scheduler=reference_flux2.scheduler(), vae=vae, text_encoder=text_encoder,
                                  tokenizer=tokenizer, transformer=ema.model, is_distilled=False)
    out = pathlib.Path(args.out)
    pipeline.save_pretrained(out, safe_serialization=True)
    info = {"seed": args.seed, "size": args.size, "samples": samples,
            "text_len": args.text_len, "smoke": args.smoke, "held_out_fraction": 0.1,
            "batch": {"vae": args.batch_vae, "dit": args.batch_dit},
            "lr_dit": args.lr_dit, "ema": args.ema, "compile": args.compile,
            "seconds": round(time.time() - t0), "threads": args.threads, "retune_cycles": cycles,
            "versions": {"torch": torch.__version__, "diffusers": __import__("diffusers").__version__}}
    if earlier is None:
        info["minutes"] = {name: getattr(args, f"minutes_{name}") for name in budgets}
        info["steps"] = {"vae": vae_steps, "dit": dit_steps, "tune": tune_steps, "retune": retune_steps}
    else:
        info["minutes"] = {"retune": args.minutes_retune}
        info["steps"] = {"retune": retune_steps}
        info["continues"] = earlier
    (out / "training.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    size = folder_size(out)
    log(f"saved {out}: {size / 1e6:.2f} MB ({'OK' if size <= 20 * 10 ** 6 else 'OVER 20 MB'}), "
        f"{info['seconds'] / 60:.1f} minutes in all")


if __name__ == "__main__":
    main()
