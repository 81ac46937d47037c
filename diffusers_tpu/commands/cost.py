"""``diffusers-tpu cost``: what the TPU compiler makes of a pipeline's programs, for a TPU slice, without a TPU.

For a pipeline (``--arch``, a local folder or a tiny model), a video size and a slice (``--chips``), the denoiser's
step and the VAE decode programs are compiled exactly as ``plan`` compiles them (the runtime's own programs, abstract
weights) by the real TPU compiler, and each is read back (``planner.hlo_stats``): memory per device, generated code,
compile seconds, FLOPs and bytes per layer and per step (loop bodies times their trip counts; XLA's own cost analysis
counts a loop body once and a Pallas kernel as nothing), the attention kernel's FLOPs (as padded), collectives by
kind with their bytes, copies, fusions, custom calls. ``--estimate`` adds a roofline *estimate* of the step, with
its assumptions printed, and the TPU compiler's own (``planner.compiler_estimate``): never a measurement.
"""

from __future__ import annotations

import inspect
import json
import time

import torch

from ..planner import compiler_estimate, kernel_work, plan, step_estimate, tpu_compiler
from ..planner.chips import CHIPS
from ..runtime.config import TPUConfig
from ..runtime.files import outputs
from ..runtime.registry import family_of
from .arguments import pipeline_to_compile

GIB = 1 << 30


def check_arguments(args) -> None:
    """Mistakes named before anything loads."""
    tpu_compiler.require("diffusers-tpu cost")  # --chips, --arch/--model: checked before loading (``parser.check``)


def figures_and_kernels(lowered) -> dict:
    """The compiled program's figures with its Pallas kernels' LLO work (a named function: remembered analyses are
    keyed by it)."""
    return kernel_work.counted(tpu_compiler.compiled_figures, lowered)


def main(args) -> int:
    check_arguments(args)
    if args.json:
        outputs.check_destination(args.json, what="--json")
    chip = CHIPS[args.chips]
    devices = tpu_compiler.devices(chip)
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    pipe = pipeline_to_compile(args, dtype)
    if args.max_sequence_length is None:
        parameter = inspect.signature(pipe.__call__).parameters.get("max_sequence_length")
        args.max_sequence_length = parameter.default if parameter is not None else None
    config = TPUConfig(
        mesh=args.mesh,
        dtype=dtype,
        quantize=args.quantize,
        text_encoder="host",
        vae_compile=args.vae_compile,
        weights_in_host_memory=args.weights_in_host_memory,
    )
    size = dict(height=args.height, width=args.width, num_frames=args.frames, guidance_scale=args.guidance)
    start = time.perf_counter()
    print(
        f"compiling for {args.chips} ({chip.topology}, {devices[0].device_kind}) with the TPU compiler ...", flush=True
    )
    report = plan.start_denoiser_memory(
        pipe,
        size,
        config,
        devices,
        args.max_sequence_length,
        vae=not args.no_vae,
        analyse=figures_and_kernels if kernel_work.counting() else tpu_compiler.compiled_figures,
    )()
    family = family_of(pipe)
    analytic = (
        family.planning.forward_flops(pipe, args.height, args.width, args.frames, args.max_sequence_length)
        if family.planning.forward_flops is not None
        else None
    )
    result = {
        "model": args.arch or args.model,
        "chips": args.chips,
        "topology": chip.topology,
        "device_kind": devices[0].device_kind,
        "size": dict(size, text_tokens=args.max_sequence_length),
        "mesh": report["mesh"],
        "cfg_batch": report["cfg_batch"],
        "guided": report["guided"],
        "denoiser_step": report["passes"],
        "vae_decode": report.get("vae_decode"),
        "analytic_flops_per_device": (analytic * report["cfg_batch"] / len(devices)) if analytic else None,
        "seconds": round(time.perf_counter() - start, 1),
    }
    if args.estimate:
        calls = report["calls_per_step"]
        result["estimate"] = step_estimate.of_passes(report["passes"], chip, args.attention_efficiency, calls)
        print("the TPU compiler's own estimate: the step's quick-effort programs cut to 1 and 2 blocks ...", flush=True)
        attention = compiler_estimate.attention_flops(report["passes"])
        result["compiler_estimate"] = compiler_estimate.step(
            pipe, size, config, devices, args.max_sequence_length, chip, attention, args.attention_efficiency, calls
        )
    print(render(result))
    if args.json:
        outputs.write_text(args.json, json.dumps(result, indent=1, default=str))
    return 0


def _gib(n) -> str:
    return f"{n / GIB:.2f} GiB"


def _collectives(counts: dict) -> str:
    kinds = counts["collectives"]
    if not kinds:
        return "none"
    return ", ".join(f"{kind} {n} ({counts['collective_bytes'][kind] / 2**20:.0f} MiB)" for kind, n in kinds.items())


