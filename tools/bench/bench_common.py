"""Shared pieces of the diffusers-side CPU benchmark scripts (tools/bench/*_make_model.py, *_diffusers.py).

Model making: Qwen3-4B-width configs, deterministic random bf16 weights, saving and bookkeeping.
Timing: one process loads a diffusers pipeline, times warmup + timed calls with the same definitions as
xdit's timings.json (see tools/bench/README.md), optionally profiles one transformer forward, and writes
a JSON result.

Measured, with the same definitions as xdit's timings.json:
  load_s                 <Pipeline>.from_pretrained(MODEL_DIR, dtype=bfloat16)
  time_to_first_image_s  load_s + the first full pipeline call (the first warmup call if --warmup > 0)
  import_s, process_to_first_image_s  Python start-up and imports; from the script's first line to the
                         first image (includes import_s)
  per call ("iterations", one entry per timed call after the warmup calls):
    text_encode_s  pipe.encode_prompt (chat template, tokenizer, text-encoder forward, the family's selection)
    step_s         per denoising step: from the start of the transformer forward of step i (for i = 0)
                   or the end of step i-1, to the end of step i (transformer + scheduler step)
    transformer_s  the transformer forward alone, per step
    denoise_s      sum of step_s
    vae_decode_s   the vae.decode call alone (not the latent de-normalisation, not the PIL conversion)
    total_s        the whole pipe(...) call, returning a PIL image
  median           the median of each of those over the timed calls (step_s: median over all steps of
                   all timed calls)
  peak_rss_bytes   resource.getrusage(RUSAGE_SELF).ru_maxrss at the end
  <family keys>  what the family script adds (e.g. text_encoder_out_layers, caption_tokens)
The decoded image is checked for NaN/Inf (image_finite in the JSON).

--profile runs one more transformer forward (with the inputs of the last step) under torch.profiler
and prints the top operators by self CPU time (also written next to --out as *.profile.txt).

Import this module first in a script: T_START (for process_to_first_image_s) is taken at its import, and
torch / diffusers / transformers are imported lazily, after the thread count is set.
"""
import time

T_START = time.perf_counter()

import argparse
import json
import os
import resource
import shutil
import statistics
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "models")


# ---------------------------------------------------------------------------------------------------
# Model making


def qwen3_config(num_layers, architecture):
    """A transformers Qwen3Config with the Qwen3-4B widths (hidden 2560, 32 heads / 8 KV heads of 128,
    FFN 9728, vocab 151936, RoPE theta 1e6, tied embeddings) and num_layers layers."""
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
        architectures=[architecture],
    )


def random_state(model, gen):
    """Deterministic bf16 tensors for every persistent entry of model.state_dict() (in name order):
    matrices, convolution kernels, embeddings and learned pad tokens N(0, 0.02); norm weights ones;
    biases zeros; BatchNorm statistics mildly non-trivial (mean N(0, 0.05), var 1 + 0.1|N|)."""
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
        elif len(shape) >= 2:  # linear, conv, embedding, pad tokens
            t.normal_(0.0, 0.02, generator=gen)
        else:  # RMSNorm / GroupNorm / LayerNorm weights
            t.fill_(1.0)
        out[name] = t
    return out


def build(factory, gen):
    """Build a model on the meta device (no init cost), then assign deterministic random weights."""
    import torch

    with torch.device("meta"):
        model = factory()
    model.load_state_dict(random_state(model, gen), strict=True, assign=True)
    return model.to(torch.bfloat16)


