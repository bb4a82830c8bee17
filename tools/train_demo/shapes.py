"""The shapes-demo dataset: a prompt grammar and a renderer that draws the matching picture.

A sample is a set of attributes (shape, shape colour, background colour, size, position); the
prompt is their sentence, e.g. "a small yellow triangle in the top left on a blue background",
and the picture is drawn with PIL, deterministically from a seed (the seed only jitters the
exact size and placement inside the named cell). `attributes_of(prompt)` parses a prompt back into
its attributes, the ground truth for a classifier that checks what a model draws.
"""
import hashlib
import random

import numpy as np
from PIL import Image, ImageDraw

SHAPES = ["circle", "square", "triangle", "diamond", "cross", "star"]
COLOURS = {
    "red": (220, 40, 40), "green": (40, 170, 60), "blue": (40, 80, 220), "yellow": (240, 210, 40),
    "purple": (140, 60, 180), "orange": (245, 140, 30), "white": (245, 245, 245), "black": (20, 20, 20),
}
# Shape extent as a fraction of the side: 24, 30 and 36 px at 64 px. The VAE's latent pixel is 4 px,
# and the points of a smaller star or diamond fall inside one: at 19 px the previous demo VAE kept
# almost no small star recognisable (tools/train_demo/README.md).
SIZES = {"small": 0.38, "medium": 0.47, "large": 0.56}
ROWS = ["top", "middle", "bottom"]
COLUMNS = ["left", "center", "right"]
POSITIONS = [f"{r} {c}" for r in ROWS for c in COLUMNS]  # "middle center" is said "center"
OMIT_SIZE = 0.2  # how often a training prompt leaves the size unsaid
OMIT_POSITION = 0.2  # and the position


def position_phrase(position):
    return "in the center" if position == "middle center" else f"in the {position}"


def _article(word):
    return "an" if word[0] in "aeiou" else "a"


def prompt_of(attrs):
    """The sentence of `attrs`; a size or position of None is left unsaid."""
    background = attrs["background"]
    size = f"{attrs['size']} " if attrs.get("size") else ""
    where = f" {position_phrase(attrs['position'])}" if attrs.get("position") else ""
    return f"a {size}{attrs['colour']} {attrs['shape']}{where} on {_article(background)} {background} background"


def attributes_of(prompt):
    """The attributes of a grammar prompt (inverse of prompt_of); an unsaid size or position is None."""
    head, background_phrase = prompt.split(" on ", 1)
    where = None
    if " in the " in head:
        head, where = head.split(" in the ", 1)
    words = head.split()  # a [SIZE] COLOUR SHAPE
    size = words[1] if len(words) == 4 else None
    colour, shape = words[-2], words[-1]
    position = None if where is None else ("middle center" if where == "center" else where)
    background = background_phrase.split()[1]
    return {"shape": shape, "colour": colour, "background": background, "size": size, "position": position}


def all_attributes():
    """Every valid combination (shape colour != background colour), in a fixed order."""
    out = []
    for shape in SHAPES:
        for colour in COLOURS:
            for background in COLOURS:
                if background == colour:
                    continue
                for size in SIZES:
                    for position in POSITIONS:
                        out.append({"shape": shape, "colour": colour, "background": background,
                                    "size": size, "position": position})
    return out


def is_held_out(prompt, fraction=0.1):
    """The held-out split: a prompt is held out when its SHA-256 falls in the first `fraction`."""
    value = int.from_bytes(hashlib.sha256(prompt.encode("utf-8")).digest()[:8], "big")
    return value < fraction * 2 ** 64


def split(fraction=0.1):
    """(train, held_out) lists of attribute dicts."""
    train, held = [], []
    for attrs in all_attributes():
        (held if is_held_out(prompt_of(attrs), fraction) else train).append(attrs)
    return train, held


def _polygon(shape, cx, cy, r):
    if shape == "triangle":
        return [(cx, cy - r), (cx + r * 0.95, cy + r * 0.8), (cx - r * 0.95, cy + r * 0.8)]
    if shape == "diamond":
        return [(cx, cy - r), (cx + r, cy), (cx, cy + r), (cx - r, cy)]
    if shape == "star":
        points = []
        for k in range(10):
            radius = r if k % 2 == 0 else r * 0.45
            angle = np.pi / 2 + k * np.pi / 5
            points.append((cx + radius * np.cos(angle), cy - radius * np.sin(angle)))
        return points
    if shape == "cross":
        t = r * 0.38
        return [(cx - t, cy - r), (cx + t, cy - r), (cx + t, cy - t), (cx + r, cy - t), (cx + r, cy + t),
                (cx + t, cy + t), (cx + t, cy + r), (cx - t, cy + r), (cx - t, cy + t), (cx - r, cy + t),
                (cx - r, cy - t), (cx - t, cy - t)]
    raise ValueError(shape)


def render(attrs, size=64, seed=0, supersample=4):
    """An RGB uint8 array [size, size, 3] of the attributes; `seed` jitters scale and placement
    within the named cell. Drawn at `supersample` x the size and reduced, for smooth edges."""
    rng = random.Random(seed)
    side = size * supersample
    image = Image.new("RGB", (side, side), COLOURS[attrs["background"]])
    draw = ImageDraw.Draw(image)
    r = SIZES[attrs["size"]] * side / 2 * rng.uniform(0.96, 1.04)
    row, column = attrs["position"].split()
    cell = side / 3
    cx = (COLUMNS.index(column) + 0.5) * cell + rng.uniform(-0.08, 0.08) * cell
    cy = (ROWS.index(row) + 0.5) * cell + rng.uniform(-0.08, 0.08) * cell
    # keep the shape inside the picture
    cx, cy = min(max(cx, r + 1), side - r - 1), min(max(cy, r + 1), side - r - 1)
    fill = COLOURS[attrs["colour"]]
    if attrs["shape"] == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif attrs["shape"] == "square":
        h = r * 0.85
        draw.rectangle([cx - h, cy - h, cx + h, cy + h], fill=fill)
    else:
        draw.polygon(_polygon(attrs["shape"], cx, cy, r), fill=fill)
    image = image.resize((size, size), Image.Resampling.LANCZOS)
    return np.asarray(image, dtype=np.uint8)


def sample(index, seed=0, attrs_list=None):
    """The index-th sample of a seeded stream: (prompt, attributes, render seed). The prompt leaves
    the size (probability OMIT_SIZE) or the position (OMIT_POSITION) unsaid at times, so a short
    prompt ("a red circle on a blue background") draws some size at some place."""
    attrs_list = attrs_list if attrs_list is not None else split()[0]
    rng = random.Random(f"{seed}:{index}")
    attrs = attrs_list[rng.randrange(len(attrs_list))]
    said = dict(attrs)
    if rng.random() < OMIT_SIZE:
        said["size"] = None
    if rng.random() < OMIT_POSITION:
        said["position"] = None
    return prompt_of(said), attrs, rng.randrange(2 ** 31)


if __name__ == "__main__":
    train, held = split()
    print(len(train), "train prompts,", len(held), "held out")
    for attrs in all_attributes():
        assert attributes_of(prompt_of(attrs)) == attrs, attrs
        short = {**attrs, "size": None, "position": None}
        assert attributes_of(prompt_of(short)) == short, short
    for i in range(4):
        prompt, attrs, s = sample(i)
        print(prompt, render(attrs, seed=s).mean(axis=(0, 1)).round(1))
