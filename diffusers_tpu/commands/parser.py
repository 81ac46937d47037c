"""The ``diffusers-tpu`` command line's arguments, and every mistake in them that can be named before anything loads.

Standard library only (and the package's light modules): ``--help`` answers at once, and a wrong ``--steps``,
size, frame count, model name, missing folder or unwritable output is refused in a moment, naming the flag and the
fix, before torch, JAX or diffusers are imported (``tests/commands/test_cli_start.py`` counts the imports).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os

from ..interop.mesh_axes import mesh_arg
from ..planner.chips import CHIPS
from .model_names import (
    ARCHITECTURES,
    BUILT_IN_RULES,
    DEFAULT_MODEL,
    DEMO_MODEL,
    TINY_MODELS,
    TINY_PREFIX,
    check_model,
    check_sizes,
)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


def positive(flag: str):
    """An argparse ``type``: a whole number >= 1, refused naming ``flag``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
        return value

    parse.__name__ = flag
    return parse


def add_runtime_args(parser, model=True, default_model: str = DEFAULT_MODEL):
    if model:
        tiny = ", ".join(TINY_PREFIX + name for name in TINY_MODELS)
        parser.add_argument(
            "--model",
            help="a local diffusers folder, the built-in trained demo model (demo: 'a <colour> "
            f"<square|circle> moves <left|right|up|down>'), or a built-in tiny random-weight model: {tiny} "
            "(tiny:ltx2 writes a .wav beside the video; tiny:flux, tiny:qwen-image, tiny:z-image, tiny:sd, "
            "tiny:sdxl make "
            f"images) (default: {default_model}; staged stages after encode default to the stage "
            "directory's model)",
        )
    parser.add_argument(
        "--platform",
        default="auto",
        choices=("auto", "tpu", "jax", "cpu", "gpu", "torch"),
        help="auto: tpu when JAX sees one, else JAX's default platform; cpu/gpu rehearse the TPU path; "
        "torch: stock diffusers on the CPU, no JAX",
    )
    parser.add_argument(
        "--mesh", type=mesh_arg, help="device mesh dp,sp,tp (product = device count); default: automatic"
    )
    parser.add_argument(
        "--attention",
        choices=("splash_exp2", "splash", "xla", "cudnn"),
        help="attention kernel (default: per platform)",
    )
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="denoiser weight dtype")
    parser.add_argument(
        "--text-encoder",
        choices=("auto", "host", "jax"),
        default="auto",
        help="text encoders on the host CPU or compiled on the devices; auto (default): on the "
        "devices when all weights take <= 40%% of a device's memory, on the host on CPU",
    )
    parser.add_argument(
        "--matmul-precision",
        choices=("highest", "high", "default"),
        default="highest",
        help="float32 products: highest = full float32 as stock (default); default = the platform's "
        "fast path (bfloat16 passes on TPU, TF32 on GPU), faster float32 parts, ~1e-3 from stock",
    )
    parser.add_argument(
        "--quantize",
        choices=("int8", "fp8"),
        help="store the denoiser's linear weights as int8 (or fp8) with per-channel scales: half the "
        "weight memory of bfloat16, lossy (BENCHMARKS.md 'int8 weights')",
    )


def add_prompt_args(parser):
    parser.add_argument(
        "--prompt",
        help="default: the demo model's own example ('a blue circle "
        "moves up'), tiny models 'A cat walks on the grass', else 'A cat walks on the grass, realistic'",
    )
    parser.add_argument(
        "--negative-prompt",
        help="default: empty for the demo model, 'blurry, low "
        "quality' for tiny models, else 'blurry, low quality, static'",
    )
    parser.add_argument("--guidance", type=float, help="classifier-free guidance scale (default: the pipeline's)")


