"""Writes the fixtures of tests/e2e from the shapes grammar (shapes.py):

- tests/e2e/held_out_prompts.tsv: every held-out prompt (never seen in training) with its
  attributes, in a fixed pseudo-random order (by SHA-256 of the prompt), so any prefix is a
  balanced sample; the adherence test reads the first N;
- tests/e2e/fixtures/shapes_atlas.png and .tsv: ground-truth pictures drawn by shapes.render
  (8 per shape, 64 px tiles in rows of 8), on which the pixel classifier itself is checked;
- tests/e2e/fixtures/shapes_atlas_soft.png: the same tiles under a Gaussian blur of SOFT_BLUR px,
  about as soft as the pictures a model decodes, which the classifier must read right too.

    python tools/train_demo/make_e2e_fixtures.py
"""
import hashlib
import pathlib

import numpy as np
from PIL import Image, ImageFilter

import shapes

ROOT = pathlib.Path(__file__).resolve().parents[2]
E2E = ROOT / "tests/e2e"
COLUMNS = ("prompt", "shape", "colour", "background", "size", "position")
TILE = 64
PER_SHAPE = 8
SOFT_BLUR = 1.5


def ordered_held_out():
    _, held = shapes.split()
    return sorted(held, key=lambda a: hashlib.sha256(shapes.prompt_of(a).encode("utf-8")).digest())


def write_tsv(path, rows):
    lines = ["\t".join(COLUMNS)]
    lines += ["\t".join([shapes.prompt_of(a)] + [a[c] for c in COLUMNS[1:]]) for a in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main():
    held = ordered_held_out()
    write_tsv(E2E / "held_out_prompts.tsv", held)

    atlas_rows = [a for shape in shapes.SHAPES for a in [h for h in held if h["shape"] == shape][:PER_SHAPE]]
    tiles = [shapes.render(a, TILE, seed) for seed, a in enumerate(atlas_rows)]
    soft = [np.asarray(Image.fromarray(t).filter(ImageFilter.GaussianBlur(SOFT_BLUR))) for t in tiles]
    per_row = 8
    for name, pictures in (("shapes_atlas.png", tiles), ("shapes_atlas_soft.png", soft)):
        grid = np.concatenate([np.concatenate(pictures[i:i + per_row], axis=1)
                               for i in range(0, len(pictures), per_row)])
        Image.fromarray(grid).save(E2E / "fixtures" / name, optimize=True)
    write_tsv(E2E / "fixtures/shapes_atlas.tsv", atlas_rows)
    print(f"{len(held)} held-out prompts; atlas of {len(tiles)} tiles {grid.shape[1]}x{grid.shape[0]}")


if __name__ == "__main__":
    main()
