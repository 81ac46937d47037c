"""``diffusers-tpu bench``: per-stage timings (mean / median / P95), compile accounting, analytic MFU, and the same
pipeline on stock torch side by side.

Stages are timed through the stock pipeline's own seams — ``encode_prompt``, the progress bar's per-step updates,
``vae.decode``, ``video_processor.postprocess_video`` — so the same timer measures a JAX pipeline and a torch one.
Every stage waits for the device (``block_until_ready`` / ``cuda.synchronize``) before its clock stops: dispatch
time is not compute time. Warm-up calls are reported apart (they include compilation); any compilation during
the timed calls is a recompilation, which is a bug, and is reported as such.

The timer and one measured run are ``stage_timer``; the loop's host work per step (``host_work``) comes from one more
call; this module runs the comparison and prints the report.
"""

from __future__ import annotations

import datetime
import json

import diffusers
import numpy as np
import torch
from diffusers import (
    FasterCacheConfig,
    FirstBlockCacheConfig,
    MagCacheConfig,
    PyramidAttentionBroadcastConfig,
    TaylorSeerCacheConfig,
)
from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

from ..planner import architectures
from ..runtime.attach import pipeline_runtime
from ..runtime.files import outputs
from ..runtime.files.stages import call_defaults
from ..runtime.registry import family_of
from . import host_work, stage_timer
from .arguments import call_sizes, device_for, load_pipeline, sequence_length, timing_config
from .measures import PEAK_TFLOPS, peak_tflops  # noqa: F401
from .measures import versions as _versions
from .pipeline_call import call_arguments
from .subcommand_arguments import BENCH_MODEL, CACHES


def flops_report(pipe, call: dict, stages: dict, num_devices: int, device_kind: str) -> dict:
    family = family_of(pipe)
    if family.planning.forward_flops is None or "steps" not in stages:
        return {}
    prompts = call["prompt"] if isinstance(call["prompt"], list) else [call["prompt"]]
    guider = getattr(pipe, "guider", None)
    scale = call.get("guidance_scale", getattr(guider, "guidance_scale", 1.0))
    cfg = 2 if scale is not None and scale > 1.0 else 1
    text = call.get("max_sequence_length") or 0  # families with fixed text lengths count their own
    per_forward = family.planning.forward_flops(pipe, call["height"], call["width"], call["num_frames"], text)
    per_step = per_forward * len(prompts) * cfg
    achieved = per_step / stages["steps"]["median_s"]
    peak = peak_tflops(device_kind)
    return {
        "per_forward_per_sample": per_forward,
        "per_step": per_step,
        "achieved_tflops": achieved / 1e12,
        "peak_tflops_per_chip": peak,
        "chips": num_devices,
        "mfu": achieved / (peak * 1e12 * num_devices) if peak else None,
    }


