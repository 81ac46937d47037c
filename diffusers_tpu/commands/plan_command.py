"""``diffusers-tpu plan``: the command around ``plan`` — target and candidates, a CPU process with enough simulated
devices and a memory-minimizing schedule, the report, and ``--check`` on an accelerator."""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time

import jax
import torch

from ..interop import backend
from ..planner import architectures, compiler_estimate, tpu_compiler
from ..planner import plan as plan_module
from ..planner.chips import CHIPS, GIB, candidate_meshes
from ..planner.plan import plan_all
from ..planner.step_estimate import describe, estimable, rank
from ..runtime import decision
from ..runtime.attach import pipeline_runtime
from ..runtime.config import TPUConfig
from ..runtime.files import outputs
from ..runtime.registry import family_of
from . import plan_lines, plan_screening
from .arguments import load_pipeline, pipeline_to_compile

# XLA's CPU compiler otherwise schedules for concurrency — every block's timestep-only ops (modulation broadcasts
# over all tokens) run up front, all their buffers live at once — and materializes broadcasts in its YNNPACK
# fusions; a TPU compiler schedules for memory and fuses broadcasts. Measured on Wan2.1-1.3B at 9,360 tokens:
# temporaries 0.25 GB more per block without these flags, constant with them. jaxlib 0.10 flag names: XLA aborts
# on unknown flags, so the command retries without them (and says so).
CPU_MEMORY_FLAGS = ("--xla_cpu_enable_concurrency_optimized_scheduler=false", "--xla_cpu_experimental_ynn_fusion_type=")


def cpu_device_flag(count: int) -> str:
    return f"--xla_force_host_platform_device_count={count}"


def cpu_devices(count: int) -> list | None:
    """``count`` simulated CPU devices, or None when JAX started with fewer (the flag must precede its start)."""
    devices = jax.devices("cpu")
    return devices[:count] if len(devices) >= count else None


def _rerun(argv: list[str], count: int, memory_flags: bool) -> int:
    """The same command in a process whose XLA starts with ``count`` CPU devices (and the memory flags)."""
    flags = [os.environ.get("XLA_FLAGS", ""), cpu_device_flag(count), *(CPU_MEMORY_FLAGS if memory_flags else ())]
    env = dict(os.environ, XLA_FLAGS=" ".join(f for f in flags if f), JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-m", "diffusers_tpu.commands.cli", *argv], env=env, stderr=subprocess.PIPE, text=True
    )
    if result.returncode and memory_flags and "Unknown flag" in result.stderr:
        print("plan: this jaxlib does not know the CPU scheduling flags; temporaries will be overestimated")
        return _rerun(argv, count, memory_flags=False)
    sys.stderr.write(result.stderr)
    return result.returncode


