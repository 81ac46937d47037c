"""The ``diffusers-tpu`` parser (``build``): each subcommand's arguments, from ``parser``'s groups. Standard library
only, like ``parser``: the commands' own modules, which import torch and JAX, load only once the arguments are read and
checked."""

from __future__ import annotations

import argparse

from ..planner.step_estimate import DEFAULT_ATTENTION_EFFICIENCY
from .parser import CHIPS, add_output_args, add_prompt_args, add_runtime_args, add_size_args, mesh_arg, positive

DESCRIPTION = """diffusers-tpu: generate a video with a stock diffusers pipeline on TPU (or any JAX platform).

    diffusers-tpu generate --output video.mp4                      # one shot, the built-in demo model
    diffusers-tpu generate --stage-dir run1 --output video.mp4     # staged: encode -> denoise -> decode on disk
    diffusers-tpu encode --stage-dir run1 --prompt "..."           # or one stage at a time; a run killed after
    diffusers-tpu denoise --stage-dir run1                         # denoise is finished by `decode` alone
    diffusers-tpu decode --stage-dir run1 --output video.mp4
    diffusers-tpu plan --arch Wan2.1-14B --chips v6e-8             # will it fit? (no TPU needed)
"""
BENCH_MODEL = "tiny:wan"  # the default: the random-weight tiny Wan the CPU tables were recorded with
# name -> default threshold, interval or skip range
CACHES = {"fbc": 0.05, "mag": 0.06, "sea": 0.25, "taylor": 5, "pab": 2, "faster": 2, "textkv": None}


def cache_arg(text: str) -> str:
    """``--cache fbc|mag|sea[:threshold]``, ``taylor[:interval]``, ``pab[:range]``, ``faster[:range]``, ``textkv``."""
    name, _, value = text.partition(":")
    try:
        whole = name in ("taylor", "pab", "faster")
        if name not in CACHES or value and (float(value) <= 0 or whole and (not value.isdigit() or int(value) < 2)):
            raise ValueError
        if name == "textkv" and value:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--cache takes fbc[:threshold], mag[:threshold], sea[:threshold], taylor[:interval], pab[:range], "
            f"faster[:range] (whole numbers of at least 2) or textkv (no setting), got {text!r}"
        ) from None
    return text


def _bench(parser) -> None:
    add_runtime_args(parser, default_model=BENCH_MODEL)
    add_size_args(parser)
    parser.add_argument(
        "--arch",
        help="a real-size architecture with random weights, no download: "
        "Wan2.1-1.3B, Wan2.1-14B, CogVideoX1.5-5B, HunyuanVideo-1.5-8.3B, CausalWan2.1-1.3B (--blocks)",
    )
    parser.add_argument("--prompt", default="A cat walks on the grass, realistic")
    parser.add_argument("--negative-prompt", default="blurry, low quality, static")
    parser.add_argument("--guidance", type=float, default=5.0)
    parser.add_argument("--runs", type=positive("--runs"), default=3, help="timed calls (after warm-up)")
    parser.add_argument("--warmup", type=positive("--warmup"), default=1, help="warm-up calls (they compile)")
    parser.add_argument("--vs", choices=("torch",), help="also run stock diffusers on torch (CUDA if present)")
    parser.add_argument("--json", help="write the report to this file")
    parser.add_argument("--trace", help="write a jax.profiler trace of the first timed call to this directory")
    parser.add_argument(
        "--cache",
        type=cache_arg,
        help="a diffusers step cache on the denoiser: fbc[:threshold] (FirstBlockCache), mag[:threshold] (MagCache, "
        "FLUX_MAG_RATIOS as a stand-in), sea[:threshold] (SeaCache), taylor[:interval] (TaylorSeer on the attention "
        "layers), pab[:range] (Pyramid Attention Broadcast, spatial), faster[:range] (FasterCache; pipelines that "
        "batch the guidance pair themselves, as CogVideoX) or textkv (TextKVCache, NucleusMoE-Image); reports the "
        "cached denoiser passes and the speed-up over the same JAX run without it",
    )


