"""``diffusers-tpu profile``: where one denoising step's time goes, JAX beside stock torch, on the same inputs.

The stock pipeline runs one step on torch (CUDA when present) while the denoiser's calls are recorded; those exact
inputs then drive (1) stock torch eager, (2) ``torch.compile(transformer)`` with ``--torch-compile``, (3) the JAX
program the runtime compiles for ``pipe.to("tpu")``. Each is warmed up, timed (median of ``--runs``, after the
device finishes), and profiled for one step (``torch.profiler`` / ``jax.profiler``); kernels are sorted into the
categories of ``kernel_breakdown``. A step is every denoiser call the pipeline makes per step (Wan: the
conditional and the unconditional pass).
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time

import jax
import torch
from torch.profiler import ProfilerActivity, profile

from ..interop import backend, user_tensors
from ..interop.compile_accounting import compile_log
from ..interop.torch_private import pytree
from ..planner import architectures
from ..runtime.attach import pipeline_runtime
from ..runtime.files import outputs
from ..runtime.files.stages import call_defaults
from ..runtime.registry import family_of
from . import kernel_breakdown
from .arguments import call_sizes, device_for, load_pipeline, sequence_length, timing_config
from .measures import peak_memory, peak_tflops, versions


def _host_copy(value):
    return value.detach().cpu().clone() if isinstance(value, torch.Tensor) else value


def capture_step(pipe, call: dict, device: str) -> tuple[str, list]:
    """(denoiser name, [(args, kwargs) of each denoiser call in one stock step]) recorded on torch ``device``."""
    names = [n for n in family_of(pipe).denoisers if getattr(pipe, n, None) is not None]
    name = names[0]
    module, calls = getattr(pipe, name), []
    stock = module.forward

    def recording(*args, **kwargs):
        calls.append(pytree.tree_map(_host_copy, (args, kwargs)))
        return stock(*args, **kwargs)

    module.forward = recording
    try:
        pipe.to(device)
        pipe(**dict(call, num_inference_steps=1, output_type="latent"), generator=torch.Generator().manual_seed(0))
    finally:
        del module.forward
    return name, calls


def _timed(step, sync, runs: int, warmup: int) -> dict:
    start = time.perf_counter()
    for _ in range(warmup):
        sync(step())
    first = time.perf_counter() - start
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        sync(step())
        seconds.append(time.perf_counter() - start)
    return {"median_s": statistics.median(seconds), "min_s": min(seconds), "runs": runs, "warmup_s": first}


def torch_step(module, calls: list, device: str, runs: int, compiled: bool = False) -> dict:
    """Stock torch (eager, or ``torch.compile``) on the recorded inputs: timing, one profiled step, peak memory."""
    module.to(device)
    moved = [pytree.tree_map(lambda x: x.to(device) if isinstance(x, torch.Tensor) else x, c) for c in calls]
    target = torch.compile(module) if compiled else module
    cuda = device == "cuda"
    sync = (lambda _: torch.cuda.synchronize()) if cuda else (lambda _: None)

    def step():
        out = None
        for args, kwargs in moved:
            out = target(*args, **kwargs)
        return out

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        timing = _timed(step, sync, runs, warmup=2 if compiled else 1)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
        with profile(activities=activities) as prof:
            sync(step())
    timing["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated()) if cuda else None
    timing["breakdown"] = kernel_breakdown.summarize(kernel_breakdown.torch_kernels(prof))
    return timing


def jax_step(pipe, name: str, calls: list, runs: int, trace: str | None = None) -> dict:
    """The runtime's compiled denoiser program on the recorded inputs (the pipeline must be attached); ``trace``:
    keep the profiled step's ``jax.profiler`` trace in this folder (else a temporary one)."""

    runtime = pipeline_runtime.runtime_of(pipe)
    module = getattr(pipe, name)
    with runtime.call_scope():
        moved = [user_tensors.to_device(c) for c in calls]

        def step():
            out = None
            for args, kwargs in moved:
                out = module(*args, **kwargs)
            return out

        with compile_log() as warm:
            start = time.perf_counter()
            backend.synchronize(step())
            first = time.perf_counter() - start
        with compile_log() as timed:
            timing = dict(_timed(step, backend.synchronize, runs, warmup=0), warmup_s=first)
        folder = contextlib.nullcontext(trace) if trace else tempfile.TemporaryDirectory()
        with folder as directory:
            with jax.profiler.trace(directory, create_perfetto_trace=True):
                backend.synchronize(step())
            kernels = kernel_breakdown.jax_kernels(directory)
    timing.update(
        compile_seconds=warm.seconds,
        compilations=warm.compilations,
        recompilations_after_warmup=timed.compilations,
        peak_memory_bytes=peak_memory(pipe, False),
        breakdown=kernel_breakdown.summarize(kernels),
    )
    return timing


def _step_flops(pipe, call: dict, calls: list) -> int | None:
    family = family_of(pipe)
    if family.planning.forward_flops is None:
        return None
    per_sample = family.planning.forward_flops(
        pipe, call["height"], call["width"], call["num_frames"], call.get("max_sequence_length") or 0
    )
    batch = 0
    for args, kwargs in calls:
        latents = kwargs.get("hidden_states", args[0] if args else None)
        batch += latents.shape[0] if isinstance(latents, torch.Tensor) else 1
    return per_sample * batch


