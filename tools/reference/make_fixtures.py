#!/usr/bin/env python3
"""Builds the tiny random-weight model of every family in the diffusers layout under
tests/fixtures/models/<family>-tiny/ and records the reference tensors of the real diffusers and
transformers classes in tests/fixtures/reference/<family>.safetensors (+ .json sidecar), then
rewrites tests/fixtures/MANIFEST. See tools/reference/README.md.

    /work/venv-ref/bin/python tools/reference/make_fixtures.py            # every family
    /work/venv-ref/bin/python tools/reference/make_fixtures.py flux2-klein z-image
    /work/venv-ref/bin/python tools/reference/make_fixtures.py --manifest-only
"""
import argparse
import hashlib
import shutil
import sys

import common

FIXTURES = common.ROOT / "tests/fixtures"


def builders():
    import flux2
    import qwen_image
    import sd3
    import shapes_demo
    import wan
    import z_image

    return {
        "flux2-klein": flux2.build_klein,
        "z-image": z_image.build,
        "sd35": sd3.build,
        "qwen-image": qwen_image.build,
        "wan22-ti2v": wan.build_ti2v,
        "wan22-a14b": wan.build_a14b,
        "flux2-dev": flux2.build_dev,
        shapes_demo.FAMILY: shapes_demo.build,  # the committed models/shapes-demo, loaded as it is
    }


def write_manifest():
    """One line per file under tests/fixtures: sha256, size in bytes, path; sorted by path."""
    lines = []
    for path in sorted(p for p in FIXTURES.rglob("*") if p.is_file() and p.name != "MANIFEST"):
        data = path.read_bytes()
        lines.append(f"{hashlib.sha256(data).hexdigest()}  {len(data)}  {path.relative_to(FIXTURES).as_posix()}")
    (FIXTURES / "MANIFEST").write_text("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("families", nargs="*", help="families to rebuild (default: all)")
    parser.add_argument("--manifest-only", action="store_true", help="only rewrite tests/fixtures/MANIFEST")
    args = parser.parse_args()

    if not args.manifest_only:
        import diffusers
        import transformers

        diffusers.utils.logging.set_verbosity_error()
        diffusers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        table = builders()
        unknown = [f for f in args.families if f not in table]
        if unknown:
            sys.exit(f"unknown families {unknown}; known: {sorted(table)}")
        for family in args.families or table:
            # A fresh folder: nothing from an older layout may survive into the manifest.
            shutil.rmtree(common.model_dir(family), ignore_errors=True)
            common.make_deterministic()
            table[family]()
            print(f"built {family}")
    write_manifest()


if __name__ == "__main__":
    main()
