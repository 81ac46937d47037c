"""The models the command line knows by name (the demo, the ``tiny:*`` models, the architectures of ``--arch``) and
the sizes and frame counts each takes: ``check_model`` and ``check_sizes`` name a mistake and its fix before anything
loads. Standard library only, as ``parser``.
"""

from __future__ import annotations

import dataclasses
import json
import os

TINY_PREFIX = "tiny:"
DEMO_MODEL = "demo"
DEFAULT_MODEL = DEMO_MODEL
# The built-in tiny random-weight models (``arguments.tiny_models()`` builds them; a test keeps the two equal).
TINY_MODELS = (
    "animatediff",
    "causal-wan",
    "cogvideox-2b",
    "cogvideox-5b",
    "cogvideox-d64",
    "cogvideox-step",
    "cogvideox1.5",
    "easyanimate",
    "flux",
    "hunyuan-video",
    "hunyuanvideo15",
    "latte",
    "ltx",
    "ltx-i2v",
    "ltx2",
    "mochi",
    "nucleusmoe-image",
    "qwen-image",
    "sd",
    "sdxl",
    "skyreels-v2",
    "svd",
    "wan",
    "wan-4head",
    "wan-d128",
    "wan-step",
    "z-image",
)
# The real-size architectures ``--arch`` builds with random weights (``planner.architectures``; a test keeps them
# equal).
ARCHITECTURES = (
    "CausalWan2.1-1.3B",
    "CogVideoX1.5-5B",
    "HunyuanVideo-1.5-8.3B",
    "SDXL-1.0",
    "Wan2.1-1.3B",
    "Wan2.1-14B",
)


@dataclasses.dataclass(frozen=True)
class SizeRule:
    """What a model accepts as a call's size without refusing it or silently changing it: height and width multiples of
    ``multiple``; frame counts ``first + k * every`` (``every`` None: any count, or the call takes none)."""

    multiple: int
    every: int | None = None
    first: int = 1
    images: bool = False

    def frames_ok(self, frames: int) -> bool:
        return self.every is None or (frames >= self.first and (frames - self.first) % self.every == 0)


# The built-in models' rules, from their VAEs' compression, their patch sizes and their pipelines' own checks (e.g.
# WanPipeline refuses sizes that are not multiples of 16 and rounds other frame counts; the demo model's transformer
# packs 5 latent frames of 2 video frames each; CogVideoX's VAE decodes latent frames in pairs after the first, so
# only 1 + 8k frames come out as asked). ``tests/commands/test_cli_start.py`` derives each from the built pipeline.
BUILT_IN_RULES = {
    DEMO_MODEL: SizeRule(16, 10, 9),
    "tiny:wan": SizeRule(16, 4),
    "tiny:wan-4head": SizeRule(16, 4),
    "tiny:wan-d128": SizeRule(16, 4),
    "tiny:wan-step": SizeRule(16, 4),
    "tiny:skyreels-v2": SizeRule(16, 4),
    "tiny:causal-wan": SizeRule(16),
    "tiny:cogvideox-2b": SizeRule(16, 8),
    "tiny:cogvideox-5b": SizeRule(16, 8),
    "tiny:cogvideox1.5": SizeRule(16, 8),
    "tiny:cogvideox-d64": SizeRule(16, 8),
    "tiny:cogvideox-step": SizeRule(16, 8),
    "tiny:hunyuanvideo15": SizeRule(8, 4),
    "tiny:hunyuan-video": SizeRule(16, 4),
    "tiny:ltx": SizeRule(32, 4),
    "tiny:ltx-i2v": SizeRule(32, 4),
    "tiny:ltx2": SizeRule(32, 2),
    "tiny:latte": SizeRule(8),
    "tiny:mochi": SizeRule(16, 6),
    "tiny:easyanimate": SizeRule(16, 4),
    "tiny:flux": SizeRule(2, images=True),
    "tiny:qwen-image": SizeRule(8, images=True),
    "tiny:z-image": SizeRule(4, images=True),
    "tiny:nucleusmoe-image": SizeRule(8, images=True),
    "tiny:sd": SizeRule(8, images=True),
    "tiny:sdxl": SizeRule(8, images=True),
    "tiny:svd": SizeRule(8),
    "tiny:animatediff": SizeRule(8),
    "Wan2.1-1.3B": SizeRule(16, 4),
    "Wan2.1-14B": SizeRule(16, 4),
    "CausalWan2.1-1.3B": SizeRule(16),
    "CogVideoX1.5-5B": SizeRule(16, 8),
    "HunyuanVideo-1.5-8.3B": SizeRule(16, 4),
    "SDXL-1.0": SizeRule(8, images=True),
}
# A local folder's pipeline class (its model_index.json) -> the size multiple its stock check refuses others of,
# whatever the checkpoint's VAE (frame rules depend on the VAE: the pipeline's own check applies after loading).
CLASS_MULTIPLES = {
    "WanPipeline": 16,
    "WanImageToVideoPipeline": 16,
    "WanVideoToVideoPipeline": 16,
    "WanVACEPipeline": 16,
    "SkyReelsV2Pipeline": 16,
    "SkyReelsV2DiffusionForcingPipeline": 16,
    "HunyuanVideoPipeline": 16,
    "LTXPipeline": 32,
    "LTXImageToVideoPipeline": 32,
    "LTX2Pipeline": 32,
    "CogVideoXPipeline": 8,
    "LattePipeline": 8,
    "MochiPipeline": 8,
}
EXAMPLE_CHECKPOINT = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"


