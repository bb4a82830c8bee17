#!/usr/bin/env python3
"""Time diffusers' ZImagePipeline on CPU (bf16), in one process, for the xdit-vs-diffusers benchmark.

Usage: z_image_diffusers.py MODEL_DIR [--threads 2] [--steps 4] [--iterations 3] [--warmup 1]
                            [--guidance 0] [--out result.json] [--profile] [--image out.png]

The call, with the Z-Image-Turbo settings: guidance_scale=0 (no CFG: one transformer forward per step),
max_sequence_length=512. What is measured and the JSON it writes: bench_common.py (the same definitions
as xdit's timings.json). Here text_encode_s is encode_prompt: chat template, tokenizer (padded to 512),
the Qwen3Model forward over all its layers (the last one is wasted: the pipeline takes hidden_states[-2])
and keeping the valid tokens. The result also records caption_tokens, the number of valid caption tokens
the transformer receives (it pads them to a multiple of 32 itself).
"""
import bench_common as bc  # first: it starts the clock for process_to_first_image_s

import sys


def main():
    ap = bc.arg_parser(__doc__)
    ap.add_argument("--guidance", type=float, default=0.0, help="guidance_scale; > 0 runs CFG (two forwards a step)")
    args = ap.parse_args()
    bc.setup_threads(args.threads)
    from diffusers import ZImagePipeline

    def describe_encode(encoded):
        prompt_embeds = encoded[0]  # (prompt_embeds, negative_prompt_embeds): lists of [L, 2560] tensors
        return {"caption_tokens": int(prompt_embeds[0].shape[0])}

    return bc.run(args, ZImagePipeline, dict(guidance_scale=args.guidance, max_sequence_length=512),
                  result_extra={"guidance_scale": args.guidance}, describe_encode=describe_encode)


if __name__ == "__main__":
    sys.exit(main())
