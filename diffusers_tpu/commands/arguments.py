"""Command-line helpers shared by ``diffusers-tpu`` subcommands (``cli``) and the benchmark (``bench``), once the
arguments are read (``parser``): platform choice, model defaults and loading (local folders or built-in tiny models)
and call arguments."""

from __future__ import annotations

import inspect

from .model_names import DEMO_MODEL, TINY_PREFIX


def device_for(platform: str) -> str:
    """The device string of the commands' ``--platform``."""
    from ..interop.backend import device_for

    return device_for(platform)


# Small sizes that suit the tiny random-weight models (the real models use their pipeline's defaults).
PROMPT_DEFAULTS = dict(prompt="A cat walks on the grass, realistic", negative_prompt="blurry, low quality, static")
# The tiny models' prompts fit the shortest tiny text length (CogVideoX's 32 character-level tokens): no truncation.
TINY_DEFAULTS = dict(
    frames=9, height=64, width=64, steps=4, prompt="A cat walks on the grass", negative_prompt="blurry, low quality"
)
TINY_SEQUENCE_LENGTH = {"cogvideox": 32}  # the tiny CogVideoX transformer's text length


def model_defaults(model: str) -> dict:
    """Argument defaults that depend on the model: sizes (tiny and demo models), prompt, negative prompt, guidance."""
    if model == DEMO_MODEL:  # the size, steps and guidance it was trained for, and its own kind of prompt
        from .. import demo

        call = demo.CALL
        return dict(
            frames=call["num_frames"],
            height=call["height"],
            width=call["width"],
            steps=call["num_inference_steps"],
            guidance=call["guidance_scale"],
            negative_prompt=call["negative_prompt"],
            prompt=demo.DEFAULT_PROMPT,
        )
    return {**PROMPT_DEFAULTS, **(TINY_DEFAULTS if model.startswith(TINY_PREFIX) else {})}


def fill_defaults(args, model: str) -> None:
    """Set the arguments left unset (None) to ``model``'s defaults."""
    for name, value in model_defaults(model).items():
        if getattr(args, name, "absent") is None:
            setattr(args, name, value)


def sequence_length(pipe, model: str) -> int | None:
    """The text length a built-in model needs (None: the pipeline's default)."""
    if model == DEMO_MODEL:
        from .. import demo

        return demo.CALL["max_sequence_length"]
    if model.startswith(TINY_PREFIX):
        from ..runtime.registry import family_of

        return TINY_SEQUENCE_LENGTH.get(family_of(pipe).name)
    return None


def _tiny_more() -> dict:
    from ..testing import tiny_families, tiny_generic, tiny_images, tiny_unet

    found = {
        name: (lambda name=name: tiny_families.pipeline(name))
        for name in ("ltx", "ltx-i2v", "ltx2", "hunyuan-video", "skyreels-v2")
    }
    found.update({name: (lambda name=name: tiny_images.pipeline(name)) for name in tiny_images.PIPELINES})
    found.update({name: (lambda name=name: tiny_unet.pipeline(name)) for name in CLI_UNETS})
    found.update(
        {
            name: (
                lambda name=name: (
                    tiny_generic.generic_pipeline(name),
                    tiny_generic.generic_call(tiny_generic.generic_pipeline(name)),
                )
            )
            for name in tiny_generic.PIPELINES
        }
    )
    return found


CLI_UNETS = ("sd", "sdxl", "svd", "animatediff")  # the UNet pipelines with a tiny model on the command line
_CLI_OWNED = {"prompt", "negative_prompt", "height", "width", "num_frames", "num_inference_steps", "output_type"}


def tiny_models() -> list[str]:
    from ..testing import tiny

    return (
        sorted(tiny.WAN_TRANSFORMERS)
        + sorted(tiny.COGVIDEOX_TRANSFORMERS)
        + ["hunyuanvideo15", "causal-wan"]
        + sorted(_tiny_more())
    )