def add_size_args(parser):
    parser.add_argument("--frames", type=positive("--frames"), help="frame count; default: the pipeline's (tiny: 9)")
    parser.add_argument("--height", type=positive("--height"), help="default: the pipeline's (tiny models: 64)")
    parser.add_argument("--width", type=positive("--width"), help="default: the pipeline's (tiny models: 64)")
    parser.add_argument("--steps", type=positive("--steps"), help="denoising steps; default: the pipeline's (tiny: 4)")
    parser.add_argument(
        "--blocks", type=positive("--blocks"), help="causal (streaming) pipelines: blocks to generate (default: 3)"
    )
    parser.add_argument("--seed", type=int, default=0)


def add_output_args(parser):
    parser.add_argument("--fps", type=positive("--fps"), default=16)
    parser.add_argument(
        "--output",
        help="output path, written atomically: an .mp4 for video pipelines (default "
        "video.mp4), an image file (.png, .jpg, .webp; default image.png) for image pipelines",
    )
    parser.add_argument(
        "--strip",
        help="video pipelines: also write every frame side by side as one image (.png), "
        "e.g. to put a video on a page that cannot play it",
    )


# --- mistakes named before anything loads -----------------------------------------------------------------------------
def demo_prompt_warning(prompt: str | None) -> str | None:
    """One line when the demo model's prompt has words outside its grammar (it would draw a garbled shape)."""
    from ..demo import scenes

    unknown = [word for word in (prompt or "").lower().replace(",", " ").split() if word not in scenes.vocabulary()]
    if not unknown:
        return None
    return (
        f"diffusers-tpu: warning: the demo model knows only 'a <colour> <shape> moves <direction>' (colours "
        f"{', '.join(scenes.COLOURS)}; shapes {', '.join(scenes.SHAPES)}; directions {', '.join(scenes.DIRECTIONS)}); "
        f"{', '.join(repr(w) for w in unknown)} {'is' if len(unknown) == 1 else 'are'} outside it: expect a garbled "
        'video. Real models take any prompt: README "Real weights".'
    )


def _model_of(args) -> str | None:
    """The model a command will load (None: a stage's model comes from its stage directory)."""
    if getattr(args, "arch", None):
        return args.arch
    if args.command in ("plan", "cost", "ready", "compile"):
        return args.model
    if args.command in ("encode", "denoise", "decode"):
        return args.model
    default = "tiny:wan" if args.command in ("bench", "profile") else DEFAULT_MODEL
    return args.model or default


