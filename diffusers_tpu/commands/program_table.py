"""Every program of a first call on a TPU slice, built as ``plan`` lowers them, and the table ``ready`` and ``compile``
print of them, a row each."""

from __future__ import annotations

import inspect
import os
from concurrent.futures import ThreadPoolExecutor

from ..planner import plan

GIB = 1 << 30


def text_tokens(pipe) -> int | None:
    """The text length a call pads prompts to: the pipeline's own ``max_sequence_length`` default."""
    default = inspect.signature(pipe.__call__).parameters.get("max_sequence_length")
    return default.default if default is not None else None


def programs_of(report: dict) -> list[tuple[str, dict]]:
    """``(name, analysis)`` of every program compiled for a ``plan.start_denoiser_memory`` report."""
    rows = [
        (f"denoiser step{f' (pass {n + 1})' if len(report['passes']) > 1 else ''}", step)
        for n, step in enumerate(report["passes"])
    ]
    for group in ("vae_decode", "text_encoders"):
        found = report.get(group) or {}
        named = {f"program {n + 1}": a for n, a in enumerate(found.get("programs", []))}
        named.update({name: a for name, a in found.items() if isinstance(a, dict) and "temp_bytes" in a})
        for name, analysis in named.items():
            label = f"{group.replace('_', ' ')}: {name}"
            for build in analysis.get("tiers", [analysis]):  # a tiered program: both builds
                rows.append((f"{label} [{build.get('tier', 'full')}]", build))
    return rows


def every_program(args, pipe, size: dict, config, devices, analyse, doing: str) -> tuple[dict, list[tuple[str, dict]]]:
    """Every program of a first call of ``pipe`` on ``args.chips``'s slice, built ``--workers`` at a time by
    ``analyse(lowered)`` (XLA compiles without the GIL, as ``warm_up`` builds them); the report's head (model, slice,
    size, mesh, workers) and its rows ``(name, analysis)``."""
    tokens = args.max_sequence_length or text_tokens(pipe)
    workers = args.workers or min(os.cpu_count() or 1, 8)
    print(f"{doing} for {args.chips} ({devices[0].device_kind}), {workers} at a time ...", flush=True)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        report = plan.start_denoiser_memory(
            pipe, size, config, devices, tokens, vae=True, compiler=pool, analyse=analyse
        )()
    head = {
        "model": args.arch or args.model,
        "chips": args.chips,
        "device_kind": devices[0].device_kind,
        "size": dict(size, text_tokens=tokens),
        "mesh": report["mesh"],
        "vae_compile": args.vae_compile,
        "workers": workers,
    }
    return head, programs_of(report)


def _estimate(row: dict) -> str:
    seconds = row.get("compiler_seconds")
    if seconds is None:
        return "-"
    return f"{seconds:.3g}{'*' if row.get('has_loops') else ''}"


def render(result: dict) -> str:
    size = result["size"]
    lines = [
        f"{result['model']} {size['height']}x{size['width']}x{size['num_frames']} on {result['chips']} "
        f"({result['device_kind']}), mesh {result['mesh']}, VAE compile {result['vae_compile']}:",
        f"  {'program':<44}{'compile s':>10}{'code MB':>10}{'temp GiB':>10}{'libtpu est. s':>15}",
    ]
    for row in result["programs"]:
        if row.get("refused"):
            lines.append(f"  {row['program']:<44}{row['compile_seconds'] or 0:>10.1f}  refused: {row['refused']}")
            continue
        lines.append(
            f"  {row['program']:<44}{row['compile_seconds'] or 0:>10.1f}{row['generated_code_bytes'] / 1e6:>10.1f}"
            f"{row['temp_bytes'] / GIB:>10.2f}{_estimate(row):>15}"
        )
    if any(row.get("compiler_seconds") is not None for row in result["programs"]):
        lines.append(
            "  libtpu est.: the TPU compiler's own run-time estimate of one run (cost_analysis' optimal_seconds: a "
            "per-op roofline of XLA's ops, Pallas kernels left out; * a loop's body counted once); none (-) where "
            "libtpu gives none (a program holding its own ConcatBitcast calls, as a real-size full-effort step does)"
        )
    lines.append(
        f"  sum of compile seconds {result['compile_seconds_sum']} s; ready after {result['wall_seconds']} s "
        f"({result['workers']} at a time; tracing and lowering included; the small eager programs between them not)"
    )
    return "\n".join(lines)