def _profile(parser) -> None:
    add_runtime_args(parser, default_model="tiny:wan")
    add_size_args(parser)
    parser.add_argument("--arch", help="a real-size architecture with random weights (see bench --arch)")
    parser.add_argument("--prompt", default="A cat walks on the grass, realistic")
    parser.add_argument("--negative-prompt", default="blurry, low quality, static")
    parser.add_argument("--guidance", type=float, default=5.0)
    parser.add_argument("--runs", type=positive("--runs"), default=5, help="timed steps per side (after warm-up)")
    parser.add_argument("--vs", choices=("torch",), help="also time and profile stock torch eager on the same inputs")
    parser.add_argument("--torch-compile", action="store_true", help="also time torch.compile(transformer)")
    parser.add_argument(
        "--torch-only",
        action="store_true",
        help="skip the JAX side (on a GPU, torch's and JAX's "
        "profilers both need CUPTI: profile each side in its own process)",
    )
    parser.add_argument("--json", help="write the report (with the top kernels of each side) to this file")
    parser.add_argument("--trace", help="keep the JAX side's jax.profiler trace of one step in this folder")


def _plan(parser) -> None:
    parser.add_argument(
        "--arch",
        help="a real-size architecture (no weights): Wan2.1-1.3B, Wan2.1-14B, "
        "CogVideoX1.5-5B, HunyuanVideo-1.5-8.3B, CausalWan2.1-1.3B",
    )
    parser.add_argument(
        "--model", help="a local Wan, CogVideoX or HunyuanVideo-1.5 pipeline folder, or a tiny model (tiny:wan, ...)"
    )
    parser.add_argument("--height", type=positive("--height"), default=480)
    parser.add_argument("--width", type=positive("--width"), default=832)
    parser.add_argument("--frames", type=positive("--frames"), default=81)
    parser.add_argument(
        "--steps", type=positive("--steps"), default=50, help="denoising steps (for the floor of the whole run)"
    )
    parser.add_argument("--max-sequence-length", type=int, help="text tokens (default: the pipeline's own)")
    parser.add_argument("--guidance", type=float, default=5.0)
    parser.add_argument(
        "--chips",
        choices=sorted(CHIPS),
        metavar="NAME",
        help="the target: a TPU slice or NVIDIA "
        "GPUs (one, or an 8-GPU node), its device count, memory and bf16 peak: "
        + ", ".join(
            f"{name} ({chip.devices} x {chip.hbm_gib:g} GiB, {chip.peak_tflops:g} TFLOP/s)"
            for name, chip in CHIPS.items()
        )
        + ". On a GPU, JAX allocates from a pool of XLA_PYTHON_CLIENT_MEM_FRACTION (default 0.75) of "
        "the memory: the plan uses that, read from the environment",
    )
    parser.add_argument(
        "--vae-compile",
        choices=("auto", "quick", "full", "tiered"),
        default="auto",
        help="how the VAE's programs are built (TPUConfig.vae_compile; auto: XLA's quick effort on TPU): what is "
        "compiled and planned",
    )
    parser.add_argument("--mesh", type=mesh_arg, help="dp,sp,tp to plan (default: try every candidate)")
    parser.add_argument("--hbm-gb", type=float, help="HBM per device in GiB (with --mesh, instead of --chips)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--quantize", choices=("int8", "fp8"), help="plan only this weight format")
    parser.add_argument(
        "--text-encoder",
        choices=("auto", "host", "jax"),
        default="auto",
        help="where the text encoders are planned: auto (default) as pipe.to's rule places them on "
        "the target (TPUConfig(text_encoder='auto')), host, or jax (on the devices)",
    )
    parser.add_argument("--json", help="write the report to this file")
    parser.add_argument(
        "--compiler",
        choices=("auto", "tpu", "cpu", "both"),
        default="auto",
        help="what compiles the planned programs: tpu = the real TPU compiler for the --chips slice "
        "(libtpu installed, no TPU needed); cpu = XLA:CPU on simulated devices, an estimate; auto "
        "(default) = tpu for a TPU slice when libtpu is installed, else cpu; both = each candidate "
        "by both, the CPU estimate's error shown",
    )
    parser.add_argument(
        "--weights-sharding",
        choices=("auto", "rules", "full"),
        default="auto",
        help="rules: each weight sharded as the model's tensor-parallel rules say (replicated over dp "
        "and sp); full: the repeated blocks' weights over every mesh axis, gathered per layer "
        "(TPUConfig(fully_sharded_weights=True)); auto (default): rules, then full where rules do "
        "not fit, before int8",
    )
    parser.add_argument(
        "--weights-in-host-memory",
        choices=("auto", "no", "yes"),
        default="auto",
        help="plan the weights stored in host memory, each layer streamed into the step "
        "(TPUConfig(weights_in_host_memory=True)): auto (default) after the device-memory layouts, before int8; "
        "no: never; yes: only that",
    )
    parser.add_argument(
        "--no-vae",
        action="store_true",
        help="the denoiser steps only (the VAE decode not planned; its weights still counted)",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="with the TPU compiler: compile every candidate (default: "
        "candidates in order of preference until one fits; each TPU compile of a real-size step takes "
        "about half a minute here)",
    )
    parser.add_argument(
        "--first-fit",
        action="store_true",
        help="with the TPU compiler: take the first candidate in order of preference that fits (default: compile "
        "every candidate of the weight format that first fits and take the fastest by the step estimate)",
    )
    _attention_efficiency(parser, "the step estimate that ranks the candidates")
    parser.add_argument(
        "--compiler-estimate",
        action="store_true",
        help="with the TPU compiler: also estimate each fitting candidate's step by the TPU compiler's own run-time "
        "estimate (libtpu's optimal_seconds, made whole: 2 more quick compiles a candidate, of the step cut to 1 and "
        "2 blocks) and rank by it",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="on a TPU or GPU: run the recommended configuration "
        "(random weights for --arch) for 2 steps and report the measured peak memory beside the plan",
    )