def _program(name: str, summary: dict, indent: str = "  ") -> list[str]:
    hlo = summary["hlo"]
    total = hlo["total"]
    lines = [
        f"{indent}{name}: compile {summary.get('compile_seconds', '?')} s, generated code "
        f"{summary['generated_code_bytes'] / 1e6:.1f} MB; per device: arguments {_gib(summary['argument_bytes'])},"
        f" temporaries {_gib(summary['temp_bytes'])}, outputs {_gib(summary['output_bytes'])}"
        + (f"; in host memory: {_gib(summary['host_argument_bytes'])}" if summary.get("host_argument_bytes") else ""),
        f"{indent}  whole program: {total['flops']:.4g} FLOPs (matmuls and convolutions)"
        + (
            f" + {total['attention_flops']:.4g} in {total['attention_calls']} attention kernel calls (as padded)"
            if total["attention_calls"]
            else ""
        )
        + f", {total['bytes'] / 1e9:.2f} GB read+written, {total['copies']} copies, {total['fusions']} fusions, "
        f"custom calls {total['custom_calls'] or 'none'}; collectives: {_collectives(total)}",
    ]
    lines.append(f"{indent}  {_compiler_estimate(summary.get('xla_cost', {}))}")
    if "kernels" not in summary:
        lines.append(f"{indent}  kernel work: not counted (libtpu started before cost asked for Mosaic's passes)")
    for kernel in summary.get("kernels", []):
        per_call = ", ".join(f"{unit} {n:,}" for unit, n in kernel["per_call"].items())
        assumed = kernel["assumed_taken"]
        lines.append(
            f"{indent}  kernel {kernel['name']} (grid {'x'.join(map(str, kernel['grid']))}): LLO operations per call: "
            f"{per_call}" + (f" ({assumed:,} branches read from memory counted as taken)" if assumed else "")
        )
    loops = sorted(hlo["loops"], key=lambda loop: loop["instructions"], reverse=True)
    for loop in loops[:1]:
        lines.append(
            f"{indent}  per iteration of its largest loop (x{loop['trip_count']}, e.g. one layer): "
            f"{loop['flops']:.4g} FLOPs + {loop['attention_flops']:.4g} attention, "
            f"{loop['bytes'] / 1e9:.2f} GB, {loop['copies']} copies, {loop['fusions']} fusions, "
            f"custom calls {loop['custom_calls'] or 'none'}; collectives: {_collectives(loop)}"
        )
    return lines


def _compiler_estimate(xla_cost: dict) -> str:
    """The TPU compiler's own run-time estimate (``cost_analysis()["optimal_seconds"]``) and what it covers: a per-op
    roofline of XLA's ops, loop bodies once, Pallas kernels left out; libtpu reports a negative number where it has no
    estimate (a program holding the compiler's own ``ConcatBitcast`` calls, as a real-size full-effort step does;
    ``compiler_estimate``)."""
    seconds = xla_cost.get("optimal_seconds")
    if seconds is None:
        return "the TPU compiler's run-time estimate: not reported by this compiler"
    if seconds < 0:
        return (
            f"the TPU compiler's run-time estimate: none for this program (libtpu reports {seconds:.3g}; it gives none "
            "for a program holding its own ConcatBitcast calls, as a real-size full-effort step does)"
        )
    return (
        f"the TPU compiler's run-time estimate: {seconds:.4g} s (XLA's ops as a per-op roofline, each loop body once; "
        "Pallas kernels not included)"
    )


def render(result: dict) -> str:
    lines = [
        f"{result['model']} {result['size']['height']}x{result['size']['width']}x{result['size']['num_frames']} "
        f"on {result['chips']} ({result['device_kind']}), mesh {result['mesh']}, guidance pair as batch "
        f"{result['cfg_batch']}: compiled by the TPU compiler in {result['seconds']} s"
    ]
    for number, step in enumerate(result["denoiser_step"]):
        lines += _program("denoiser step" + (f" (pass {number + 1})" if len(result["denoiser_step"]) > 1 else ""), step)
    if result["analytic_flops_per_device"]:
        step = result["denoiser_step"][0]["hlo"]["total"]
        lines.append(
            f"  analytic FLOPs per device (family formula, attention included): "
            f"{result['analytic_flops_per_device']:.4g}; compiled: "
            f"{step['flops'] + step['attention_flops']:.4g}"
        )
    decode = result.get("vae_decode") or {}
    programs = decode.get("programs") or [v for k, v in decode.items() if isinstance(v, dict)]
    for number, program in enumerate(programs):
        lines += _program(f"VAE decode program {number + 1}", program)
    if not programs:
        lines.append("  VAE decode: not compiled (--no-vae, or this VAE has no planned programs)")
    estimate = result.get("estimate")
    if estimate:
        lines.append(f"  {step_estimate.describe(estimate)}; not modelled: {estimate['assumptions']['not modelled']}")
        lines.append(f"  {compiler_estimate.describe(result.get('compiler_estimate'))}")
    return "\n".join(lines)
