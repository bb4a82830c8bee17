#!/usr/bin/env python3
"""Time diffusers' Flux2KleinPipeline on CPU (bf16), in one process, for the xdit-vs-diffusers benchmark.

Usage: flux2_diffusers.py MODEL_DIR [--threads 2] [--steps 4] [--iterations 3] [--warmup 1]
                          [--out result.json] [--profile] [--image out.png]

Measured, with the same definitions as xdit's timings.json:
  load_s                 Flux2KleinPipeline.from_pretrained(MODEL_DIR, dtype=bfloat16)
  time_to_first_image_s  load_s + the first full pipeline call (the first warmup call if --warmup > 0)
  import_s, process_to_first_image_s  Python start-up and imports; from the script's first line to the
                         first image (includes import_s)
  per call ("iterations", one entry per timed call after the warmup calls):
    text_encode_s  pipe.encode_prompt (tokenizer + Qwen3 forward + stacking the tapped hidden states)
    step_s         per denoising step: from the start of the transformer forward of step i (for i = 0)
                   or the end of step i-1, to the end of step i (transformer + scheduler step)
    transformer_s  the transformer forward alone, per step
    denoise_s      sum of step_s
    vae_decode_s   the vae.decode call alone (not the BatchNorm de-normalisation, not the PIL conversion)
    total_s        the whole pipe(...) call, returning a PIL image
  median           the median of each of those over the timed calls (step_s: median over all steps of
                   all timed calls)
  peak_rss_bytes   resource.getrusage(RUSAGE_SELF).ru_maxrss at the end
The decoded image is checked for NaN/Inf (image_finite in the JSON).

--profile runs one more transformer forward (with the inputs of the last step) under torch.profiler
and prints the top operators by self CPU time (also written next to --out as *.profile.txt).
"""
import time

T_START = time.perf_counter()  # before torch/diffusers are imported: for process_to_first_image_s

import argparse
import json
import os
import resource
import statistics
import sys


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model_dir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=3, help="timed pipeline calls")
    ap.add_argument("--warmup", type=int, default=1, help="untimed pipeline calls before the timed ones")
    ap.add_argument("--height", type=int, default=512)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--prompt", default="a red fox in the snow")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--text_encoder_out_layers", default=None,
                    help="comma-separated Qwen3 hidden-state taps; default: bench_info.json's, else 9,18,27")
    ap.add_argument("--out", default="diffusers_result.json")
    ap.add_argument("--image", default=None, help="save the first image here (PNG)")
    ap.add_argument("--profile", action="store_true", help="profile one transformer forward")
    return ap.parse_args()