def _cost(parser) -> None:
    parser.add_argument(
        "--arch",
        help="a real-size architecture (no weights): Wan2.1-1.3B, Wan2.1-14B, "
        "CogVideoX1.5-5B, HunyuanVideo-1.5-8.3B, CausalWan2.1-1.3B",
    )
    parser.add_argument("--model", help="a local Wan, CogVideoX or HunyuanVideo-1.5 pipeline folder, or a tiny model")
    parser.add_argument(
        "--chips",
        required=True,
        metavar="NAME",
        help="the TPU slice to compile for: " + ", ".join(n for n, c in CHIPS.items() if c.topology),
    )
    parser.add_argument("--mesh", type=mesh_arg, help="dp,sp,tp (default: the mesh pipe.to would build)")
    parser.add_argument("--height", type=positive("--height"), default=480)
    parser.add_argument("--width", type=positive("--width"), default=832)
    parser.add_argument("--frames", type=positive("--frames"), default=81)
    parser.add_argument("--max-sequence-length", type=int, help="text tokens (default: the pipeline's own)")
    parser.add_argument("--guidance", type=float, default=5.0)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--quantize", choices=("int8", "fp8"))
    parser.add_argument(
        "--weights-in-host-memory",
        action="store_true",
        help="every weight stored in host memory, streamed into the step (TPUConfig(weights_in_host_memory=True): "
        "what enable_sequential_cpu_offload does)",
    )
    parser.add_argument("--no-vae", action="store_true", help="the denoiser step only")
    parser.add_argument(
        "--vae-compile",
        choices=("auto", "quick", "full", "tiered"),
        default="auto",
        help="how the VAE's programs are built (TPUConfig.vae_compile; auto: XLA's quick effort on TPU): what is "
        "compiled and planned",
    )
    parser.add_argument(
        "--estimate", action="store_true", help="also a roofline estimate of the step (labelled, with its assumptions)"
    )
    _attention_efficiency(parser, "--estimate")
    parser.add_argument("--json", help="write the report to this file")


def _attention_efficiency(parser, used_by: str) -> None:
    parser.add_argument(
        "--attention-efficiency",
        type=float,
        default=DEFAULT_ATTENTION_EFFICIENCY,
        help=f"for {used_by}: the fraction of the chip's bf16 peak the attention kernel is assumed to reach "
        f"(default {DEFAULT_ATTENTION_EFFICIENCY}; an assumption, not a measurement)",
    )


