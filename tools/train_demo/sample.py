"""Loads a saved shapes-demo folder with Flux2KleinPipeline and draws prompts.

    python tools/train_demo/sample.py [--model models/shapes-demo] [--steps 50] [--guidance 4] [--size 64]
                                      [--max-sequence-length N] [--out DIR] [prompt ...]

Without prompts, draws the first few held-out grammar prompts. Prints each picture's mean colour
and the seconds its pipeline call took; with --out, writes PNGs there.
"""
import argparse
import pathlib
import sys
import time

import torch
from diffusers import Flux2KleinPipeline
from PIL import Image

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import shapes  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default=str(HERE.parents[1] / "models/shapes-demo"))
    parser.add_argument("--steps", type=int, default=50, help="klein base: the pipeline's default")
    parser.add_argument("--guidance", type=float, default=4.0, help="CFG scale against the empty prompt")
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-sequence-length", type=int, default=None,
                        help="prompt padding; default: the tokenizer's model_max_length (as xdit's default)")
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--out")
    parser.add_argument("prompts", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(2)
    prompts = args.prompts or [shapes.prompt_of(a) for a in shapes.split()[1][:args.count]]
    pipeline = Flux2KleinPipeline.from_pretrained(args.model, dtype=torch.float32)
    pipeline.set_progress_bar_config(disable=True)
    max_sequence_length = args.max_sequence_length or min(512, pipeline.tokenizer.model_max_length)
    for i, prompt in enumerate(prompts):
        start = time.perf_counter()
        with torch.no_grad():
            image = pipeline(prompt=prompt, height=args.size, width=args.size, num_inference_steps=args.steps,
                             guidance_scale=args.guidance, max_sequence_length=max_sequence_length,
                             generator=torch.Generator("cpu").manual_seed(args.seed), output_type="np").images[0]
        seconds = time.perf_counter() - start
        print(f"{prompt!r}: {image.shape}, mean rgb {(image.mean(axis=(0, 1)) * 255).round().tolist()}, {seconds:.2f} s")
        if args.out:
            folder = pathlib.Path(args.out)
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray((image * 255).round().clip(0, 255).astype("uint8")).save(folder / f"{i:02d}.png")


if __name__ == "__main__":
    main()