def run(args) -> dict:
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    device = device_for(args.platform)
    config = timing_config(args, dtype)
    model = args.arch or args.model or "tiny:wan"
    pipe = architectures.build(args.arch, dtype) if args.arch else load_pipeline(model)
    sizes = call_sizes(pipe, args, model)
    call = dict(
        prompt=args.prompt,
        negative_prompt=args.negative_prompt,
        height=sizes["height"],
        width=sizes["width"],
        num_frames=sizes["frames"],
        guidance_scale=args.guidance,
        max_sequence_length=sequence_length(pipe, model) or call_defaults(pipe).get("max_sequence_length"),
    )
    torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    name, calls = capture_step(pipe, call, torch_device)
    report = {
        "versions": versions(),
        "model": model,
        "pipeline": type(pipe).__name__,
        "denoiser": name,
        "settings": dict(sizes, dtype=args.dtype, runs=args.runs, calls_per_step=len(calls)),
        "flop_per_step": _step_flops(pipe, call, calls),
    }
    module = getattr(pipe, name)
    if args.vs == "torch":
        report["torch"] = dict(
            torch_step(module, calls, torch_device, args.runs),
            device=torch_device,
            device_kind=torch.cuda.get_device_name() if torch_device == "cuda" else "cpu",
        )
        print(
            kernel_breakdown.format_breakdown(
                "stock torch eager", report["torch"]["breakdown"], report["torch"]["median_s"]
            ),
            flush=True,
        )
    if args.torch_compile:
        torch.compiler.reset()
        try:
            report["torch_compile"] = torch_step(module, calls, torch_device, args.runs, compiled=True)
        except Exception as error:  # noqa: BLE001 (a reference that fails is reported, the JAX side still runs)
            report["torch_compile_error"] = f"{type(error).__name__}: {error}"[:400]
            print(f"torch.compile failed: {report['torch_compile_error']}", flush=True)
    if args.torch_only:
        kind = torch.cuda.get_device_name() if torch_device == "cuda" else None
        return _rates(report, peak_tflops(kind) if kind else None)
    pipe.to("cpu")
    if torch_device == "cuda":
        torch.cuda.empty_cache()  # hand torch's blocks back before JAX allocates on the same GPU
    pipe.to(device, config=config)
    attached = pipeline_runtime.runtime_of(pipe)
    report["jax"] = jax_step(pipe, name, calls, args.runs, args.trace)
    devices = list(attached.mesh.devices.flat)
    report["jax"].update(
        platform=attached.target.platform,
        device_kind=devices[0].device_kind,
        devices=len(devices),
        attention=attached.attention.implementation,
        matmul_precision=attached.config.matmul_precision,
    )
    accelerator = report["jax"]["platform"] != "cpu"
    return _rates(report, peak_tflops(report["jax"]["device_kind"]) if accelerator else None)


def _rates(report: dict, peak: float | None) -> dict:
    """TFLOP/s per side, and MFU against ``peak`` (None off accelerators: no meaningful peak)."""
    for side in ("torch", "torch_compile", "jax"):
        entry = report.get(side)
        if entry and report["flop_per_step"]:
            entry["tflops"] = report["flop_per_step"] / entry["median_s"] / 1e12
            entry["mfu"] = entry["tflops"] / peak if peak else None
    return report


def format_report(report: dict) -> str:
    labels = {"torch": "stock torch eager", "torch_compile": "torch.compile", "jax": "JAX (diffusers_tpu)"}
    lines = [
        f"{report['pipeline']} one step ({report['settings']['calls_per_step']} {report['denoiser']} calls), "
        f"{report['settings']}"
    ]
    jax_side = report.get("jax")
    for side, label in labels.items():
        entry = report.get(side)
        if not entry:
            continue
        extra = f", {entry['tflops']:.0f} TFLOP/s" if entry.get("tflops") else ""
        extra += f", MFU {entry['mfu']:.1%}" if entry.get("mfu") else ""
        extra += f", peak {entry['peak_memory_bytes'] / 2**30:.2f} GiB" if entry.get("peak_memory_bytes") else ""
        speed = (
            f", {entry['median_s'] / jax_side['median_s']:.2f}x of JAX's speed" if jax_side and side != "jax" else ""
        )
        lines.append(f"{label}: step {entry['median_s'] * 1e3:.1f} ms (median of {entry['runs']}){extra}{speed}")
        lines.append(kernel_breakdown.format_breakdown("  kernels", entry["breakdown"], entry["median_s"]))
    if not jax_side:
        return "\n".join(lines)
    lines.append(
        f"JAX matmul precision {jax_side['matmul_precision']}; compile {jax_side['compile_seconds']:.1f} s, "
        f"{jax_side['compilations']} programs, recompilations after warm-up: "
        f"{jax_side['recompilations_after_warmup']}"
    )
    if jax_side["platform"] == "cpu":
        lines.append("CPU numbers are not speed claims.")
    return "\n".join(lines)


def check_arguments(args) -> None:
    """Refuse combinations that would profile nothing, before any weight is built."""
    if args.torch_only and args.vs != "torch" and not args.torch_compile:
        raise ValueError(
            "profile --torch-only skips the JAX side, so it needs a torch side: add --vs torch "
            "(and/or --torch-compile)."
        )


def main(args) -> int:
    check_arguments(args)
    if args.json:
        outputs.check_destination(args.json, what="--json")
    report = run(args)
    print(format_report(report), flush=True)
    if args.json:
        outputs.write_text(args.json, json.dumps(report, indent=2))
    return 0