def _ready(parser) -> None:
    _cost(parser)
    parser.add_argument(
        "--text-encoder",
        choices=("host", "jax"),
        default="host",
        help="jax: the text encoders' programs too (as TPUConfig(text_encoder='jax') runs them)",
    )
    parser.add_argument(
        "--workers", type=positive("--workers"), help="programs compiled at once (default: cores, <= 8)"
    )
    parser.add_argument(
        "--vae-tiling", action="store_true", help="the VAE decode as pipe.vae.enable_tiling() runs it (tile by tile)"
    )


def _compile(parser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument(
        "--chips",
        metavar="NAME",
        help="build for this TPU slice, on any machine: " + ", ".join(n for n, c in CHIPS.items() if c.topology),
    )
    where.add_argument("--local", action="store_true", help="build for this machine's own devices (CPU or GPU)")
    parser.add_argument(
        "--arch",
        help="a real-size architecture (--chips: no weights; --local: random ones): Wan2.1-1.3B, Wan2.1-14B, "
        "CogVideoX1.5-5B, HunyuanVideo-1.5-8.3B",
    )
    parser.add_argument("--model", help="a local pipeline folder, or a tiny model")
    parser.add_argument("--output", required=True, help="the programs folder (created if missing)")
    parser.add_argument("--mesh", type=mesh_arg, help="dp,sp,tp (default: the mesh pipe.to would build)")
    parser.add_argument("--height", type=positive("--height"), default=480)
    parser.add_argument("--width", type=positive("--width"), default=832)
    parser.add_argument("--frames", type=positive("--frames"), default=81)
    parser.add_argument("--steps", type=positive("--steps"), default=50, help="--local: the step count you will serve")
    parser.add_argument("--max-sequence-length", type=int, help="text tokens (default: the pipeline's own)")
    parser.add_argument("--guidance", type=float, default=5.0)
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument(
        "--vae-compile",
        choices=("auto", "quick", "full", "tiered"),
        default="auto",
        help="how the VAE's programs are built (TPUConfig.vae_compile): the runtime must use the same",
    )
    parser.add_argument(
        "--workers", type=positive("--workers"), help="programs compiled at once (default: cores, <= 8)"
    )
    parser.add_argument("--json", help="write the report to this file")


def _generate(parser) -> None:
    for add in (add_runtime_args, add_prompt_args, add_size_args, add_output_args):
        add(parser)
    parser.add_argument("--stage-dir", help="run staged, keeping each stage's output in this directory")
    parser.add_argument("--stop-after", choices=("encode", "denoise"), help="with --stage-dir: stop after this stage")
    parser.add_argument("--force", action="store_true", help="with --stage-dir: recompute stages that already exist")


STAGES = {"encode": "prompt -> embeddings", "denoise": "embeddings -> latents", "decode": "latents -> video"}


def _stage(parser, name: str) -> None:
    parser.add_argument("--stage-dir", required=True)
    parser.add_argument("--force", action="store_true", help="recompute even if the stage's output exists")
    add_runtime_args(parser, model=True)
    if name == "encode":
        add_prompt_args(parser)
    if name == "denoise":
        add_size_args(parser)
    if name == "decode":
        add_output_args(parser)


def add_all(commands) -> None:
    _generate(commands.add_parser("generate", help="text-to-video, one shot or staged (--stage-dir)"))
    _bench(commands.add_parser("bench", help="per-stage timings, compile accounting, MFU; --vs torch"))
    _profile(commands.add_parser("profile", help="one denoising step's kernels by category, JAX beside torch"))
    _plan(commands.add_parser("plan", help="will it fit? XLA's memory analysis of the denoiser step per device"))
    _cost(
        commands.add_parser(
            "cost",
            help="what the TPU compiler makes of the step and VAE programs, per layer, for a TPU slice (no TPU needed)",
        )
    )
    _ready(
        commands.add_parser(
            "ready",
            help="time to ready: every program of a first call compiled for a TPU slice, timed (no TPU needed)",
        )
    )
    _compile(
        commands.add_parser(
            "compile",
            help="build every program of a call ahead into a folder (TPU slices on any machine, or this machine)",
        )
    )
    for name, help_text in STAGES.items():
        _stage(commands.add_parser(name, help=f"stage: {help_text} (in --stage-dir)"), name)


def build() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diffusers-tpu", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_all(parser.add_subparsers(dest="command", required=True))
    return parser
