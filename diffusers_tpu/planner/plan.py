"""Will it fit? ``diffusers-tpu plan``: the memory analysis of the programs the runtime would compile.

For a pipeline (a real-size ``--arch`` built on the ``meta`` device with no weights, a local folder or a tiny
model), a size and a target (a chip slice or a mesh + HBM size), ``plan``:

1. finds the denoiser's call arguments by running the stock pipeline up to its first denoiser call
   (``call_probe``: text embeddings given as zeros, so no text encoder runs; on ``meta`` nothing is computed);
2. builds the runtime's own compiled entry for the denoiser (``PipelineRuntime.denoiser_entry``: same forward,
   sharding rules, attention, input placement, LoRA inputs) with abstract weights carrying their planned shardings
   (``lowering.abstract_state``; int8 ones as ``quantize.Quantized``), and the programs around it
   (``program_memory``: the VAE decode programs, text encoders placed on the devices);
3. compiles them with the TPU compiler for the slice's described devices when libtpu is installed
   (``tpu_compiler``), else for a simulated mesh of CPU devices (an estimate: the CPU backend fuses and lays out
   differently, ``plan_command.CPU_MEMORY_FLAGS`` make it schedule for memory as a TPU compiler does, and the Pallas
   kernel compiles in interpret mode; weights and arguments are exact either way), and reads the memory analysis
   per device against the target's memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import torch
from torch.utils import _pytree as pytree

from ..interop import backend, program_figures
from ..runtime import decision
from ..runtime.attach import moves
from ..runtime.registry import family_of
from ..runtime.weights import host_memory
from . import abstract_weights, call_probe, program_memory, step_estimate, tpu_compiler
from .chips import GIB, Chip


def _vae_key(config, devices, *shape) -> tuple:
    """What a VAE decode analysis depends on: the VAE runs on every device as one spatial axis whatever the
    denoiser's mesh, so candidates that differ only in ``mesh`` share it (``plan``'s ``shared``)."""
    return (repr(dataclasses.replace(config, mesh=None)), tuple(d.id for d in devices), *shape)


def _analysed_once(shared: dict | None, key: tuple, analyse):
    if shared is None:
        return analyse()
    if key not in shared:
        shared[key] = analyse()
    return shared[key]


def denoiser_memory(
    pipe,
    size: dict,
    config,
    devices,
    text_tokens: int,
    vae: bool = False,
    tile_above: float | None = None,
    shared: dict | None = None,
) -> dict:
    """XLA's memory analysis (bytes per device) of one denoiser step as the runtime would compile it, for a video of
    ``size`` (``probe_denoiser_call``); a call with several denoiser programs (``Planning.passes``) reports the
    largest, each in ``report["passes"]``. ``vae``: also the VAE decode programs for the latents the call makes
    (``report["vae_decode"]``, None without them); a VAE that can tile is planned tiled too
    (``report["vae_decode_tiled"]``) when its whole-video decode beside the denoiser's arguments exceeds
    ``tile_above`` bytes. ``shared``: a dict kept across calls for the same pipeline, size and devices, in which
    the VAE's analyses (independent of the denoiser's mesh) are computed once."""
    return start_denoiser_memory(pipe, size, config, devices, text_tokens, vae, tile_above, shared)()


@contextlib.contextmanager
def attached(pipe, config, devices):
    """The runtime ``pipe.to`` would attach for ``config`` on ``devices`` (its ``decision``: mesh built, nothing
    placed), undone after."""
    runtime = moves.unplaced(pipe, _decided(pipe, config, devices))
    if tpu_compiler.is_tpu(devices) and not tpu_compiler.is_attached(devices):
        # compiling for a TPU slice without one: no default device (nothing can be placed on a described device;
        # an array committed to one, or to this host, does not mix with the program's sharded values)
        runtime.home_device = None
    try:
        yield runtime
    finally:
        runtime.undo()


def start_denoiser_memory(
    pipe,
    size: dict,
    config,
    devices,
    text_tokens: int,
    vae: bool = False,
    tile_above: float | None = None,
    shared: dict | None = None,
    compiler=None,
    analyse=None,
    step_analyse=None,
):
    """``denoiser_memory`` in two halves, so candidates overlap: the denoiser's programs are traced and lowered
    here, compiled by ``compiler`` (a ``concurrent.futures`` executor: XLA compiles without the GIL while this thread
    traces the next candidate; None: here and now); the returned function waits for them and gives the report.
    ``analyse(lowered) -> dict``: what is reported of each program (default: its memory analysis; ``cost`` gives
    ``hlo_stats.summary``, which holds the same keys); ``step_analyse``: another for the denoiser step alone (``plan``
    ranks meshes by the step's figures, while the VAE's remembered memory analyses stay valid)."""

    def prepared(function):
        function = tpu_compiler.remembered(function, devices, config.resolved_cache_dir())
        if tpu_compiler.is_tpu(devices):  # minutes for some programs: say which, and for how long
            function = tpu_compiler.announced(function)
        return function

    def submitter(function):
        if compiler is not None:
            return lambda lowered: compiler.submit(function, lowered)
        return lambda lowered: program_memory.compiled_now(lowered, function)

    analyse = prepared(analyse or program_figures.compiled_memory)
    submit = submitter(analyse)
    submit_step = submitter(prepared(step_analyse)) if step_analyse is not None else submit

    extra, tiling = {}, None
    with attached(pipe, config, devices) as runtime:
        family, mesh = runtime.family, runtime.mesh
        denoiser = runtime.decision.component(family.denoisers[0])  # as pipe.to places it
        module, rules = denoiser.module, denoiser.rules
        state = abstract_weights.abstract_component(denoiser, mesh, config)
        hosted = host_memory.bytes_per_device(state)
        entry = runtime.denoiser_entry(module, rules, state=lambda: state)  # before the probe takes its place
        reported = abstract_weights.reported_dtype(module, state)
        args, kwargs, guided = call_probe.probe_denoiser_call(pipe, size, text_tokens, reported, runtime)
        batch = 2 if runtime.pairing is not None and guided else 1
        args, kwargs = pytree.tree_map(lambda value: call_probe.concrete(value, batch), (args, kwargs))
        passes = [kwargs, *(family.planning.passes(kwargs) if family.planning.passes is not None else ())]
        lowered = [program_figures.lowered_output_shapes(entry.whole, *args, **keywords) for keywords in passes]
        for number, (program, _) in enumerate(lowered):
            program.label = "the denoiser step" + (f" (pass {number + 1})" if len(lowered) > 1 else "")
        pending = [submit_step(program) for program, _ in lowered]
        if vae and config.text_encoder == "jax":
            extra["text_encoders"] = program_memory.text_encoder_started(
                pipe, config, runtime, size, text_tokens, reported, submit
            )
        if vae and family.vae_install is None and family.decode_latents is not None:
            # one video's latents as the loop leaves them (the denoiser's output shape)
            out = pytree.tree_leaves(lowered[0][1])[0]
            latents = torch.zeros(1, *out.shape[1:], dtype=out.dtype)
            key = _vae_key(config, devices, tuple(latents.shape), latents.dtype, size["num_frames"])
            extra["vae_decode"] = _analysed_once(
                shared,
                (*key, "whole"),
                lambda: program_memory.vae_method_started(
                    pipe, config, runtime, latents, size, program_memory.vae_submit(submit, config, runtime)
                ),
            )
            if tile_above is not None and hasattr(pipe.vae, "enable_tiling") and not pipe.vae.use_tiling:
                tiling = (key, latents)  # decided once the step's argument bytes are known
        elif vae:
            latents = kwargs.get("hidden_states", args[0] if args else None)
            # a streaming denoiser (causal Wan) makes one block of latent frames at a time, decoded as it comes
            block = getattr(module.config, "num_frame_per_block", None)
            shape, chunk = (1, *latents.shape[1:]), latents.shape[2] if block else config.vae_decode_chunk
            extra["vae_decode"] = _analysed_once(
                shared,
                _vae_key(config, devices, shape, chunk),
                lambda: program_memory.vae_decode_started(
                    pipe, config, runtime, shape, chunk, program_memory.vae_submit(submit, config, runtime)
                ),
            )
        # the denoiser's calls per step: the pair as two calls, unless the runtime batches it or the pipeline itself
        # does (CogVideoX concatenates it: its one call already holds both halves)
        first = kwargs.get("hidden_states", args[0] if args else None)
        in_one_call = batch == 2 or (isinstance(first, torch.Tensor) and first.dim() > 0 and first.shape[0] > 1)
        calls = 2 if guided and not in_one_call else 1
        facts = dict(
            mesh=dict(mesh.shape),
            cfg_batch=batch,
            guided=guided,
            calls_per_step=calls,
            attention=runtime.attention.implementation,
        )

    def finish() -> dict:
        analyses = [program_memory.host_arguments_apart(future.result(), hosted) for future in pending]
        finished = {name: value() if callable(value) else value for name, value in extra.items()}
        report = dict(max(analyses, key=lambda analysis: analysis["peak_bytes"]), passes=analyses, **finished)
        whole, text = report.get("vae_decode"), report.get("text_encoders")
        beside = report["argument_bytes"] + (text["weight_bytes"] if text else 0)  # as plan() adds them
        if tiling is not None and whole and whole["peak_bytes"] + beside > tile_above:
            key, latents = tiling

            def tiled():
                with attached(pipe, config, devices) as runtime:
                    pipe.vae.enable_tiling()
                    try:
                        return program_memory.vae_method_memory(pipe, config, runtime, latents, size)
                    finally:
                        pipe.vae.disable_tiling()

            report["vae_decode_tiled"] = _analysed_once(shared, (*key, "tiled"), lambda: functools.cache(tiled))()
        return dict(report, **facts)

    return finish


def _decided(pipe, config, devices) -> decision.Decision:
    """What ``pipe.to`` decides for ``config`` on ``devices`` (text encoders as ``config`` says: ``plan_command``
    resolves "auto" against its chip first)."""
    return decision.decide(pipe, config, backend.Target("tpu", devices[0].platform), devices, memory_limit=None)


def weight_bytes(module: torch.nn.Module, dtype: torch.dtype | None) -> int:
    """Bytes of a replicated component's weights (the VAE) in ``dtype`` (None: as built)."""
    return sum(
        p.numel() * (torch.finfo(dtype).bits // 8 if dtype and p.is_floating_point() else p.element_size())
        for p in module.parameters()
    )


def plan(
    pipe,
    size: dict,
    config,
    devices,
    chip: Chip | None,
    hbm_gib: float | None,
    text_tokens: int,
    shared: dict | None = None,
) -> dict:
    """The plan for one configuration (a video of ``size``: ``height``, ``width``, ``num_frames``,
    ``guidance_scale``): memory per device, verdict, FLOPs per step and the floor step time. ``shared``: one dict
    passed to every candidate of a pipeline, size and devices (what does not depend on the mesh is analysed once)."""
    return start_plan(pipe, size, config, devices, chip, hbm_gib, text_tokens, shared)()


def plan_all(
    pipe,
    size: dict,
    configs: list,
    devices,
    chip: Chip | None,
    hbm_gib: float | None,
    text_tokens: int,
    ahead: int | None = None,
    vae: bool = True,
    attention_efficiency: float = step_estimate.DEFAULT_ATTENTION_EFFICIENCY,
    quick: bool = False,
):
    """``plan`` for each configuration in turn, yielding the rows in order, faster: XLA compiles without the GIL,
    so candidates' programs compile in background threads (one per core, at most ``COMPILE_THREADS``) while this
    thread traces the next ones; what does not depend on the mesh (the VAE) is analysed once. ``ahead``: candidates
    started before the first row is awaited (default: one per thread, every one when ``quick``; 1 when the caller may
    stop at any row);
    ``vae=False``: the denoiser steps only; ``quick``: the steps compiled at XLA's quick effort (a screening: same
    FLOPs and collectives, other bytes and temporaries than the runtime's full-effort program)."""
    shared, workers = {}, max(1, min(COMPILE_THREADS, len(os.sched_getaffinity(0))))
    # a screening traces every candidate at once: the first row waits for the VAE's programs (a minute at 720p), and
    # the pool would idle meanwhile; each traced step (blocks scanned) holds a small program
    ahead = ahead or (len(configs) if quick else workers)
    with ThreadPoolExecutor(workers, thread_name_prefix="diffusers_tpu-plan-compile") as compiler:
        started = deque()
        for config in configs:
            if len(started) == ahead:
                yield started.popleft()()
            row = (pipe, size, config, devices, chip, hbm_gib, text_tokens, shared, compiler, vae, attention_efficiency)
            started.append(start_plan(*row, quick=quick))
        while started:
            yield started.popleft()()


# at most this many candidate programs compile at once: each holds the whole step's HLO (a few GB for 14B models)
COMPILE_THREADS = 2


def start_plan(
    pipe,
    size: dict,
    config,
    devices,
    chip: Chip | None,
    hbm_gib: float | None,
    text_tokens: int,
    shared: dict | None = None,
    compiler=None,
    vae: bool = True,
    attention_efficiency: float = step_estimate.DEFAULT_ATTENTION_EFFICIENCY,
    quick: bool = False,
):
    """``plan`` in two halves (``start_denoiser_memory``): returns the function that completes the row. Rows
    compiled for a TPU chip carry the step's ``estimate`` (``step_estimate``; attention at ``attention_efficiency``);
    ``quick``: from the step compiled at XLA's quick effort (``plan_all``), the row's ``step_effort`` says which."""
    hbm = chip.usable_gib() if chip else hbm_gib
    estimated = step_estimate.estimable(chip, tpu_compiler.is_tpu(devices))
    figures = tpu_compiler.quick_figures if quick else tpu_compiler.compiled_figures
    started = start_denoiser_memory(
        pipe,
        size,
        config,
        devices,
        text_tokens,
        vae=vae,
        tile_above=hbm * GIB if hbm else None,
        shared=shared,
        compiler=compiler,
        step_analyse=figures if estimated else None,
    )
    vae = getattr(pipe, "vae", None)
    vae_weights = weight_bytes(vae, config.vae_weights_dtype) if vae is not None else 0
    family = family_of(pipe)
    flops = (
        family.planning.forward_flops(pipe, size["height"], size["width"], size["num_frames"], text_tokens)
        if family.planning.forward_flops is not None
        else None
    )

    def finish() -> dict:
        try:
            memory = started()
        except Exception as error:  # the TPU compiler refusing the configuration (HBM, VMEM) is its verdict
            reason = tpu_compiler.refusal(error) if tpu_compiler.is_tpu(devices) else None
            if reason is None:
                raise
            return {
                "memory_per_device": {"mesh": _decided(pipe, config, devices).mesh_shape},
                "refused": reason,
                "fits": False,
                "steps_fit": False,
                "hbm_gib": hbm,
                "vae_tiling": False,
                "total_bytes_per_device": None,
                "dtype": str(config.dtype or "as loaded"),
                "quantize": config.quantize,
                "fully_sharded_weights": config.fully_sharded_weights,
                "weights_in_host_memory": config.weights_in_host_memory,
                "text_encoder": config.text_encoder,
            }
        memory["vae_weight_bytes"] = vae_weights
        # device-memory weights stay on the devices: the steps run beside the VAE's (and on-device text encoders')
        # weights, the decode beside the denoiser's, the text encoders beside both; host-memory weights are on the
        # devices only inside the programs that read them (their figures count them)
        text = memory.get("text_encoders")
        text_weights = text["weight_bytes"] if text else 0
        steps = memory["peak_bytes"] + (0 if config.in_host_memory("vae") else vae_weights) + text_weights
        decode = (
            memory["argument_bytes"] + memory.get("vae_decode")["peak_bytes"] + text_weights
            if memory.get("vae_decode")
            else 0
        )
        tiled = memory.get("vae_decode_tiled")
        tiling = bool(tiled and hbm and decode > hbm * GIB)  # the whole-video decode does not fit: recommend tiles
        if tiling:
            decode = memory["argument_bytes"] + tiled["peak_bytes"] + text_weights
        encode = text["peak_bytes"] + memory["argument_bytes"] + memory["vae_weight_bytes"] if text else 0
        total = max(steps, decode, encode)
        report = {
            "memory_per_device": memory,
            "total_bytes_per_device": total,
            "hbm_gib": hbm,
            "vae_tiling": tiling,
            "steps_bytes_per_device": steps,
            "decode_bytes_per_device": decode or None,
            "text_encode_bytes_per_device": encode or None,
            "fits": total <= hbm * GIB if hbm else None,
            "steps_fit": steps <= hbm * GIB if hbm else None,
            "dtype": str(config.dtype or "as loaded"),
            "quantize": config.quantize,
            "fully_sharded_weights": config.fully_sharded_weights,
            "weights_in_host_memory": config.weights_in_host_memory,
            "text_encoder": config.text_encoder,
            "step_effort": "quick" if quick and estimated else "full",
        }
        if estimated:
            report["estimate"] = step_estimate.of_passes(
                memory["passes"], chip, attention_efficiency, memory["calls_per_step"]
            )
        if flops is not None:
            per_step = flops * (2 if memory["guided"] else 1)
            report["flops_per_step"] = per_step
            if chip:
                report["floor_step_seconds"] = per_step / (chip.peak_tflops * 1e12 * len(devices))
        return report

    return finish