def main(args, argv: list[str] | None = None) -> int:

    if args.json:
        outputs.check_destination(args.json, what="--json")  # before minutes of compiling
    layouts = _layouts(args)
    # its target and model were checked before anything loaded (``parser.check``)
    chip = CHIPS.get(args.chips)
    count = chip.devices if chip else int(__import__("math").prod(args.mesh.values()))
    compilers = _compilers(args.compiler, chip)
    if args.compiler_estimate and compilers[0] != "tpu":  # --compiler auto without a loading libtpu
        raise ValueError(f"--compiler-estimate needs the TPU compiler: {tpu_compiler.install_hint()}.")
    if chip is not None and chip.gpu:
        print(
            f"{args.chips}: JAX's memory pool is {chip.usable_gib():g} GiB of the {chip.hbm_gib:g} GiB per GPU "
            "(XLA_PYTHON_CLIENT_MEM_FRACTION; JAX's default 0.75)",
            flush=True,
        )
    if args.check:
        return check(args, argv, count)
    simulated = cpu_devices(count) if "cpu" in compilers else None
    flags = os.environ.get("XLA_FLAGS", "")
    if "cpu" in compilers and argv is not None and (simulated is None or cpu_device_flag(count) not in flags):
        # importing the package started JAX: run again in a process whose XLA starts with the flags
        return _rerun(argv, count, memory_flags=True)
    if "cpu" in compilers and simulated is None:
        raise RuntimeError(
            f"plan needs {count} CPU devices; set XLA_FLAGS={cpu_device_flag(count)} before Python starts."
        )
    devices = tpu_compiler.devices(chip) if compilers[0] == "tpu" else simulated
    compared = simulated if compilers == ("tpu", "cpu") else None  # --compiler both: the CPU estimate beside
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    pipe = pipeline_to_compile(args, dtype)

    heads = family_of(pipe).num_heads(pipe)
    if args.max_sequence_length is None:  # HunyuanVideo-1.5 has fixed text lengths instead
        parameter = inspect.signature(pipe.__call__).parameters.get("max_sequence_length")
        args.max_sequence_length = parameter.default if parameter is not None else None
    meshes = (
        [args.mesh] if args.mesh else [m for m in candidate_meshes(count, heads) if decision.splits_weights(pipe, m)]
    )
    call = dict(height=args.height, width=args.width, num_frames=args.frames, guidance_scale=args.guidance)
    decoder = getattr(getattr(pipe, "vae", None), "decoder", None)
    if (
        compilers[0] == "tpu"
        and not args.no_vae
        and decoder is not None
        and any(isinstance(m, torch.nn.Conv3d) for m in decoder.modules())
    ):
        slow = args.vae_compile in ("full", "tiered")  # XLA's full effort on float32 3-D convolutions
        print(
            "the VAE decode programs are compiled for TPU too, as the runtime builds them (--vae-compile "
            f"{args.vae_compile}): "
            + (
                "at XLA's full effort a video VAE's float32 3-D convolutions take the TPU compiler minutes the first "
                "time (Wan2.1 720p on v6e-8: ~15 min on 2 cores)"
                if slow
                else "at XLA's quick effort, about half a minute each for Wan2.1 720p on 2 cores"
            )
            + "; the analysis is remembered on disk, so later plans of this size skip it; --no-vae plans the denoiser "
            "steps alone",
            flush=True,
        )
    rows, recommended, start = [], None, time.perf_counter()
    estimated = estimable(chip, tpu_compiler.is_tpu(devices))
    for fmt, full, hosted in layouts:
        # fully sharded weights differ from the rules' only where dp or sp is > 1
        configs = [
            TPUConfig(
                mesh=mesh,
                dtype=dtype,
                quantize=fmt,
                text_encoder=args.text_encoder,
                fully_sharded_weights=full,
                weights_in_host_memory=hosted,
                vae_compile=args.vae_compile,
            )
            for mesh in meshes
            if not full or mesh.get("dp", 1) * mesh.get("sp", 1) > 1
        ]
        if not configs:
            continue
        if args.text_encoder == "auto":
            configs = [_encoders_as_placed(pipe, c, devices, chip, args.hbm_gb) for c in configs]
        print(
            f"planning {len(configs)} candidate meshes{' with ' + fmt + ' weights' if fmt else ''}"
            f"{', weights fully sharded' if full else ''}{', weights in host memory' if hosted else ''} ...",
            flush=True,
        )
        estimates = (
            plan_all(pipe, call, configs, compared, chip, args.hbm_gb, args.max_sequence_length, vae=not args.no_vae)
            if compared is not None
            else None
        )
        # rows the TPU compiler compiled for a known chip carry a step estimate: every candidate of the format is
        # compiled and the fastest that fits is chosen; otherwise (or --first-fit) the first that fits, in order.
        # Ranking screens every candidate at XLA's quick effort, then compiles the leader as the runtime does
        # (--all: every candidate at full effort)
        ranking = estimated and not args.first_fit
        narrow = compilers[0] == "tpu" and not args.all and not ranking
        screening = ranking and not args.all
        planned = dict(
            chip=chip,
            hbm_gib=args.hbm_gb,
            text_tokens=args.max_sequence_length,
            vae=not args.no_vae,
            attention_efficiency=args.attention_efficiency,
        )
        format_rows = []
        for number, row in enumerate(
            plan_all(pipe, call, configs, devices, ahead=1 if narrow else None, quick=screening, **planned), 1
        ):
            row["compiler"] = _compiler_name(devices)
            row["config"] = configs[number - 1]
            if estimates is not None:
                row["cpu_estimate"] = _estimate_beside(next(estimates), row)
            rows.append(row)
            format_rows.append(row)
            print(f"[{number}/{len(configs)}, {time.perf_counter() - start:.0f} s] {plan_lines.line(row)}", flush=True)
            if row["fits"] and narrow:
                if number < len(configs):
                    skipped = [c.mesh for c in configs[number:]]
                    print(f"not compiled: {len(skipped)} less preferred candidate(s) {skipped} (--all compiles them)")
                break
        if screening:
            plan_screening.confirm_at_full_effort(pipe, call, devices, format_rows, rows, planned, start)
        fitting = [row for row in format_rows if row["fits"]]
        if fitting and recommended is None:
            if ranking:
                by = plan_screening.ranked_by(pipe, call, devices, fitting, planned, args.compiler_estimate)
                ranked, recommended, because = rank(fitting, by)
                name = "the TPU compiler's ESTIMATE" if by == "compiler_estimate" else "the step ESTIMATE"
                print(f"fitting candidates ranked by {name} (not a measurement):")
                for place, row in enumerate(ranked, 1):
                    effort = " [quick-effort compile]" if row.get("step_effort") == "quick" else ""
                    print(f"  {place}. mesh {row['memory_per_device']['mesh']}: {describe(row['estimate'])}{effort}")
                    if args.compiler_estimate:
                        print(f"     {compiler_estimate.describe(row['compiler_estimate'])}")
                recommended["chosen_because"] = because + plan_screening.quick_rows_note(ranked)
            else:
                recommended = fitting[0]
                recommended["chosen_because"] = "the first candidate in order of preference that fits"
        if recommended is not None:
            break  # a format that fits: quantizing further would only cost quality
    report = {
        "model": args.arch or args.model,
        "cpu_memory_flags": all(f in flags for f in CPU_MEMORY_FLAGS),
        "target": args.chips or f"mesh {args.mesh}, {args.hbm_gb} GiB",
        "size": dict(call, steps=args.steps, text_tokens=args.max_sequence_length),
        "candidates": [{k: v for k, v in row.items() if k != "config"} for row in rows],
        "recommended": {k: v for k, v in recommended.items() if k != "config"} if recommended else None,
        "compiler": _compiler_name(devices),
        "note": (
            f"compiled by the TPU compiler for {args.chips} (libtpu), no TPU used"
            if compilers[0] == "tpu"
            else "CPU-compiled estimate of the denoiser step (+ VAE weights); see docs/planner.md"
        ),
    }
    if recommended is not None:
        floor = recommended.get("floor_step_seconds")
        print(
            f"recommended: mesh {recommended['memory_per_device']['mesh']}, {recommended['dtype']}"
            + (f", {recommended['quantize']} weights" if recommended["quantize"] else "")
            + (", TPUConfig(fully_sharded_weights=True)" if recommended.get("fully_sharded_weights") else "")
            + (", TPUConfig(weights_in_host_memory=True)" if recommended.get("weights_in_host_memory") else "")
            + (", pipe.vae.enable_tiling()" if recommended["vae_tiling"] else "")
            + (f"; floor {floor:.3f} s/step, {floor * args.steps:.1f} s for {args.steps} steps" if floor else "")
        )
        print(f"chosen: {recommended['chosen_because']}")
        if recommended.get("estimate"):
            found = recommended["estimate"]
            print(
                f"  {describe(found)}; {found['seconds'] * args.steps:.1f} s for {args.steps} steps; not modelled: "
                f"{found['assumptions']['not modelled']}"
            )
    else:
        print("does not fit: no candidate mesh and weight format fits this target")
    print(f"planned {len(rows)} candidates in {time.perf_counter() - start:.0f} s")
    if compilers[0] == "tpu":
        print(
            f"memory from the TPU compiler's own analysis of every program, compiled for {args.chips} "
            f"({chip.topology}) without a TPU"
        )
    else:
        print(
            "CPU-compiled estimate (docs/planner.md): arguments are exact, temporaries approximate the TPU's"
            + (
                "; install libtpu for the TPU compiler's own figures: " + tpu_compiler.install_hint()
                if chip is not None and chip.topology and not tpu_compiler.available()
                else "."
            )
        )
    if args.json:
        outputs.write_text(args.json, json.dumps(report, indent=1, default=str))
    return 0