def run(args) -> dict:
    """The whole benchmark for parsed ``diffusers-tpu bench`` arguments; returns the JSON-able report."""
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    device = device_for(args.platform)  # a bad platform fails before any weight is built
    config = timing_config(args, dtype)
    model = args.arch or args.model or BENCH_MODEL
    pipe = architectures.build(args.arch, dtype) if args.arch else load_pipeline(model)
    check_cache(pipe, args.cache)
    sizes = call_sizes(pipe, args, model)
    sequence = sequence_length(pipe, model)
    call = dict(
        prompt=args.prompt,
        negative_prompt=args.negative_prompt,
        height=sizes["height"],
        width=sizes["width"],
        num_frames=sizes["frames"],
        num_inference_steps=sizes["steps"],
        guidance_scale=args.guidance,
        output_type="pil",
        max_sequence_length=sequence or call_defaults(pipe).get("max_sequence_length"),
    )
    if args.blocks is not None:
        call["num_blocks"] = args.blocks
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": _versions(),
        "model": model,
        "pipeline": type(pipe).__name__,
        "settings": {
            k: v for k, v in call_arguments(pipe, call).items() if k not in ("prompt", "negative_prompt", "output_type")
        }
        | {"batch": 1, "dtype": args.dtype, "runs": args.runs, "warmup": args.warmup},
    }
    torch_frames = None
    if args.cache:
        report["settings"]["cache"] = args.cache
    if args.vs == "torch":
        torch_device = "cuda" if torch.cuda.is_available() else "cpu"
        pipe.to(torch_device)
        enable_cache(pipe, args.cache, sizes["steps"])
        measured, torch_frames = stage_timer.measure(pipe, dict(call), args.runs, args.warmup)
        disable_cache(pipe, args.cache)
        kind = torch.cuda.get_device_name() if torch_device == "cuda" else "cpu"
        measured.update(
            device=torch_device,
            device_kind=kind,
            flops=flops_report(pipe, call, measured["stages"], 1, kind) if torch_device == "cuda" else {},
        )
        report["torch"] = measured
        pipe.to("cpu")
        if torch_device == "cuda":  # hand torch's cached blocks back before JAX allocates on the same GPU
            torch.cuda.empty_cache()
    pipe.to(device, config=config)
    attached = pipeline_runtime.runtime_of(pipe)
    if args.cache:  # the same run without the cache first: the cache's speed-up on this platform
        uncached, _ = stage_timer.measure(pipe, dict(call), args.runs, args.warmup)
        report["jax_uncached"] = {"stages": uncached["stages"]}
        enable_cache(pipe, args.cache, sizes["steps"])
    measured, frames = stage_timer.measure(pipe, dict(call), args.runs, args.warmup, args.trace)
    if args.cache:
        before, after = _loop_seconds(uncached["stages"]), _loop_seconds(measured["stages"])
        measured["cache"]["denoise_speedup"] = before / after if before and after else None
    devices = list(attached.mesh.devices.flat)
    measured.update(
        platform=attached.target.platform,
        device_kind=devices[0].device_kind,
        devices=len(devices),
        mesh=dict(attached.mesh.shape),
        attention=attached.attention.implementation,
        matmul_precision=attached.config.matmul_precision,
        quantize=attached.config.quantize,
    )
    measured["flops"] = flops_report(pipe, call, measured["stages"], len(devices), devices[0].device_kind)
    if attached.target.platform == "cpu" and measured["flops"]:
        measured["flops"]["mfu"] = None  # CPU: no meaningful peak
    measured["loop"] = host_work.loop_figures(pipe, dict(call))  # one more call, its programs timed apart
    report["jax"] = measured
    if torch_frames is not None:
        diff = np.abs(frames - torch_frames)
        report["max_output_difference_levels"] = int(diff.max())
        report["output_difference_fraction"] = float((diff > 0).mean())
        report["speedup_torch_over_jax"] = {
            stage: report["torch"]["stages"][stage]["median_s"] / measured["stages"][stage]["median_s"]
            for stage in measured["stages"]
            if stage in report["torch"]["stages"]
        }
    return report


def _loop_seconds(stages: dict) -> float | None:
    steps = stages.get("steps")
    return steps["mean_s"] * steps["count"] if steps and steps.get("count") else None


def check_cache(pipe, spec: str | None) -> None:
    """``--cache`` refused before anything runs where diffusers or the pipeline has no such cache."""
    name = (spec or "").partition(":")[0]
    if name == "sea" and not hasattr(diffusers, "SeaCacheConfig"):
        raise ValueError(f"--cache sea: SeaCache is in diffusers 0.42 and later, not {diffusers.__version__}.")
    if name == "textkv" and type(pipe).__name__ != "NucleusMoEImagePipeline":  # stock hooks only its blocks
        raise ValueError(
            f"--cache textkv: TextKVCache keeps NucleusMoE-Image's text keys and values, not "
            f"{type(pipe).__name__}'s; try --model tiny:nucleusmoe-image."
        )


