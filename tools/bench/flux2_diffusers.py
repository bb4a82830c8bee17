#!/usr/bin/env python3
"""Time diffusers' Flux2KleinPipeline on CPU (bf16), in one process, for the xdit-vs-diffusers benchmark.

Usage: flux2_diffusers.py MODEL_DIR [--threads 2] [--steps 4] [--iterations 3] [--warmup 1]
                          [--text_encoder_out_layers 1,2,3] [--out result.json] [--profile] [--image out.png]

The call: guidance_scale=1.0 (klein is distilled), max_sequence_length=512, text_encoder_out_layers from
the option, else MODEL_DIR/bench_info.json, else (9, 18, 27).

What is measured and the JSON it writes: bench_common.py (the same definitions as xdit's timings.json).
Here text_encode_s is encode_prompt: tokenizer + Qwen3ForCausalLM forward (all layers and the LM head)
+ stacking the tapped hidden states.
"""

import bench_common as bc  # first: it starts the clock for process_to_first_image_s

import sys


def main():
    ap = bc.arg_parser(__doc__)
    ap.add_argument("--text_encoder_out_layers", default=None,
                    help="comma-separated Qwen3 hidden-state taps; default: bench_info.json's, else 9,18,27")
    args = ap.parse_args()
    bc.setup_threads(args.threads)
    from diffusers import Flux2KleinPipeline

    if args.text_encoder_out_layers:
        taps = tuple(int(x) for x in args.text_encoder_out_layers.split(","))
    else:
        taps = tuple(bc.read_bench_info(args.model_dir).get("text_encoder_out_layers", (9, 18, 27)))
    return bc.run(args, Flux2KleinPipeline,
                  dict(guidance_scale=1.0, max_sequence_length=512, text_encoder_out_layers=taps),
                  result_extra={"text_encoder_out_layers": list(taps)})


if __name__ == "__main__":
    sys.exit(main())