def size_rule(model: str) -> SizeRule | None:
    """The rule a ``--model`` (or ``--arch``) is checked against before loading: a built-in's own, or the one a
    folder's pipeline class (named by its model_index.json) always applies; None when nothing is known."""
    if model in BUILT_IN_RULES:
        return BUILT_IN_RULES[model]
    try:
        with open(os.path.join(model, "model_index.json")) as file:
            name = json.load(file).get("_class_name")
    except (OSError, ValueError, AttributeError):
        return None
    return SizeRule(CLASS_MULTIPLES[name]) if name in CLASS_MULTIPLES else None


def check_model(model: str) -> None:
    """A built-in name or a diffusers folder on this machine; else the error says what exists and how to get one."""
    if model == DEMO_MODEL:
        return
    if model.startswith(TINY_PREFIX):
        if model[len(TINY_PREFIX) :] not in TINY_MODELS:
            raise ValueError(
                f"--model {model}: there is no such tiny model; choose one of "
                f"{', '.join(TINY_PREFIX + name for name in TINY_MODELS)}."
            )
        return
    if not os.path.exists(model):
        hub_id = model.count("/") == 1 and not model.startswith((".", "/", "~"))
        repository = model if hub_id else EXAMPLE_CHECKPOINT
        folder = "./" + repository.split("/")[-1] if hub_id else model
        raise ValueError(
            f"--model {model}: no such folder{' here (it looks like a Hub id)' if hub_id else ''}. "
            "diffusers-tpu loads local diffusers folders and downloads nothing; download one first, e.g. "
            f'`hf download {repository} --local-dir {folder}` (pip install huggingface_hub; README "Real '
            f'weights"), then pass --model {folder}. Or try the built-in demo model: --model {DEMO_MODEL}.'
        )
    if not os.path.isfile(os.path.join(model, "model_index.json")):
        raise ValueError(
            f"--model {model}: not a diffusers pipeline folder (it has no model_index.json); pass the folder "
            "that holds model_index.json, as save_pretrained or `hf download` write it."
        )


def check_sizes(args, model: str) -> None:
    """Sizes and frame counts the model would refuse, or silently change, named with the nearest valid ones."""
    rule = size_rule(model)
    if rule is None:
        return
    for flag in ("height", "width"):
        value = getattr(args, flag, None)
        if value is not None and value % rule.multiple:
            below = max(rule.multiple, value // rule.multiple * rule.multiple)
            raise ValueError(
                f"--{flag} {value}: {model} needs a multiple of {rule.multiple}; use {below} or "
                f"{below + rule.multiple}."
            )
    frames = getattr(args, "frames", None)
    if frames is not None and not rule.frames_ok(frames):
        below = max(rule.first, rule.first + (frames - rule.first) // rule.every * rule.every)
        raise ValueError(
            f"--frames {frames}: {model} makes {rule.first} + {rule.every}k frames (its VAE and "
            f"transformer take frames in groups); use {below} or {below + rule.every}."
        )
