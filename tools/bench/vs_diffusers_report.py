#!/usr/bin/env python3
"""The markdown report of bench/vs_diffusers: xdit's OUT/xdit/timings.json against the diffusers side's
OUT/diffusers.json, with the transformer's GFLOP/s per step as a share of the oneDNN bf16 matmul measured
in the same run (OUT/matmul_before.json, OUT/matmul_after.json).

Usage: vs_diffusers_report.py --family flux2|z-image --out OUT --model MODEL_DIR --cmdline TEXT
           --threads N --steps N --iterations N --warmup N --prompt TEXT --xdit-cmd TEXT
           --load-start TEXT --load-end TEXT [--height 512 --width 512] [--taps 1,2,3] [--reused xdit,diffusers]

Each family's FLOPs per step come from its transformer/config.json (see flops_flux2, flops_z_image).
Needs only the standard library, except z-image without a diffusers result, which counts the caption
tokens with transformers' tokenizer.
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def time_rss(path):
    """Maximum resident set size from /usr/bin/time -v, in bytes."""
    try:
        with open(path) as f:
            m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", f.read())
            return int(m.group(1)) * 1024 if m else None
    except OSError:
        return None


def matmul_gflops(path):
    """oneDNN reference GFLOP/s: the median aggregate (or the only run) of the packed bf16 case."""
    mm = load(path)
    if not mm:
        return None
    cands = [b for b in mm.get("benchmarks", []) if "GFLOP/s" in b]
    pick = [b for b in cands if b.get("aggregate_name") == "median"] or \
        [b for b in cands if b.get("run_type") != "aggregate"]
    return pick[0]["GFLOP/s"] if pick else None


# ---------------------------------------------------------------------------------------------------
# FLOPs of one transformer forward. Each returns (flops counted, flops left out, description, model line).


def flops_flux2(tc, height, width, facts):
    D = tc["num_attention_heads"] * tc["attention_head_dim"]
    F = int(tc["mlp_ratio"] * D)
    n_blocks = tc["num_layers"] + tc["num_single_layers"]
    s_img = (height // 16) * (width // 16)  # VAE 8x, then 2x2 patches
    s_txt = 512
    S = s_img + s_txt
    # Double block, both streams together: q,k,v,out (4 D^2) + SwiGLU in D->2F and out F->D (3 F D) per token.
    # Single block: qkv+mlp D->3D+2F, out D+F->D: the same 4 D^2 + 3 F D per token. With F = 3D: 13 D^2.
    gemm_block = 2 * S * (4 * D * D + 3 * F * D)  # = 26 D^2 S, MODELS.md
    attn_block = 4 * S * S * D  # QK^T and PV
    flops = n_blocks * (gemm_block + attn_block)
    cin, cout, jd = tc["in_channels"], tc.get("out_channels") or tc["in_channels"], tc["joint_attention_dim"]
    left_out = 2 * s_img * cin * D + 2 * s_txt * jd * D + 2 * s_img * D * cout  # x/context embedders, proj_out
    text = (f"FLOPs per step (one transformer forward, MODELS.md): {n_blocks} blocks x (26*D^2*S + 4*S^2*D) with "
            f"D = {D}, S = {s_txt} + {s_img} = {S}: {n_blocks} x ({gemm_block / 1e9:.1f} + {attn_block / 1e9:.1f}) = "
            f"{flops / 1e9:.1f} GFLOP. (26*D^2*S: per token q,k,v,out 4*D^2 plus SwiGLU 3*F*D with F = 3D, in both "
            f"the double and the single blocks; 4*S^2*D: QK^T and PV.) Not counted: the x/context embedders and "
            f"proj_out, {left_out / 1e9:.1f} GFLOP more, and the per-step modulation GEMVs. The step time includes "
            f"the scheduler step.")
    model = (f"random bf16 weights, hidden {D} = {tc['num_attention_heads']} x {tc['attention_head_dim']} (klein-4B: "
             f"3072), {tc['num_layers']} double + {tc['num_single_layers']} single blocks; {s_txt} text tokens; "
             f"text_encoder_out_layers {facts.get('taps')}")
    return flops, text, model


def pad32(n):
    return n + (-n) % 32


def flops_z_image(tc, height, width, facts):
    D, heads = tc["dim"], tc["n_heads"]
    assert tc["n_kv_heads"] == heads, "the count below assumes full-width K and V"
    F = int(D / 3 * 8)  # FeedForward hidden width, as the class computes it
    p = tc["all_patch_size"][0]
    s_img = pad32((height // (8 * p)) * (width // (8 * p)))  # VAE 8x, then p x p patches; padded to 32
    cap = facts.get("caption_tokens")
    L, R = tc["n_layers"], tc["n_refiner_layers"]

    def block(S):  # q,k,v,out 4*D^2 + SwiGLU w1,w3,w2 3*F*D per token (x2 FLOPs per MAC), + QK^T and PV
        return 2 * S * (4 * D * D + 3 * F * D), 4 * S * S * D

    if cap is None:
        return None, "FLOPs per step: n/a (the caption length is unknown).", \
            f"random bf16 weights, dim {D}, {L} main + {R} + {R} refiner blocks"
    s_cap = pad32(cap)
    S = s_img + s_cap
    g_m, a_m = block(S)
    g_n, a_n = block(s_img)
    g_c, a_c = block(s_cap)
    flops = L * (g_m + a_m) + R * (g_n + a_n) + R * (g_c + a_c)
    cin = tc["in_channels"] * p * p
    left_out = 2 * s_img * cin * D + 2 * s_cap * tc["cap_feat_dim"] * D + 2 * S * D * cin  # embedders, final layer
    text = (f"FLOPs per step (one transformer forward): per block 2*S*(4*D^2 + 3*F*D) (GEMMs: q,k,v,out and the "
            f"SwiGLU w1,w3,w2; with F = 8D/3 that is 24*D^2*S) + 4*S^2*D (QK^T and PV), D = {D}, F = {F}. "
            f"{L} main blocks on S = image {s_img} + caption {s_cap} ({cap} tokens padded to 32) = {S}: "
            f"{L} x ({g_m / 1e9:.1f} + {a_m / 1e9:.1f}); {R} noise-refiner block(s) on the {s_img} image tokens: "
            f"{R} x ({g_n / 1e9:.1f} + {a_n / 1e9:.1f}); {R} context-refiner block(s) on the {s_cap} caption "
            f"tokens: {R} x ({g_c / 1e9:.1f} + {a_c / 1e9:.2f}); total {flops / 1e9:.1f} GFLOP. Not counted: the "
            f"x/caption embedders and the final layer, {left_out / 1e9:.1f} GFLOP more, and the modulation GEMVs. "
            f"The step time includes the scheduler step.")
    model = (f"random bf16 weights, dim {D} = {heads} x {D // heads} (Z-Image: 3840), {L} main + {R} noise-refiner + {R} context-refiner "
             f"blocks; {cap} caption tokens (padded to {s_cap}); guidance 0 (no CFG)")
    return flops, text, model


def caption_tokens(model, prompt):
    """Valid caption tokens as ZImagePipeline._encode_prompt counts them (chat template, max 512)."""
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(os.path.join(model, "tokenizer"))
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=True)
        return min(len(tok(text).input_ids), 512)
    except Exception:  # no transformers, or no tokenizer: the FLOPs read n/a
        return None


FAMILIES = {"flux2": flops_flux2, "z-image": flops_z_image}


# ---------------------------------------------------------------------------------------------------


def med(doc, key):
    if not doc:
        return None
    m = doc.get("median", {})
    if key in m:
        return m[key]
    its = doc.get("iterations") or []
    vals = [v for it in its for v in (it[key] if isinstance(it.get(key), list) else [it.get(key)]) if v is not None]
    return statistics.median(vals) if vals else None


def top(doc, key):
    return doc.get(key) if doc else None


def fmt_s(v):
    return "n/a" if v is None else f"{v:.3f} s"


def fmt_b(v):
    return "n/a" if v is None else f"{v / 2**30:.2f} GiB"


def fmt_g(g):
    return "n/a" if g is None else f"{g:.1f}"


def ratio(a, b):
    return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def verdict(value, goal, text):
    return f"{text}: " + ("n/a" if value is None else ("met" if value >= goal else "short"))


def fastest_step(doc):
    vals = [v for it in (doc or {}).get("iterations", []) for v in it.get("step_s", [])]
    return min(vals) if vals else None


def machine():
    cpu = platform.processor() or ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        rev = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
    except OSError:
        rev = ""
    return cpu, rev


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("family", "out", "model", "cmdline", "threads", "steps", "iterations", "warmup", "prompt",
                 "xdit-cmd", "load-start", "load-end"):
        ap.add_argument("--" + name, required=True)
    ap.add_argument("--height", type=int, default=512)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--taps", default=None)
    ap.add_argument("--reused", default="", help="comma-separated sides whose result is from an earlier run")
    a = ap.parse_args()
    out = a.out

    x = load(os.path.join(out, "xdit", "timings.json"))
    d = load(os.path.join(out, "diffusers.json"))
    ref_runs = [matmul_gflops(os.path.join(out, f"matmul_{w}.json")) for w in ("before", "after")]
    ref = max((r for r in ref_runs if r), default=None)

    facts = {"taps": a.taps}
    if a.family == "z-image":
        facts["caption_tokens"] = (top(d, "caption_tokens") or top(x, "caption_tokens")
                                   or caption_tokens(a.model, a.prompt))
    tc = load(os.path.join(a.model, "transformer", "config.json"))
    flops_step, flops_text, model_line = FAMILIES[a.family](tc, a.height, a.width, facts)

    def gfs(step):
        return None if not step or not flops_step else flops_step / step / 1e9

    def rss(doc, timefile):
        if not doc:  # that side did not complete
            return None
        r = time_rss(os.path.join(out, timefile))
        return r if r is not None else top(doc, "peak_rss_bytes")

    cpu, rev = machine()
    print(f"```\n{a.cmdline}\n```")
    print()
    print(f"- machine: {cpu}, {os.cpu_count()} logical CPUs, {a.threads} threads on both sides (OMP_NUM_THREADS "
          f"and torch.set_num_threads); commit {rev or 'unknown'}")
    print(f"- model ({a.family}): {a.model} ({model_line}); {a.height}x{a.width}, {a.steps} steps, seed 0, "
          f"prompt \"{a.prompt}\"")
    if d:
        v = d.get("versions", {})
        print(f"- diffusers {v.get('diffusers')}, torch {v.get('torch')}, transformers {v.get('transformers')}")
    print(f"- {a.iterations} timed calls after {a.warmup} warmup call(s); medians. Time to first image = load + "
          f"the first call.")
    print(f"- xdit: `OMP_NUM_THREADS={a.threads} {a.xdit_cmd.strip()}`")
    print(f"- raw results: {out}; load average (1/5/15 min) {a.load_start} at the start, {a.load_end} at the end")
    print()
    print("| metric | xdit | diffusers | ratio | target |")
    print("|---|---|---|---|---|")
    rows = [
        ("time per denoising step (median)", "step_s", ">= 1.5x"),
        ("text encoding", "text_encode_s", ""),
        (f"VAE decode {a.height}x{a.width}", "vae_decode_s", ""),
        ("whole pipeline call (median)", "total_s", ""),
    ]
    for label, key, target in rows:
        xa, da = med(x, key), med(d, key)
        if target:
            target = verdict(None if not xa or da is None else da / xa, 1.5, target)
        print(f"| {label} | {fmt_s(xa)} | {fmt_s(da)} | {ratio(da, xa)} (diffusers/xdit) | {target} |")
    xa, da = fastest_step(x), fastest_step(d)
    print(f"| fastest denoising step (min; less sensitive to a shared machine) | {fmt_s(xa)} | {fmt_s(da)} | "
          f"{ratio(da, xa)} (diffusers/xdit) | |")
    for label, key in (("load", "load_s"), ("time to first image (incl. load)", "time_to_first_image_s")):
        xa, da = top(x, key), top(d, key)
        print(f"| {label} | {fmt_s(xa)} | {fmt_s(da)} | {ratio(da, xa)} (diffusers/xdit) | |")
    xa, da = rss(x, "xdit.time"), rss(d, "diffusers.time")
    print(f"| peak RSS (/usr/bin/time -v, else self-reported) | {fmt_b(xa)} | {fmt_b(da)} | {ratio(xa, da)} "
          f"(xdit/diffusers) | |")
    gx, gd = gfs(med(x, "step_s")), gfs(med(d, "step_s"))

    def pct(g):
        return "n/a" if g is None or not ref else f"{100 * g / ref:.0f}%"

    print(f"| transformer GFLOP/s per step | {fmt_g(gx)} | {fmt_g(gd)} | {ratio(gx, gd)} (xdit/diffusers) | |")
    print(f"| ... as % of oneDNN bf16 matmul ({fmt_g(ref)} GFLOP/s) | {pct(gx)} | {pct(gd)} | | "
          f"{verdict(None if gx is None or not ref else gx / ref, 0.7, 'xdit >= 70%')} |")
    print()
    print(flops_text)
    print("The reference is bench_matmul bf16/1024x3072x3072/onednn_packed (median of 3) in this same run, "
          "before and after the engines: " + " / ".join("n/a" if r is None else f"{r:.1f}" for r in ref_runs)
          + " GFLOP/s; the higher one is used.")
    if d and d.get("import_s") is not None:
        print(f"diffusers' Python start-up and imports took {d['import_s']:.1f} s before the load (not in its time "
              f"to first image); process start to first image: {d['process_to_first_image_s']:.1f} s.")
    xl = [it.get("load_s") for it in (x or {}).get("iterations", []) if it.get("load_s") is not None]
    if xl:
        print(f"xdit's per-call total_s includes that call's load_s (median over timed calls "
              f"{statistics.median(xl):.3f} s); diffusers loads once, before the calls.")
    stages = [it.get("peak_rss_bytes_after") for it in (x or {}).get("iterations", []) if it.get("peak_rss_bytes_after")]
    if stages:
        print("xdit's process peak RSS (ru_maxrss, so cumulative, warmup calls included) at the end of each "
              "stage of the first timed call: " + ", ".join(f"{k} {fmt_b(v)}" for k, v in stages[0].items()) + ".")
    for side in filter(None, a.reused.split(",")):
        print(f"\nwarning: the {side} column is an earlier run's result kept in {out} (that side was skipped in this "
              f"run): the machine's load and the oneDNN reference were not the same for both columns.")
    if d and not d.get("image_finite", True):
        print("\nwarning: diffusers' decoded image has NaN/Inf")
    if x is None:
        print("\nxdit: skipped, or no timings.json (see the run's log); its column is n/a.")
    if d is None:
        print("\ndiffusers: skipped, or no result (see the run's log); its column is n/a.")


if __name__ == "__main__":
    main()