def makes_images(pipe) -> bool:
    """An image pipeline: its call takes no frame count."""
    accepted = inspect.signature(type(pipe).__call__).parameters
    return not any(name in accepted for name in ("num_frames", "video_length", "num_blocks"))


def load_pipeline(model: str):
    """A pipeline from a local diffusers folder (safetensors only, no remote code) or a tiny built-in model."""
    import torch

    from ..testing import tiny

    if model == DEMO_MODEL:
        from .. import demo

        return demo.load_pipeline()
    if model.startswith(TINY_PREFIX):
        variant = model[len(TINY_PREFIX) :]
        if variant in tiny.WAN_TRANSFORMERS:
            return tiny.wan_pipeline(variant)
        if variant in tiny.COGVIDEOX_TRANSFORMERS:
            return tiny.cogvideox_pipeline(variant)
        if variant == "hunyuanvideo15":
            return tiny.hunyuan15_pipeline()
        if variant == "causal-wan":
            return tiny.causal_wan_pipeline()
        more = _tiny_more()  # the newer families' tiny models and the generic path's
        if variant in more:
            pipe, call = more[variant]()
            # the builder's pipeline-specific call arguments (templates, true CFG, text length) become CLI defaults
            pipe._diffusers_tpu_tiny_call = {k: v for k, v in call.items() if k not in _CLI_OWNED}
            return pipe
        raise ValueError(f"--model {model}: no tiny model {variant!r}; choose one of {tiny_models()}.")
    import diffusers

    return diffusers.DiffusionPipeline.from_pretrained(model, use_safetensors=True, dtype=torch.float32)


def call_sizes(pipe, args, model: str) -> dict:
    """Explicit sizes (FLOPs need numbers): the arguments, else the tiny/demo model's, else the pipeline's defaults."""
    from ..runtime.files.stages import call_defaults

    defaults = call_defaults(pipe)
    config = pipe.transformer.config
    sample = {name: getattr(config, f"sample_{name}", None) for name in ("height", "width", "frames")}
    fallback = {
        "height": defaults.get("height") or sample["height"] and sample["height"] * pipe.vae_scale_factor_spatial,
        "width": defaults.get("width") or sample["width"] and sample["width"] * pipe.vae_scale_factor_spatial,
        "frames": defaults.get("num_frames") or sample["frames"],
        "steps": defaults.get("num_inference_steps"),
    }
    fallback.update({k: v for k, v in model_defaults(model).items() if k in fallback})
    sizes = {
        name: getattr(args, name) if getattr(args, name) is not None else value for name, value in fallback.items()
    }
    accepted = inspect.signature(type(pipe).__call__).parameters
    takes = {"height": "height", "width": "width", "frames": "num_frames", "steps": "num_inference_steps"}
    missing = [f"--{name}" for name, value in sizes.items() if value is None and takes[name] in accepted]
    if missing:
        raise ValueError(
            f"{type(pipe).__name__} has no default for {', '.join(missing)}: pass them to diffusers-tpu bench."
        )
    return sizes


def pipeline_to_compile(args, dtype):
    """The pipeline ``plan``, ``cost`` and ``ready`` compile for: ``--arch`` built without weights, a diffusers
    folder from its configs alone (no weight read), else the model as ``load_pipeline`` loads it."""
    import os

    import torch

    from ..planner import architectures

    if args.arch:
        return architectures.build(args.arch, dtype or torch.float32, weights=False)
    if os.path.isfile(os.path.join(args.model, "model_index.json")):
        return architectures.folder_pipeline(args.model, dtype)
    return load_pipeline(args.model)


def timing_config(args, dtype):
    """The ``TPUConfig`` of the commands that time a pipeline (``bench``, ``profile``), from their shared arguments."""
    import torch

    from ..runtime.config import TPUConfig

    return TPUConfig(
        mesh=args.mesh,
        attention=args.attention,
        dtype=dtype if dtype == torch.bfloat16 else None,
        text_encoder=args.text_encoder,
        matmul_precision=args.matmul_precision,
        quantize=getattr(args, "quantize", None),
    )