def _check_destinations(args, model: str | None) -> None:
    """Every path the command will write: checked before anything is loaded or compiled."""
    from ..runtime.files import outputs

    if getattr(args, "json", None):
        outputs.check_destination(args.json, what="--json")
    if getattr(args, "stage_dir", None):
        outputs.check_destination(os.path.join(args.stage_dir, "generation_config.json"), what="--stage-dir")
    if args.command not in ("generate", "decode") or (args.command == "generate" and args.stop_after):
        return
    rule = BUILT_IN_RULES.get(model)
    if rule is not None and args.output is not None:  # a built-in model: whether it makes images or videos is known
        is_image = args.output.lower().endswith(IMAGE_SUFFIXES)
        if rule.images and not is_image:
            raise ValueError(
                f"--output {args.output}: {model} makes images; end it in "
                f"{', '.join(IMAGE_SUFFIXES)}, e.g. --output image.png."
            )
        if not rule.images and is_image:
            raise ValueError(f"--output {args.output}: {model} makes videos; end it in .mp4.")
    pixels = (args.frames or 1) * (args.height or 64) * (args.width or 64) if args.command == "generate" else 0
    outputs.check_destination(args.output or "video.mp4", needed_bytes=max(1 << 16, pixels * 3 // 100))
    if getattr(args, "strip", None):
        if not args.strip.lower().endswith(IMAGE_SUFFIXES):
            raise ValueError(
                f"--strip {args.strip}: the frame strip is an image; end it in .png "
                f"(or {', '.join(IMAGE_SUFFIXES[1:])})."
            )
        outputs.check_destination(args.strip, needed_bytes=max(1 << 16, pixels * 3 // 10), what="--strip")


def no_encode_stage(stage_dir: str) -> str:
    return f"{stage_dir} has no encode stage yet: run `diffusers-tpu encode --stage-dir {stage_dir}` first."


def _planned(args) -> str:
    return "--compiler cpu" if args.compiler == "cpu" else f"--chips {args.chips or '(none: --mesh/--hbm-gb)'}"


def _check_targets(args) -> None:
    """``plan``, ``cost``, ``ready`` and ``compile``: what to plan (one of --arch, --model) and for what (a named
    target)."""
    if args.command not in ("plan", "cost", "ready", "compile"):
        return
    if bool(args.arch) == bool(args.model):
        raise ValueError(f"{args.command} needs exactly one of --arch NAME or --model FOLDER|tiny:NAME.")
    if args.command == "plan" and not args.chips and not (args.mesh and args.hbm_gb):
        raise ValueError(
            "plan needs a target: --chips NAME (one of %s), or --mesh dp,sp,tp with --hbm-gb N."
            % ", ".join(sorted(CHIPS))
        )
    if args.command in ("plan", "cost") and not 0 < args.attention_efficiency <= 1:
        raise ValueError(f"--attention-efficiency {args.attention_efficiency}: a fraction in (0, 1], e.g. 0.5.")
    if args.command == "plan" and args.compiler_estimate:
        chip = CHIPS.get(args.chips)
        if args.compiler == "cpu" or chip is None or chip.topology is None:
            raise ValueError(
                f"--compiler-estimate reads the TPU compiler's own run-time estimate, which {_planned(args)} does not "
                "have: plan a TPU slice (--chips v6e-8, ...) with --compiler auto or tpu, or drop --compiler-estimate."
            )
        if args.first_fit:
            raise ValueError(
                "--compiler-estimate ranks the fitting candidates and --first-fit ranks none: drop one of them."
            )
    if args.command == "compile" and os.path.isfile(args.output):
        raise ValueError(f"--output {args.output}: a file; name a folder for the programs (created if missing).")
    if args.command == "compile" and args.chips is not None and importlib.util.find_spec("libtpu") is None:
        version = importlib.metadata.version("jax")
        raise ValueError(
            f"compile --chips {args.chips} needs the TPU compiler (libtpu, ~700 MB; no TPU needed), which is not "
            f'installed: pip install "jax[tpu]=={version}" (or pip install -e ".[tpu]" in a checkout).'
        )
    if args.command in ("cost", "ready") or (args.command == "compile" and args.chips is not None):
        slices = [name for name, chip in CHIPS.items() if chip.topology]
        if args.chips not in slices:
            raise ValueError(
                f"{args.command} --chips {args.chips}: not a TPU slice the TPU compiler knows; "
                f"choose one of {', '.join(slices)}."
            )


def check(args) -> None:
    """Refuse (ValueError naming the flag and the fix) what can be known wrong before anything loads; warn (one line on
    stderr) about a prompt the demo model cannot draw."""
    import sys

    _check_targets(args)
    if args.command in ("denoise", "decode") and not os.path.isfile(
        os.path.join(args.stage_dir, "generation_config.json")
    ):
        raise ValueError(no_encode_stage(args.stage_dir))
    model = _model_of(args)
    if getattr(args, "arch", None) and args.arch not in ARCHITECTURES:
        raise ValueError(f"--arch {args.arch}: no such architecture; choose one of {', '.join(ARCHITECTURES)}.")
    if model is not None and not getattr(args, "arch", None):
        check_model(model)
    if model is not None:
        check_sizes(args, model)
    _check_destinations(args, model)
    if model == DEMO_MODEL and args.command in ("generate", "encode"):
        warning = demo_prompt_warning(args.prompt)
        if warning:
            print(warning, file=sys.stderr)
