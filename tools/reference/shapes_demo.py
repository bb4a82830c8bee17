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
        # The model's defaults, given explicitly: a klein base model's 50 steps at CFG 4 against "",
        # and the tokenizer's model_max_length, which xdit takes as its max_sequence_length default
        # (diffusers' is 512 whatever the tokenizer says).
        calls[f"pipeline{i}"] = common.run_pipeline(
            ref, pipeline, f"pipeline{i}", False, SEED, prompt=prompt, height=64, width=64,
            num_inference_steps=50, guidance_scale=4.0, max_sequence_length=pipeline.tokenizer.model_max_length)
    ref.set("calls", calls)
    ref.write()
