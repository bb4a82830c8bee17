#!/usr/bin/env python3
"""Writes tests/fixtures/reference/rng_torch_cpu.safetensors: torch.randn outputs from
torch.Generator("cpu").manual_seed(seed), which tests/unit/test_rng.cpp reproduces bit for bit.

Run with the reference venv (torch on an x86-64 CPU with AVX2 or AVX-512; see docs/rng.md):
    /work/venv-ref/bin/python tools/reference/make_rng_fixture.py

Each tensor is one draw, named "seed<S>.<case>.<i>": case <case> starts from a fresh generator
seeded with S and makes its draws in the order i = 0, 1, ...; the tensor's shape and dtype are
those of the draw. The file is written here rather than with the safetensors package so that it is
byte-for-byte deterministic: sorted keys, tensors in name order, no timestamps.
"""
import argparse
import json
import pathlib
import struct

import torch

SEEDS = [0, 1, 42, 2**32 + 5]
SIZES = [1, 15, 16, 17, 1000]
LATENT = (1, 32, 64, 64)
# The 131072-element latent costs 1 MB per seed in all three dtypes; two seeds keep the file
# small, and seed 2**32 + 5 also covers seeds above 32 bits.
LATENT_SEEDS = {0: ["f32", "bf16", "f16"], 2**32 + 5: ["f32"]}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}

# Successive draws from one generator: the tail recomputation of sizes that are not multiples
# of 16, the cached second Box-Muller sample of the small path surviving a large draw, and
# dtype changes mid-stream.
SEQUENCES = {
    "seq_17_1000": [(17, "f32"), (1000, "f32")],
    "seq_mixed": [(15, "f32"), (1000, "bf16"), (3, "f16"), (33, "f16"), (1, "bf16"), (17, "bf16"), (2, "f32")],
}
SEQUENCE_SEEDS = [0, 42]


def shape_label(shape):
    return "x".join(str(s) for s in shape)


def write_safetensors(path, tensors, metadata):
    header = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        blob = tensor.view(torch.uint8).numpy().tobytes()
        header[name] = {"dtype": SAFETENSORS_DTYPES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # keeps every tensor 8-byte aligned in the file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def draw_case(tensors, seed, case, draws):
    generator = torch.Generator("cpu").manual_seed(seed)
    for i, (shape, dtype) in enumerate(draws):
        tensors[f"seed{seed}.{case}.{i}"] = torch.randn(shape, generator=generator, dtype=DTYPES[dtype])


def main():
    root = pathlib.Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=pathlib.Path,
                        default=root / "tests/fixtures/reference/rng_torch_cpu.safetensors")
    args = parser.parse_args()

    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        raise SystemExit(f"torch runs its {capability} CPU kernels here; the fixture needs AVX2 or AVX512")

    tensors = {}
    for seed in SEEDS:
        for size in SIZES:
            for dtype in DTYPES:
                draw_case(tensors, seed, f"n{size}_{dtype}", [((size,), dtype)])
    for seed, dtypes in LATENT_SEEDS.items():
        for dtype in dtypes:
            draw_case(tensors, seed, f"{shape_label(LATENT)}_{dtype}", [(LATENT, dtype)])
    for seed in SEQUENCE_SEEDS:
        for case, draws in SEQUENCES.items():
            draw_case(tensors, seed, case, [((size,), dtype) for size, dtype in draws])

    metadata = {"torch": torch.__version__.split("+")[0], "cpu_capability": capability}
    write_safetensors(args.out, tensors, metadata)
    print(f"wrote {len(tensors)} tensors, {args.out.stat().st_size} bytes, to {args.out}")


if __name__ == "__main__":
    main()
