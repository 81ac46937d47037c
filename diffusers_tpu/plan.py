"""Will it fit? ``diffusers-tpu plan``: XLA's memory analysis of the denoiser step the runtime would compile.

For a pipeline (a real-size ``--arch`` built on the ``meta`` device with no weights, a local folder or a tiny
model), a size and a target (a chip slice or a mesh + HBM size), ``plan``:

1. finds the denoiser's call arguments by running the stock pipeline up to its first denoiser call (text
   embeddings given as zeros, so no text encoder runs; on ``meta`` nothing is computed);
2. builds the runtime's own compiled entry for the denoiser (``PipelineRuntime.denoiser_entry``: same forward,
   sharding rules, attention, input placement, LoRA inputs) with abstract weights carrying their planned shardings
   (``lowering.abstract_state``; int8 ones as ``quantize.Quantized``);
3. compiles it for a simulated mesh of CPU devices and reads ``compiled.memory_analysis()`` per device.

CPU-compiled plans approximate the TPU's: the CPU backend fuses and lays out differently (``CPU_MEMORY_FLAGS`` make
it schedule for memory as a TPU compiler does) and the Pallas attention kernel is compiled in interpret mode, so
temporaries are estimates; the weights and arguments are exact. Not included yet: the VAE decode's activations (its weights are counted) and on-device text encoders
(the default runs them on the host).
"""

from __future__ import annotations

import dataclasses
import inspect
import os

import torch

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    devices: int  # JAX devices in the slice
    hbm_gib: float  # per device
    peak_tflops: float  # dense bf16, per device


# Vendor figures as published (Cloud TPU docs). v5p and v4 slices are named by TensorCores (2 per chip, one
# megacore device each); v7x-8 is taken as 4 chips of 2 TensorCores each seen as its own device: verify on hardware.
CHIPS = {
    "v5e-1": Chip(1, 16, 197), "v5e-8": Chip(8, 16, 197), "v6e-1": Chip(1, 32, 918), "v6e-8": Chip(8, 32, 918),
    "v5p-8": Chip(4, 95, 459), "v7x-8": Chip(8, 96, 2307 / 2), "v4-32": Chip(16, 32, 275),
}


# text-to-video pipelines whose family gives ``plan_text`` (others take images or stream blocks)
PLANNED_PIPELINES = ("WanPipeline", "CogVideoXPipeline")


class _FirstCall(Exception):
    pass


def probe_denoiser_call(pipe, call: dict, text_tokens: int, dtype: torch.dtype) -> tuple[tuple, dict]:
    """The positional and keyword arguments of the pipeline's first denoiser call, with text embeddings given
    as zeros (``Family.plan_text``), the denoiser reporting ``dtype`` as it will once placed."""
    from .families import family_of

    text = family_of(pipe).plan_text
    if text is None or type(pipe).__name__ not in PLANNED_PIPELINES:
        raise ValueError(f"plan supports {', '.join(PLANNED_PIPELINES)} so far, not {type(pipe).__name__}.")
    module = pipe.transformer
    seen = {}

    def record(*args, **kwargs):
        seen["call"] = (args, kwargs)
        raise _FirstCall

    # the pipeline casts inputs to ``transformer.dtype``: make it report the dtype the placed module will have; and
    # it runs on the CPU (latents, scheduler tables) even when the weights are on ``meta``
    cls, pipe_cls = type(module), type(pipe)
    module.__class__ = type(cls.__name__, (cls,), {"dtype": property(lambda self: dtype)})
    pipe.__class__ = type(pipe_cls.__name__, (pipe_cls,), {"_execution_device": property(lambda self: torch.device("cpu"))})
    vars(module)["forward"] = record
    bar = dict(getattr(pipe, "_progress_bar_config", {}))
    pipe.set_progress_bar_config(disable=True)
    try:
        pipe(**text(pipe, text_tokens, dtype), output_type="latent", **call)
    except _FirstCall:
        pass
    finally:
        del vars(module)["forward"]
        module.__class__, pipe.__class__ = cls, pipe_cls
        pipe._progress_bar_config = bar
    if "call" not in seen:
        raise RuntimeError(f"{type(pipe).__name__} did not call its denoiser")
    return seen["call"]


