"""Pieces shared by the family builders: determinism, random weights, saving a tiny repo, and the
reference file with its JSON sidecar."""
import json
import math
import os
import pathlib

import torch
from safetensors.torch import save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODELS_DIR = ROOT / "tests/fixtures/models"
REFERENCE_DIR = ROOT / "tests/fixtures/reference"


def make_deterministic():
    """Single-threaded, deterministic kernels: the same bytes on every run on the same machine."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)


def randomize_(module, seed):
    """Replaces every parameter with seeded random values, so that no weight keeps a trivial init
    (zero biases, unit norms, zero-initialised output layers) that would hide a missing op.
    Matrices and kernels get N(0, 1/fan_in); vectors (biases, norm weights) get their init plus
    N(0, 0.1²). Buffers such as RoPE frequencies are left alone."""
    generator = torch.Generator("cpu").manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(module.named_parameters(), key=lambda item: item[0]):
            noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
            if param.dim() >= 2:
                param.copy_(noise / math.sqrt(param[0].numel()))
            else:
                param.add_(0.1 * noise)
    return module.eval()


def model_dir(family):
    return MODELS_DIR / f"{family}-tiny"


def save_pipeline(pipeline, family):
    """save_pretrained in the diffusers layout; returns the folder."""
    folder = model_dir(family)
    pipeline.save_pretrained(folder, safe_serialization=True)
    return folder


def component_summary(folder, pipeline):
    """Per component: class, weights files, tensor and element counts as written, for the sidecar
    (the C++ test checks them against the files)."""
    from safetensors import safe_open

    summary = {}
    for name in sorted(pipeline.components):
        component = pipeline.components[name]
        if component is None:
            continue
        entry = {"class": type(component).__name__}
        weights = sorted(p.name for p in (folder / name).glob("*.safetensors"))
        if weights:
            entry["weights"] = weights
            count = elements = 0
            for file in weights:
                with safe_open(folder / name / file, "pt") as handle:
                    for key in handle.keys():
                        count += 1
                        elements += math.prod(handle.get_slice(key).get_shape())
            entry["tensors"] = count
            entry["elements"] = elements  # parameters and saved buffers (BatchNorm statistics)
        summary[name] = entry
    return summary


class Reference:
    """Collects named tensors and their descriptions; writes <family>.safetensors and <family>.json."""

    def __init__(self, family, pipeline_class):
        self.family = family
        self.tensors = {}
        self.sidecar = {"family": family, "pipeline": pipeline_class,
                        "model_dir": f"tests/fixtures/models/{family}-tiny", "tensors": {}}

    def add(self, name, tensor, about):
        tensor = tensor.detach().cpu().contiguous()
        if tensor.dtype == torch.float64:
            tensor = tensor.float()
        if tensor.dtype in (torch.int32, torch.bool):
            tensor = tensor.long()
        assert name not in self.tensors, name
        self.tensors[name] = tensor.clone()
        self.sidecar["tensors"][name] = {"dtype": {torch.float32: "F32", torch.int64: "I64"}[tensor.dtype],
                                         "shape": list(tensor.shape), "about": about}

    def set(self, key, value):
        self.sidecar[key] = value

    def write(self):
        import diffusers
        import tokenizers
        import transformers

        self.sidecar["versions"] = {"torch": torch.__version__.split("+")[0], "diffusers": diffusers.__version__,
                                    "transformers": transformers.__version__, "tokenizers": tokenizers.__version__}
        REFERENCE_DIR.mkdir(parents=True, exist_ok=True)
        save_file(self.tensors, REFERENCE_DIR / f"{self.family}.safetensors", metadata={"family": self.family})
        text = json.dumps(self.sidecar, sort_keys=True, indent=1, ensure_ascii=False) + "\n"
        (REFERENCE_DIR / f"{self.family}.json").write_text(text, encoding="utf-8")


def flow_match_schedule(scheduler_class, config, steps, **kwargs):
    """A fresh scheduler from `config`, set_timesteps(**kwargs) as the pipeline calls it; returns
    (sigmas, timesteps) as float32 tensors."""
    scheduler = scheduler_class.from_config(config)
    scheduler.set_timesteps(steps, device="cpu", **kwargs)
    return scheduler.sigmas.float(), scheduler.timesteps.float()


def run_pipeline(ref, pipeline, prefix, record_steps, seed, **call):
    """Runs the whole pipeline with generator=torch.Generator("cpu").manual_seed(seed) and
    output_type "np"; records the picture and, with record_steps, the initial latents (as
    prepare_latents returns them) and the latents after every step. Returns the call's arguments
    for the sidecar."""
    initial, steps = [], []
    prepare_latents = pipeline.prepare_latents

    def capture_initial(*args, **kwargs):
        out = prepare_latents(*args, **kwargs)
        initial.append((out[0] if isinstance(out, tuple) else out).detach().clone())
        return out

    def capture_step(_pipeline, _step, _timestep, tensors):
        steps.append(tensors["latents"].detach().clone())
        return tensors

    pipeline.prepare_latents = capture_initial
    pipeline.set_progress_bar_config(disable=True)
    try:
        with torch.no_grad():
            out = pipeline(generator=torch.Generator("cpu").manual_seed(seed), output_type="np",
                           callback_on_step_end=capture_step, **call)
    finally:
        del pipeline.prepare_latents
    picture = out.frames if hasattr(out, "frames") else out.images
    if record_steps:
        ref.add(f"{prefix}.noise", initial[0], "latents as prepare_latents returns them (the seeded noise)")
        for i, latents in enumerate(steps):
            ref.add(f"{prefix}.step{i}.latents", latents, f"latents after step {i} (scheduler.step output)")
    about = "output_type='np' float in [0, 1]: " + ("[B, F, H, W, 3]" if picture.ndim == 5 else "[B, H, W, 3]")
    ref.add(f"{prefix}.image", torch.from_numpy(picture), about)
    return {"seed": seed, "generator": "torch.Generator('cpu').manual_seed(seed)", "output_type": "np", **call}


def add_vae_2d(ref, vae, latent_channels, latent_hw, scale):
    """vae.decode of a random latent and vae.encode of a random image in [-1, 1]."""
    generator = torch.Generator("cpu").manual_seed(11)
    latent = torch.randn(1, latent_channels, *latent_hw, generator=generator)
    image = torch.rand(1, 3, latent_hw[0] * scale, latent_hw[1] * scale, generator=generator) * 2 - 1
    with torch.no_grad():
        decoded = vae.decode(latent, return_dict=False)[0]
        dist = vae.encode(image).latent_dist
    ref.add("vae.decode.latent", latent, "input of vae.decode (a raw VAE latent: no scaling or shift applied)")
    ref.add("vae.decode.image", decoded, "vae.decode output, unclamped, in about [-1, 1]")
    ref.add("vae.encode.image", image, "input of vae.encode, in [-1, 1]")
    ref.add("vae.encode.mean", dist.mean, "latent_dist.mean")
    ref.add("vae.encode.logvar", dist.logvar, "latent_dist.logvar (clamped to [-30, 20])")


def add_tokens(ref, key, inputs):
    ref.add(f"tokens.{key}.input_ids", inputs["input_ids"], "token ids as the pipeline passes them")
    ref.add(f"tokens.{key}.attention_mask", inputs["attention_mask"], "1 for real tokens, 0 for padding")
    return int(inputs["attention_mask"].sum())