def _compilers(choice: str, chip) -> tuple[str, ...]:
    """What compiles the plan: ``("tpu",)``, ``("cpu",)`` or ``("tpu", "cpu")`` (both, the TPU's figures first)."""
    tpu_slice = chip is not None and chip.topology is not None
    if choice in ("tpu", "both"):
        if not tpu_slice:
            raise ValueError(
                f"plan --compiler {choice} needs --chips naming a TPU slice libtpu knows: "
                f"{', '.join(tpu_compiler.tpu_slices())}."
            )
        tpu_compiler.require(f"plan --compiler {choice}")
        return ("tpu", "cpu") if choice == "both" else ("tpu",)
    if choice == "auto" and tpu_slice and tpu_compiler.available():
        failure = tpu_compiler.load_failure()
        if failure is None:
            return ("tpu",)
        print(  # libtpu there but broken: the CPU estimate, as without it, and how to mend it
            f"the TPU compiler (libtpu) is installed but does not load ({failure}); planning with the CPU estimate "
            f"instead. To mend it: {tpu_compiler.install_hint()}",
            flush=True,
        )
    return ("cpu",)


def _compiler_name(devices) -> str:
    if tpu_compiler.is_tpu(devices):
        return f"TPU compiler ({devices[0].device_kind}, libtpu)"
    return "CPU estimate (XLA:CPU)"