def save_component(model, out_dir, name):
    """save_pretrained(out_dir/name) as safetensors; returns the parameter count. Non-persistent buffers
    (RoPE inv_freq) are still on the meta device: they are not saved and from_pretrained recomputes them."""
    import torch
    from transformers import PreTrainedModel

    if isinstance(model, PreTrainedModel):
        model.config.dtype = torch.bfloat16
    model.save_pretrained(os.path.join(out_dir, name), safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def copy_fixture(fixture, out_dir, subfolders):
    """Copy subfolders (tokenizer, scheduler, ...) of tests/fixtures/models/<fixture> into out_dir."""
    for sub in subfolders:
        dst = os.path.join(out_dir, sub)
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(os.path.join(FIXTURES, fixture, sub), dst)


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")


def finish_model(out_dir, t0, pipeline_class, model_index, info):
    """Write model_index.json (pipeline_class + model_index's entries) and bench_info.json (info, whose
    "params" maps component names to parameter counts), check the scheduler loads, and print a summary."""
    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler

    FlowMatchEulerDiscreteScheduler.from_pretrained(os.path.join(out_dir, "scheduler"))  # sanity
    write_json(os.path.join(out_dir, "model_index.json"),
               {"_class_name": pipeline_class, "_diffusers_version": diffusers.__version__, **model_index})
    write_json(os.path.join(out_dir, "bench_info.json"), info)
    size = sum(os.path.getsize(os.path.join(d, n)) for d, _, ns in os.walk(out_dir) for n in ns)
    counts = ", ".join(f"{k} {v / 1e6:.1f}M" for k, v in info["params"].items())
    print(f"wrote {out_dir}: {size / 1e9:.2f} GB on disk, params {counts} ({time.perf_counter() - t0:.1f} s)")


# ---------------------------------------------------------------------------------------------------
# Timing


def arg_parser(doc):
    """The options every *_diffusers.py script takes; the script adds its own."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=3, help="timed pipeline calls")
    ap.add_argument("--warmup", type=int, default=1, help="untimed pipeline calls before the timed ones")
    ap.add_argument("--height", type=int, default=512)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--prompt", default="a red fox in the snow")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="diffusers_result.json")
    ap.add_argument("--image", default=None, help="save the first image here (PNG)")
    ap.add_argument("--profile", action="store_true", help="profile one transformer forward")
    return ap


def setup_threads(threads):
    """Set the thread count before torch spins up its pools; returns the torch module."""
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(threads))
    import torch

    torch.set_num_threads(threads)
    return torch


def _versions():
    return {m: __import__(m).__version__ for m in ("diffusers", "torch", "transformers")}


class _Instruments:
    """Wrappers and hooks on a loaded pipeline that fill one record per pipeline call:
    encode_prompt and vae.decode times, transformer forward start/end stamps, step-end stamps."""

    def __init__(self, pipe, torch, keep_inputs):
        self.rec = {}
        self.last_inputs = {}
        rec, last_inputs = self.rec, self.last_inputs
        orig_encode, orig_decode = pipe.encode_prompt, pipe.vae.decode

        def timed_encode(*a, **kw):
            s = time.perf_counter()
            r = orig_encode(*a, **kw)
            rec["text_encode_s"] = rec.get("text_encode_s", 0.0) + time.perf_counter() - s
            rec["encode_out"] = r
            return r

        def timed_decode(*a, **kw):
            s = time.perf_counter()
            r = orig_decode(*a, **kw)
            rec["vae_decode_s"] = rec.get("vae_decode_s", 0.0) + time.perf_counter() - s
            img = r[0] if isinstance(r, tuple) else r.sample
            rec["image_finite"] = bool(torch.isfinite(img).all())
            rec["image_absmax"] = float(img.float().abs().max())
            return r

        def pre_hook(module, a, kw):
            rec.setdefault("fwd_start", []).append(time.perf_counter())
            if keep_inputs:
                last_inputs["args"], last_inputs["kwargs"] = a, kw

        def post_hook(module, a, kw, out):
            rec.setdefault("fwd_end", []).append(time.perf_counter())

        pipe.encode_prompt = timed_encode
        pipe.vae.decode = timed_decode
        pipe.transformer.register_forward_pre_hook(pre_hook, with_kwargs=True)
        pipe.transformer.register_forward_hook(post_hook, with_kwargs=True)

    def on_step_end(self, p, i, t, kw):
        self.rec.setdefault("step_end", []).append(time.perf_counter())
        return kw


def run(args, pipeline_cls, call_kwargs, result_extra=None, describe_encode=None):
    """Load pipeline_cls from args.model_dir (bf16), run args.warmup + args.iterations calls of
    pipe(prompt, height, width, num_inference_steps, generator, callback_on_step_end, **call_kwargs),
    write the JSON result to args.out and return the exit status (1 if the image has NaN/Inf).

    result_extra: keys added to the result. describe_encode(encode_prompt's return value) -> dict of
    per-call facts (e.g. the caption length), added to each call's record and, from the first call, to
    the result."""
    import torch
    from diffusers.utils import logging as dlogging

    dlogging.disable_progress_bar()
    import_s = time.perf_counter() - T_START
    t0 = time.perf_counter()
    pipe = pipeline_cls.from_pretrained(args.model_dir, dtype=torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    load_s = time.perf_counter() - t0

    ins = _Instruments(pipe, torch, args.profile)
    rec = ins.rec

    def call():
        rec.clear()
        gen = torch.Generator(device="cpu").manual_seed(args.seed)
        s = time.perf_counter()
        out = pipe(prompt=args.prompt, height=args.height, width=args.width, num_inference_steps=args.steps,
                   generator=gen, callback_on_step_end=ins.on_step_end, **call_kwargs)
        total = time.perf_counter() - s
        starts, ends, cbs = rec["fwd_start"], rec["fwd_end"], rec["step_end"]
        assert len(starts) == len(ends) == len(cbs) == args.steps, (len(starts), len(ends), len(cbs))
        marks = [starts[0]] + cbs
        steps = [marks[i + 1] - marks[i] for i in range(args.steps)]
        it = {
            "text_encode_s": rec["text_encode_s"],
            "denoise_s": sum(steps),
            "step_s": steps,
            "transformer_s": [e - b for b, e in zip(starts, ends)],
            "vae_decode_s": rec["vae_decode_s"],
            "total_s": total,
            "image_finite": rec["image_finite"],
            "image_absmax": rec["image_absmax"],
        }
        if describe_encode:
            it.update(describe_encode(rec["encode_out"]))
        return it, out.images[0]

    versions = _versions()
    print(f"diffusers {versions['diffusers']}, torch {versions['torch']}, threads {torch.get_num_threads()}, "
          f"load {load_s:.2f} s", file=sys.stderr)
    first_image_s = process_to_first_image_s = None
    warm, timed = [], []
    for k in range(args.warmup + args.iterations):
        it, image = call()
        if first_image_s is None:
            first_image_s = load_s + it["total_s"]
            process_to_first_image_s = time.perf_counter() - T_START
            if args.image:
                image.save(args.image)
        (warm if k < args.warmup else timed).append(it)
        kind = "warmup" if k < args.warmup else "timed"
        print(f"  {kind} call {k}: text {it['text_encode_s']:.2f} s, steps "
              + ", ".join(f"{x:.2f}" for x in it["step_s"])
              + f" s, vae {it['vae_decode_s']:.2f} s, total {it['total_s']:.2f} s, finite {it['image_finite']}",
              file=sys.stderr)

    def med(key):
        return statistics.median(it[key] for it in timed)

    def med_all(key):
        return statistics.median(s for it in timed for s in it[key])

    result = {
        "engine": "diffusers",
        "pipeline": pipeline_cls.__name__,
        "versions": versions,
        "threads": torch.get_num_threads(),
        "model_dir": os.path.abspath(args.model_dir),
        "prompt": args.prompt,
        "height": args.height,
        "width": args.width,
        "steps": args.steps,
        **(result_extra or {}),
        **({k: v for k, v in (warm + timed)[0].items() if describe_encode and k not in _CALL_KEYS}),
        "load_s": load_s,
        "time_to_first_image_s": first_image_s,
        "import_s": import_s,
        "process_to_first_image_s": process_to_first_image_s,
        "warmup": warm,
        "iterations": timed,
        "median": {
            "text_encode_s": med("text_encode_s"),
            "step_s": med_all("step_s"),
            "transformer_s": med_all("transformer_s"),
            "denoise_s": med("denoise_s"),
            "vae_decode_s": med("vae_decode_s"),
            "total_s": med("total_s"),
        },
        "image_finite": all(it["image_finite"] for it in warm + timed),
    }

    if args.profile and ins.last_inputs:
        from torch.profiler import ProfilerActivity, profile

        with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
            pipe.transformer(*ins.last_inputs["args"], **ins.last_inputs["kwargs"])
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        print("torch.profiler, one transformer forward, top operators by self CPU time:")
        print(table)
        with open(os.path.splitext(args.out)[0] + ".profile.txt", "w") as f:
            f.write(table + "\n")

    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    write_json(args.out, result)
    m = result["median"]
    print(f"diffusers: load {load_s:.2f} s, first image {first_image_s:.2f} s, median text {m['text_encode_s']:.2f} s, "
          f"step {m['step_s']:.2f} s, vae {m['vae_decode_s']:.2f} s, total {m['total_s']:.2f} s, "
          f"peak RSS {result['peak_rss_bytes'] / 2**30:.2f} GiB -> {args.out}", file=sys.stderr)
    if not result["image_finite"]:
        print("error: the decoded image has NaN/Inf", file=sys.stderr)
        return 1
    return 0


# The keys every call record has; describe_encode's keys are the others.
_CALL_KEYS = {"text_encode_s", "denoise_s", "step_s", "transformer_s", "vae_decode_s", "total_s", "image_finite",
              "image_absmax"}


def read_bench_info(model_dir):
    """MODEL_DIR/bench_info.json as written by the *_make_model.py scripts ({} if absent)."""
    path = os.path.join(model_dir, "bench_info.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)