def _concrete(value, batch: int):
    """Meta or host tensors as host zeros of the batch the runtime would run (the CFG pair as one batch)."""
    if not isinstance(value, torch.Tensor):
        return value
    shape = list(value.shape)
    if batch > 1 and shape:
        shape[0] *= batch
    return torch.zeros(shape, dtype=value.dtype)


def _reported_dtype(module, state: dict) -> torch.dtype:
    """What ``module.dtype`` (diffusers' ``get_parameter_dtype``) reports once placed: the first floating weight on
    the devices outside ``_keep_in_fp32_modules`` (quantized weights are not floating)."""
    from torchax.ops import mappings

    from . import quantize

    keep = getattr(module, "_keep_in_fp32_modules", None) or ()
    for name, _ in module.named_parameters():
        value = state[name]
        if isinstance(value, quantize.Quantized) or any(m in name for m in keep):
            continue
        dtype = mappings.j2t_dtype(value.dtype)
        if dtype.is_floating_point:
            return dtype
    return torch.float32


def abstract_weights(module, mesh, rules, dtype, quantize_format=None) -> dict:
    """The denoiser's weights as the runtime would hold them: ShapeDtypeStructs with their shardings."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from . import lowering, quantize
    from .backend import jax_dtype

    keep = getattr(module, "_keep_in_fp32_modules", None) or ()
    state = lowering.abstract_state(module, mesh, rules, dtype, keep)
    if quantize_format:
        storage = {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn}[quantize_format]
        for name in quantize.targets(module):
            weight = state[name]
            spec = weight.sharding.spec
            scale = jax.ShapeDtypeStruct((weight.shape[0],), jnp.float32,
                                         sharding=NamedSharding(mesh, P(spec[0] if len(spec) else None)))
            state[name] = quantize.Quantized(jax.ShapeDtypeStruct(weight.shape, storage, sharding=weight.sharding),
                                             scale, jnp.dtype(jax_dtype(dtype or torch.float32)))
    return state


def denoiser_memory(pipe, call: dict, config, devices, text_tokens: int) -> dict:
    """XLA's memory analysis (bytes per device) of one denoiser step as the runtime would compile it."""
    from . import backend, compile as jit
    from .families import family_of
    from .runtime import PipelineRuntime

    family = family_of(pipe)
    name = family.denoisers[0]
    module = getattr(pipe, name)
    heads = family.num_heads(pipe)
    mesh_shape = (backend.validate_mesh_shape(config.mesh, len(devices), heads) if config.mesh is not None
                  else backend.default_mesh_shape(len(devices), heads, pair_batch=True))
    mesh = backend.build_mesh(mesh_shape, devices)
    target = backend.Target("tpu", devices[0].platform)
    runtime = PipelineRuntime(pipe, family, config, target, mesh, None)
    rules = family.rules(module, mesh_shape)
    state = abstract_weights(module, mesh, rules, config.dtype, config.quantize)
    args, kwargs = probe_denoiser_call(pipe, call, text_tokens, _reported_dtype(module, state))
    try:
        entry = runtime.denoiser_entry(module, rules, state=lambda: state)
        batch = 2 if runtime.pairing is not None and call.get("guidance_scale", 5.0) > 1.0 else 1
        args = tuple(_concrete(a, batch) for a in args)
        kwargs = {k: _concrete(v, batch) for k, v in kwargs.items()}
        report = jit.memory_analysis(entry.whole, *args, **kwargs)
    finally:
        runtime.undo()
    report["mesh"] = dict(mesh.shape)
    report["cfg_batch"] = batch
    report["attention"] = runtime.attention.implementation
    return report