def enable_cache(pipe, spec: str | None, steps: int) -> None:
    """A diffusers step cache on every denoiser: FirstBlockCache, MagCache with diffusers' FLUX_MAG_RATIOS
    interpolated to the step count (a stand-in: real runs calibrate ratios for their model), TaylorSeer on every
    block's attention layers (factors in bfloat16), Pyramid Attention Broadcast on the spatial attention, SeaCache,
    FasterCache (its stock ranges) or TextKVCache."""
    if not spec:
        return

    name, _, threshold = spec.partition(":")
    threshold = float(threshold) if threshold else CACHES[name]
    for denoiser in family_of(pipe).denoisers:
        module = getattr(pipe, denoiser, None)
        if module is None:
            continue
        if name == "fbc":
            module.enable_cache(FirstBlockCacheConfig(threshold=threshold))
        elif name == "taylor":
            # stock's default patterns end in "attn": they miss Wan's attn1 / attn2, so every attention layer is named
            attention = [r"(single_transformer_|transformer_)?blocks\.\d+\.attn\d?"]
            module.enable_cache(TaylorSeerCacheConfig(cache_interval=int(threshold), cache_identifiers=attention))
        elif name == "sea":
            module.enable_cache(diffusers.SeaCacheConfig(threshold=threshold))
        elif name == "faster":
            module.enable_cache(_faster_cache(pipe, int(threshold)))
        elif name == "textkv":
            module.enable_cache(diffusers.TextKVCacheConfig())
        elif name == "pab":
            module.enable_cache(
                PyramidAttentionBroadcastConfig(
                    spatial_attention_block_skip_range=int(threshold),
                    current_timestep_callback=lambda: pipe.current_timestep,
                )
            )
        else:
            module.enable_cache(
                MagCacheConfig(threshold=threshold, num_inference_steps=steps, mag_ratios=FLUX_MAG_RATIOS)
            )


def _faster_cache(pipe, skip_range: int):
    """FasterCache with stock's ranges: the attention layers compute every ``skip_range`` calls; the latents' layout
    (``tensor_format``) from the pipeline's class. Stock's FasterCache reads the denoiser's batch as the guidance
    pair's two halves: pipelines that run the pair as two calls (Wan's) fail in stock as in the runtime."""
    video = "BFCHW" if type(pipe).__name__.startswith("CogVideoX") else "BCFHW"
    return FasterCacheConfig(
        spatial_attention_block_skip_range=skip_range,
        current_timestep_callback=lambda: pipe.current_timestep,
        attention_weight_callback=lambda _: 0.5,  # stock's default, said here rather than warned about
        tensor_format=video if hasattr(pipe, "video_processor") else "BCHW",
    )


def disable_cache(pipe, spec: str | None) -> None:
    if spec:
        for denoiser in family_of(pipe).denoisers:
            module = getattr(pipe, denoiser, None)
            if module is not None:
                module.disable_cache()


