"""The bundled demo model (models/shapes-demo, trained by tools/train_demo): diffusers' pictures
for held-out prompts, which the C++ engine must reproduce (tests/e2e/test_demo_model.cpp).

Unlike the other families nothing is built here: the committed model is loaded as it is, so this
reference must be regenerated whenever the model is retrained."""
import torch
from diffusers import Flux2KleinPipeline

import common

FAMILY = "shapes-demo"
MODEL_DIR = "models/shapes-demo"
SEED = 7
# Held-out prompts (tests/e2e/held_out_prompts.tsv): training never saw them.
PROMPTS = ["a medium green triangle in the bottom right on a black background",
           "a small green circle in the top right on a red background"]


def build():
    pipeline = Flux2KleinPipeline.from_pretrained(common.ROOT / MODEL_DIR, dtype=torch.float32)
    ref = common.Reference(FAMILY, "Flux2KleinPipeline")
    ref.set("model_dir", MODEL_DIR)
    calls = {}
    for i, prompt in enumerate(PROMPTS):
        # The pipeline's defaults (4 steps, max_sequence_length 512) at the model's 64 px.
        calls[f"pipeline{i}"] = common.run_pipeline(ref, pipeline, f"pipeline{i}", i == 0, SEED, prompt=prompt,
                                                    height=64, width=64, num_inference_steps=4, guidance_scale=1.0)
    ref.set("calls", calls)
    ref.write()