def _estimate_beside(estimate: dict, row: dict) -> dict:
    """The CPU estimate of a candidate next to the TPU compiler's figures: its totals and how far off they are."""
    tpu_memory, cpu_memory = row["memory_per_device"], estimate["memory_per_device"]
    keys = ("argument_bytes", "temp_bytes", "peak_bytes")
    found = {key: cpu_memory[key] for key in keys}
    found["total_bytes_per_device"] = estimate["total_bytes_per_device"]
    found["decode_peak_bytes"] = (cpu_memory.get("vae_decode") or {}).get("peak_bytes")
    found["error"] = {
        key: (cpu_memory[key] - tpu_memory[key]) / tpu_memory[key] if tpu_memory[key] else None for key in keys
    }
    found["error"]["total_bytes_per_device"] = (
        estimate["total_bytes_per_device"] - row["total_bytes_per_device"]
    ) / row["total_bytes_per_device"]
    found["fits"] = estimate["fits"]
    return found


def _encoders_as_placed(pipe, config, devices, chip, hbm_gib):
    """``config`` with the text encoders where ``TPUConfig(text_encoder="auto")`` puts them on the target: the same
    decision ``pipe.to`` makes (``runtime.decision``), against the memory JAX can allocate on the target's chips."""
    platform = "gpu" if chip is not None and chip.gpu else "tpu"
    limit = (chip.usable_gib() if chip else hbm_gib) * GIB
    decided = decision.decide(pipe, config, backend.Target("tpu", platform), devices, memory_limit=limit)
    return dataclasses.replace(config, text_encoder=decided.text_encoders)