def format_table(report: dict) -> str:
    jax_side, torch_side = report["jax"], report.get("torch")
    lines = [
        f"{report['pipeline']} ({report['model']}) {report['settings']}",
        f"JAX on {jax_side['platform']} ({jax_side['device_kind']} x{jax_side['devices']}, mesh {jax_side['mesh']}, "
        f"attention {jax_side['attention']}, matmul precision {jax_side.get('matmul_precision')}"
        + (f", {jax_side['quantize']} weights" if jax_side.get("quantize") else "")
        + ")"
        + (f" vs torch on {torch_side['device']}" if torch_side else ""),
    ]
    header = f"{'stage':<15}{'mean s':>10}{'median s':>10}{'p95 s':>10}"
    if torch_side:
        header += f"{'torch median':>14}{'torch/jax':>10}"
    lines.append(header)
    names = {
        "text_encoding": "text encoding",
        "steps": "denoise step",
        "vae_decode": "VAE decode",
        "postprocess": "postprocess",
        "end_to_end": "end to end",
    }
    for stage, label in names.items():
        entry = jax_side["stages"].get(stage)
        if not entry or not entry.get("count"):
            continue
        row = f"{label:<15}{entry['mean_s']:>10.4f}{entry['median_s']:>10.4f}{entry['p95_s']:>10.4f}"
        if torch_side and stage in torch_side["stages"]:
            row += f"{torch_side['stages'][stage]['median_s']:>14.4f}{report['speedup_torch_over_jax'][stage]:>10.2f}"
        lines.append(row)
    lines.extend(_block_lines(jax_side.get("blocks"), (torch_side or {}).get("blocks")))
    lines.extend(host_work.format_loop(report))
    warm, compiled = jax_side["warmup"], jax_side.get("compile", {})
    lines.append(
        f"first step (cold) {warm.get('first_step_s', 0):.3f} s; compile {compiled.get('seconds', 0):.2f} s, "
        f"{compiled.get('compilations', 0)} programs; recompilations after warm-up: "
        f"{compiled.get('recompilations_after_warmup', 0)}"
    )
    post = jax_side["stages"].get("postprocess", {})
    lines.append(
        f"device->host {post.get('bytes_to_host', 0) / 1e6:.2f} MB; peak device memory "
        + (f"{jax_side['peak_memory_bytes'] / 2**30:.2f} GiB" if jax_side.get("peak_memory_bytes") else "n/a")
    )
    for call, peaks in (jax_side.get("peak_memory_after_stage") or {}).items():
        if peaks:
            lines.append(
                f"peak device memory after each stage, {call.replace('_', ' ')}: "
                + ", ".join(f"{stage} {peak / 2**30:.2f} GiB" for stage, peak in peaks.items())
            )
    flops = jax_side.get("flops") or {}
    if flops:
        mfu = f"{flops['mfu']:.1%}" if flops.get("mfu") is not None else "n/a on this platform"
        lines.append(f"{flops['per_step']:.3e} FLOP/step, {flops['achieved_tflops']:.3f} TFLOP/s, MFU {mfu}")
    cache = jax_side.get("cache") or {}
    cache_name = str(report["settings"].get("cache")).partition(":")[0]
    if cache:
        speedup = cache.get("denoise_speedup")
        theirs = (torch_side or {}).get("cache") or {}
        lines.append(
            f"step cache {report['settings'].get('cache')}: {cache['cached_passes']} of "
            f"{cache['denoiser_passes']} denoiser passes cached"
            + (f" (torch: {theirs['cached_passes']} of {theirs['denoiser_passes']})" if theirs else "")
            + (" (it skips no pass: each block's text projections)" if cache_name == "textkv" else "")
            + (f"; denoising loop {speedup:.2f}x faster than without it" if speedup else "")
        )
    if "max_output_difference_levels" in report:
        lines.append(
            f"max output difference vs torch: {report['max_output_difference_levels']} levels on "
            f"{report['output_difference_fraction']:.4%} of subpixels"
        )
    if jax_side["platform"] == "cpu":
        lines.append("CPU numbers (Pallas kernels in interpret mode) are not speed claims.")
    return "\n".join(lines)


def _block_lines(blocks: dict | None, torch_blocks: dict | None) -> list[str]:
    if not blocks:
        return []
    lines = []
    for key, label in (("forward", "forward"), ("first_block", "first block"), ("block", "block (steady)")):
        entry = blocks[key]
        if entry.get("count"):
            row = f"{label:<15}{entry['mean_s']:>10.4f}{entry['median_s']:>10.4f}{entry['p95_s']:>10.4f}"
            if torch_blocks and torch_blocks[key].get("count"):
                theirs = torch_blocks[key]["median_s"]
                row += f"{theirs:>14.4f}{theirs / entry['median_s']:>10.2f}"
            lines.append(row)
    fps = f"{blocks['fps']:.1f}" if blocks.get("fps") else "n/a"
    lines.append(
        f"streaming: {blocks['frames_per_block']} frames per block, {fps} frames/s (steady blocks), "
        f"{blocks['forwards_per_block']} forwards per block; compilations after the first block: "
        f"{blocks['compilations_after_first_block']}"
    )
    return lines


def main(args) -> int:
    if args.json:
        outputs.check_destination(args.json, what="--json")  # before minutes of benchmarking
    report = run(args)
    print(format_table(report), flush=True)
    if args.json:
        outputs.write_text(args.json, json.dumps(report, indent=2))
    return 0