def main():
    args = parse_args()
    # Thread count first, before torch spins up its pools.
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(args.threads))
    import torch

    torch.set_num_threads(args.threads)
    from diffusers import Flux2KleinPipeline
    from diffusers.utils import logging as dlogging

    dlogging.disable_progress_bar()

    if args.text_encoder_out_layers:
        taps = tuple(int(x) for x in args.text_encoder_out_layers.split(","))
    else:
        info_path = os.path.join(args.model_dir, "bench_info.json")
        taps = (9, 18, 27)
        if os.path.exists(info_path):
            with open(info_path) as f:
                taps = tuple(json.load(f)["text_encoder_out_layers"])

    import_s = time.perf_counter() - T_START
    t0 = time.perf_counter()
    pipe = Flux2KleinPipeline.from_pretrained(args.model_dir, dtype=torch.bfloat16)
    pipe.set_progress_bar_config(disable=True)
    load_s = time.perf_counter() - t0

    # Instrumentation: per-call records filled by wrappers and hooks.
    rec = {}

    orig_encode = pipe.encode_prompt

    def timed_encode(*a, **kw):
        s = time.perf_counter()
        r = orig_encode(*a, **kw)
        rec["text_encode_s"] = rec.get("text_encode_s", 0.0) + time.perf_counter() - s
        return r

    pipe.encode_prompt = timed_encode

    orig_decode = pipe.vae.decode

    def timed_decode(*a, **kw):
        s = time.perf_counter()
        r = orig_decode(*a, **kw)
        rec["vae_decode_s"] = rec.get("vae_decode_s", 0.0) + time.perf_counter() - s
        img = r[0] if isinstance(r, tuple) else r.sample
        rec["image_finite"] = bool(torch.isfinite(img).all())
        rec["image_absmax"] = float(img.float().abs().max())
        return r

    pipe.vae.decode = timed_decode

    last_inputs = {}

    def pre_hook(module, a, kw):
        rec.setdefault("fwd_start", []).append(time.perf_counter())
        if args.profile:
            last_inputs["args"], last_inputs["kwargs"] = a, kw

    def post_hook(module, a, kw, out):
        rec.setdefault("fwd_end", []).append(time.perf_counter())

    pipe.transformer.register_forward_pre_hook(pre_hook, with_kwargs=True)
    pipe.transformer.register_forward_hook(post_hook, with_kwargs=True)

    def on_step_end(p, i, t, kw):
        rec.setdefault("step_end", []).append(time.perf_counter())
        return kw

    def call():
        rec.clear()
        gen = torch.Generator(device="cpu").manual_seed(args.seed)
        s = time.perf_counter()
        out = pipe(
            prompt=args.prompt,
            height=args.height,
            width=args.width,
            num_inference_steps=args.steps,
            guidance_scale=1.0,
            generator=gen,
            max_sequence_length=512,
            text_encoder_out_layers=taps,
            callback_on_step_end=on_step_end,
        )
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
        return it, out.images[0]

    print(f"diffusers {__import__('diffusers').__version__}, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}, load {load_s:.2f} s", file=sys.stderr)
    first_image_s = None
    warm = []
    timed = []
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

    result = {
        "engine": "diffusers",
        "versions": {"diffusers": __import__("diffusers").__version__, "torch": torch.__version__,
                     "transformers": __import__("transformers").__version__},
        "threads": torch.get_num_threads(),
        "model_dir": os.path.abspath(args.model_dir),
        "prompt": args.prompt,
        "height": args.height,
        "width": args.width,
        "steps": args.steps,
        "text_encoder_out_layers": list(taps),
        "load_s": load_s,
        "time_to_first_image_s": first_image_s,
        "import_s": import_s,
        "process_to_first_image_s": process_to_first_image_s,
        "warmup": warm,
        "iterations": timed,
        "median": {
            "text_encode_s": med("text_encode_s"),
            "step_s": statistics.median(s for it in timed for s in it["step_s"]),
            "transformer_s": statistics.median(s for it in timed for s in it["transformer_s"]),
            "denoise_s": med("denoise_s"),
            "vae_decode_s": med("vae_decode_s"),
            "total_s": med("total_s"),
        },
        "image_finite": all(it["image_finite"] for it in warm + timed),
    }

    if args.profile and last_inputs:
        from torch.profiler import ProfilerActivity, profile

        with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
            pipe.transformer(*last_inputs["args"], **last_inputs["kwargs"])
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        print("torch.profiler, one transformer forward, top operators by self CPU time:")
        print(table)
        with open(os.path.splitext(args.out)[0] + ".profile.txt", "w") as f:
            f.write(table + "\n")

    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    m = result["median"]
    print(f"diffusers: load {load_s:.2f} s, first image {first_image_s:.2f} s, median text {m['text_encode_s']:.2f} s, "
          f"step {m['step_s']:.2f} s, vae {m['vae_decode_s']:.2f} s, total {m['total_s']:.2f} s, "
          f"peak RSS {result['peak_rss_bytes'] / 2**30:.2f} GiB -> {args.out}", file=sys.stderr)
    if not result["image_finite"]:
        print("error: the decoded image has NaN/Inf", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