def weight_bytes(module: torch.nn.Module, dtype: torch.dtype | None) -> int:
    """Bytes of a replicated component's weights (the VAE) in ``dtype`` (None: as built)."""
    return sum(p.numel() * (torch.finfo(dtype).bits // 8 if dtype and p.is_floating_point() else p.element_size())
               for p in module.parameters())


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
    import jax

    devices = jax.devices("cpu")
    return devices[:count] if len(devices) >= count else None


def _rerun(argv: list[str], count: int, memory_flags: bool) -> int:
    """The same command in a process whose XLA starts with ``count`` CPU devices (and the memory flags)."""
    import subprocess
    import sys

    flags = [os.environ.get("XLA_FLAGS", ""), cpu_device_flag(count), *(CPU_MEMORY_FLAGS if memory_flags else ())]
    env = dict(os.environ, XLA_FLAGS=" ".join(f for f in flags if f), JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-m", "diffusers_tpu.cli", *argv], env=env, stderr=subprocess.PIPE,
                            text=True)
    if result.returncode and memory_flags and "Unknown flag" in result.stderr:
        print("plan: this jaxlib does not know the CPU scheduling flags; temporaries will be overestimated")
        return _rerun(argv, count, memory_flags=False)
    sys.stderr.write(result.stderr)
    return result.returncode


def plan(pipe, call: dict, config, devices, chip: Chip | None, hbm_gib: float | None, text_tokens: int) -> dict:
    """The plan for one configuration: memory per device, verdict, FLOPs per step and the floor step time."""
    from .families import family_of

    memory = denoiser_memory(pipe, call, config, devices, text_tokens)
    vae = getattr(pipe, "vae", None)
    memory["vae_weight_bytes"] = weight_bytes(vae, config.vae_weights_dtype) if vae is not None else 0
    total = memory["peak_bytes"] + memory["vae_weight_bytes"]
    hbm = (chip.hbm_gib if chip else hbm_gib)
    report = {"memory_per_device": memory, "total_bytes_per_device": total, "hbm_gib": hbm,
              "fits": total <= hbm * GIB if hbm else None,
              "dtype": str(config.dtype or "as loaded"), "quantize": config.quantize}
    family = family_of(pipe)
    if family.forward_flops is not None:
        cfg = 2 if call.get("guidance_scale", 5.0) > 1.0 else 1
        per_step = family.forward_flops(pipe, call["height"], call["width"], call["num_frames"], text_tokens) * cfg
        report["flops_per_step"] = per_step
        if chip:
            report["floor_step_seconds"] = per_step / (chip.peak_tflops * 1e12 * len(devices))
    return report


def folder_pipeline(folder: str, dtype: torch.dtype | None):
    """A local pipeline folder with its denoiser on the ``meta`` device (checked against the checkpoint, nothing
    read) and no text encoder: what ``plan`` needs, without the weights in host memory."""
    import json

    import diffusers

    from . import loading

    with open(os.path.join(folder, "model_index.json")) as handle:
        index = json.load(handle)
    model_class = getattr(diffusers, index["transformer"][1])
    transformer = loading.empty_model(model_class, os.path.join(folder, "transformer"), dtype)
    return getattr(diffusers, index["_class_name"]).from_pretrained(folder, transformer=transformer, text_encoder=None,
                                                                    tokenizer=None)


def candidate_meshes(devices: int, heads: int | None) -> list[dict]:
    """Every (dp, sp, tp) over ``devices``: dp at most 2 (the guidance pair), tp dividing the head count."""
    meshes = []
    for dp in (2, 1):
        for tp in range(devices, 0, -1):
            if devices % (dp * tp) or (heads and heads % tp):
                continue
            meshes.append({"dp": dp, "sp": devices // (dp * tp), "tp": tp})
    return meshes


def add_arguments(parser) -> None:
    from .arguments import mesh_arg

    parser.add_argument("--arch", help="a real-size architecture (no weights): Wan2.1-1.3B, Wan2.1-14B, CogVideoX1.5-5B")
    parser.add_argument("--model", help="a local Wan or CogVideoX pipeline folder, or a tiny model (tiny:wan, ...)")
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--width", type=int, default=832)
    parser.add_argument("--frames", type=int, default=81)
    parser.add_argument("--steps", type=int, default=50, help="denoising steps (for the floor of the whole run)")
    parser.add_argument("--max-sequence-length", type=int, help="text tokens (default: the pipeline's own)")
    parser.add_argument("--guidance", type=float, default=5.0)
    parser.add_argument("--chips", choices=sorted(CHIPS), help="a TPU slice: its device count, HBM and peak")
    parser.add_argument("--mesh", type=mesh_arg, help="dp,sp,tp to plan (default: try every candidate)")
    parser.add_argument("--hbm-gb", type=float, help="HBM per device in GiB (with --mesh, instead of --chips)")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    parser.add_argument("--quantize", choices=("int8", "fp8"), help="plan only this weight format")
    parser.add_argument("--json", help="write the report to this file")
    parser.add_argument("--check", action="store_true", help="on a TPU or GPU: run the recommended configuration "
                        "(random weights for --arch) for 2 steps and report the measured peak memory beside the plan")


def main(args, argv: list[str] | None = None) -> int:
    import json

    from . import architectures
    from .arguments import load_pipeline
    from .config import TPUConfig

    if not args.chips and not (args.mesh and args.hbm_gb):
        raise ValueError("plan needs a target: --chips NAME (one of %s), or --mesh dp,sp,tp with --hbm-gb N."
                         % ", ".join(sorted(CHIPS)))
    if bool(args.arch) == bool(args.model):
        raise ValueError("plan needs exactly one of --arch NAME or --model FOLDER|tiny:NAME.")
    chip = CHIPS.get(args.chips)
    count = chip.devices if chip else int(__import__("math").prod(args.mesh.values()))
    if args.check:
        return check(args, argv, count)
    devices = cpu_devices(count)
    flags = os.environ.get("XLA_FLAGS", "")
    if argv is not None and (devices is None or cpu_device_flag(count) not in flags):
        # importing the package started JAX: run again in a process whose XLA starts with the flags
        return _rerun(argv, count, memory_flags=True)
    if devices is None:
        raise RuntimeError(f"plan needs {count} CPU devices; set XLA_FLAGS={cpu_device_flag(count)} before Python starts.")
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    if args.arch:
        pipe = architectures.build(args.arch, dtype or torch.float32, weights=False)
    elif os.path.isfile(os.path.join(args.model, "model_index.json")):
        pipe = folder_pipeline(args.model, dtype)
    else:
        pipe = load_pipeline(args.model)
    from .families import family_of

    heads = family_of(pipe).num_heads(pipe)
    if args.max_sequence_length is None:
        args.max_sequence_length = inspect.signature(pipe.__call__).parameters["max_sequence_length"].default
    meshes = [args.mesh] if args.mesh else candidate_meshes(count, heads)
    formats = [args.quantize] if args.quantize else [None, "int8"]
    call = dict(height=args.height, width=args.width, num_frames=args.frames, num_inference_steps=2,
                guidance_scale=args.guidance)
    rows, recommended = [], None
    for fmt in formats:
        for mesh in meshes:
            config = TPUConfig(mesh=mesh, dtype=dtype, quantize=fmt)
            row = plan(pipe, call, config, devices, chip, args.hbm_gb, args.max_sequence_length)
            rows.append(row)
            print(_line(row), flush=True)
            if row["fits"] and recommended is None:
                recommended = row
        if recommended is not None:
            break  # a format that fits: quantizing further would only cost quality
    report = {"model": args.arch or args.model, "cpu_memory_flags": all(f in flags for f in CPU_MEMORY_FLAGS), "target": args.chips or f"mesh {args.mesh}, {args.hbm_gb} GiB",
              "size": dict(call, steps=args.steps, text_tokens=args.max_sequence_length), "candidates": rows,
              "recommended": recommended,
              "note": "CPU-compiled estimate of the denoiser step (+ VAE weights); see README 'Will it fit?'"}
    if recommended is not None:
        floor = recommended.get("floor_step_seconds")
        print(f"recommended: mesh {recommended['memory_per_device']['mesh']}, {recommended['dtype']}"
              + (f", {recommended['quantize']} weights" if recommended["quantize"] else "")
              + (f"; floor {floor:.3f} s/step, {floor * args.steps:.1f} s for {args.steps} steps" if floor else ""))
    else:
        print("does not fit: no candidate mesh and weight format fits this target")
    print("CPU-compiled estimate (README 'Will it fit?'): arguments are exact, temporaries approximate the TPU's; "
          "the VAE decode's activations are not included.")
    if args.json:
        from .stages import _write_atomically

        text = json.dumps(report, indent=1, default=str)
        _write_atomically(args.json, lambda temp: open(temp, "w").write(text))
    return 0


def _line(row: dict) -> str:
    memory = row["memory_per_device"]
    gib = lambda n: f"{n / GIB:7.2f}"  # noqa: E731
    verdict = {True: "fits", False: "does not fit", None: "?"}[row["fits"]]
    return (f"mesh {memory['mesh']} {row['dtype']}{' ' + row['quantize'] if row['quantize'] else ''}: "
            f"arguments {gib(memory['argument_bytes'])} GiB, temporaries {gib(memory['temp_bytes'])}, outputs "
            f"{gib(memory['output_bytes'])}, VAE weights {gib(memory['vae_weight_bytes'])}; total "
            f"{gib(row['total_bytes_per_device'])} of {row['hbm_gib']} GiB per device: {verdict}")


def check(args, argv: list[str] | None, count: int) -> int:
    """``plan --check``: the plan (in a CPU process), then its recommended configuration run here on the
    accelerator for 2 steps, the measured peak device memory beside the estimate."""
    import json
    import tempfile

    import jax

    from . import architectures, runtime
    from .arguments import load_pipeline
    from .config import TPUConfig

    platform = jax.default_backend()
    if platform == "cpu" or argv is None:
        raise ValueError("plan --check runs the plan's configuration on a TPU or GPU, but JAX sees only CPU devices "
                         "here; run plan without --check for the estimate.")
    if len(jax.devices()) != count:
        raise ValueError(f"plan --check: the target has {count} devices, this machine {len(jax.devices())}.")
    with tempfile.TemporaryDirectory() as folder:
        planned = os.path.join(folder, "plan.json")
        rest = [a for a in argv if a != "--check"]
        if "--json" in rest:
            at = rest.index("--json")
            del rest[at:at + 2]
        if _rerun([*rest, "--json", planned], count, memory_flags=True):
            return 1
        with open(planned) as handle:
            report = json.load(handle)
    chosen = report["recommended"]
    if chosen is None:
        raise ValueError("plan --check: the plan found no configuration that fits; nothing to run.")
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    pipe = architectures.build(args.arch, dtype or torch.float32) if args.arch else load_pipeline(args.model)
    config = TPUConfig(mesh=chosen["memory_per_device"]["mesh"], dtype=dtype, quantize=chosen["quantize"])
    pipe.to("jax", config=config)
    pipe(prompt="a cat walks on the grass", height=args.height, width=args.width, num_frames=args.frames,
         num_inference_steps=2, guidance_scale=args.guidance, max_sequence_length=args.max_sequence_length,
         output_type="latent")  # the denoiser steps the plan covers, not the VAE decode
    stats = [d.memory_stats() or {} for d in runtime.runtime_of(pipe).mesh.devices.flat]
    measured = max((s.get("peak_bytes_in_use", 0) for s in stats), default=0) or None
    report["check"] = {"platform": platform, "device_kind": jax.devices()[0].device_kind,
                       "measured_peak_bytes_per_device": measured,
                       "planned_bytes_per_device": chosen["total_bytes_per_device"]}
    print(f"check on {platform}: measured peak {measured / GIB:.2f} GiB per device, planned "
          f"{chosen['total_bytes_per_device'] / GIB:.2f} GiB" if measured else "check: the platform reports no peak")
    if args.json:
        from .stages import _write_atomically

        text = json.dumps(report, indent=1, default=str)
        _write_atomically(args.json, lambda temp: open(temp, "w").write(text))
    return 0