def _layouts(args) -> list[tuple]:
    """The weight layouts to plan, as (quantize, fully_sharded_weights, weights_in_host_memory), cheapest first:
    weights as the rules shard them, fully sharded (a gather per layer), stored in host memory (each layer streamed
    into the step: lossless, bounded by the host link), then int8 (lossy)."""
    if args.weights_in_host_memory == "yes" and (args.quantize or args.weights_sharding == "full"):
        raise ValueError(
            "plan --weights-in-host-memory yes keeps the weights as loaded and as the rules shard them: drop "
            "--quantize and --weights-sharding full, or plan --weights-in-host-memory auto."
        )
    shardings = {"rules": [False], "full": [True], "auto": [False, True]}[args.weights_sharding]
    layouts = []
    for fmt in [args.quantize] if args.quantize else [None, "int8"]:
        if args.weights_in_host_memory != "yes":
            layouts += [(fmt, full, False) for full in shardings]
        if args.weights_in_host_memory != "no" and fmt is None and False in shardings:
            layouts.append((None, False, True))
    return layouts


def check(args, argv: list[str] | None, count: int) -> int:
    """``plan --check``: the plan (in a CPU process), then its recommended configuration run here on the
    accelerator for 2 steps, the measured peak device memory beside the estimate."""

    platform = jax.default_backend()
    if platform == "cpu" or argv is None:
        raise ValueError(
            "plan --check runs the plan's configuration on a TPU or GPU, but JAX sees only CPU devices "
            "here; run plan without --check for the estimate."
        )
    if len(jax.devices()) != count:
        raise ValueError(f"plan --check: the target has {count} devices, this machine {len(jax.devices())}.")
    with tempfile.TemporaryDirectory() as folder:
        planned = os.path.join(folder, "plan.json")
        rest = [a for a in argv if a != "--check"]
        if "--json" in rest:
            at = rest.index("--json")
            del rest[at : at + 2]
        if _rerun([*rest, "--json", planned], count, memory_flags=True):
            return 1
        with open(planned) as handle:
            report = json.load(handle)
    chosen = report["recommended"]
    if chosen is None:
        raise ValueError("plan --check: the plan found no configuration that fits; nothing to run.")
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    pipe = architectures.build(args.arch, dtype or torch.float32) if args.arch else load_pipeline(args.model)
    config = TPUConfig(
        mesh=chosen["memory_per_device"]["mesh"],
        dtype=dtype,
        quantize=chosen["quantize"],
        text_encoder=chosen["text_encoder"],
        fully_sharded_weights=chosen.get("fully_sharded_weights", False),
        weights_in_host_memory=chosen.get("weights_in_host_memory", False),
        vae_compile=args.vae_compile,
    )
    pipe.to("jax", config=config)
    # the planned call (zero text embeddings, 2 steps) up to the latents: the denoiser steps, not the VAE decode
    size = dict(height=args.height, width=args.width, num_frames=args.frames, guidance_scale=args.guidance)
    with plan_module.guidance(pipe, args.guidance):
        tokens = report["size"]["text_tokens"]
        keywords = family_of(pipe).planning.call(pipe, size, tokens, pipe.transformer.dtype)
        prompt = plan_module.PLAN_PROMPT if chosen["text_encoder"] == "jax" else None  # as planned: encoders too
        pipe(**plan_module.call_keywords(pipe, keywords, tokens, prompt), output_type="latent")
    stats = [d.memory_stats() or {} for d in pipeline_runtime.runtime_of(pipe).mesh.devices.flat]
    measured = max((s.get("peak_bytes_in_use", 0) for s in stats), default=0) or None
    report["check"] = {
        "platform": platform,
        "device_kind": jax.devices()[0].device_kind,
        "measured_peak_bytes_per_device": measured,
        "planned_bytes_per_device": chosen["total_bytes_per_device"],
    }
    print(
        f"check on {platform}: measured peak {measured / GIB:.2f} GiB per device, planned "
        f"{chosen['total_bytes_per_device'] / GIB:.2f} GiB"
        if measured
        else "check: the platform reports no peak"
    )
    if args.json:
        outputs.write_text(args.json, json.dumps(report, indent=1, default=str))
    return 0
