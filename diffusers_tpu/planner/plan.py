"""Will it fit? ``diffusers-tpu plan``: XLA's memory analysis of the programs the runtime would compile.

For a pipeline (a real-size ``--arch`` built on the ``meta`` device with no weights, a local folder or a tiny
model), a size and a target (a chip slice or a mesh + HBM size), ``plan``:

1. finds the denoiser's call arguments by running the stock pipeline up to its first denoiser call (text
   embeddings given as zeros, so no text encoder runs; on ``meta`` nothing is computed);
2. builds the runtime's own compiled entry for the denoiser (``PipelineRuntime.denoiser_entry``: same forward,
   sharding rules, attention, input placement, LoRA inputs) with abstract weights carrying their planned shardings
   (``lowering.abstract_state``; int8 ones as ``quantize.Quantized``);
3. compiles it for a simulated mesh of CPU devices and reads ``compiled.memory_analysis()`` per device.

CPU-compiled plans approximate the TPU's: the CPU backend fuses and lays out differently (``plan_command.CPU_MEMORY_FLAGS`` make
it schedule for memory as a TPU compiler does) and the Pallas attention kernel is compiled in interpret mode, so
temporaries are estimates; the weights and arguments are exact. The Wan VAE's decode programs are planned the same
way (``vae_decode_memory``), block by block for causal Wan; not included yet: other VAEs' decode activations (their
weights are counted) and on-device text encoders (the default runs them on the host).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import os
from concurrent.futures import Future

import torch

from . import tpu_compiler
from .chips import GIB, Chip


# pipelines whose family gives ``plan_call`` (image-to-video ones take images, not planned yet)
PLANNED_PIPELINES = ("WanPipeline", "CogVideoXPipeline", "HunyuanVideo15Pipeline", "CausalWanPipeline",
                     "StableDiffusionXLPipeline")


# the prompt of planned calls that run the text encoders (quoted text: HunyuanVideo-1.5 runs its glyph encoder,
# ByT5, only for prompts with some)
PLAN_PROMPT = 'a cat holding a sign saying "hello" walks on the grass'


class _FirstCall(Exception):
    pass


def probe_denoiser_call(pipe, size: dict, text_tokens: int, dtype: torch.dtype, runtime=None,
                        prompt: str | None = None, keywords: dict | None = None) -> tuple[tuple, dict, bool]:
    """The positional and keyword arguments of the pipeline's first denoiser call for a video of ``size``
    (``height``, ``width``, ``num_frames``, ``guidance_scale``), text embeddings given as zeros
    (``Family.plan_call``), the denoiser reporting ``dtype`` as it will once placed; and whether the call is
    guided (a second, unconditional pass per step). ``runtime``: its family's ``prepare`` wraps the probe as it
    would the compiled entry (HunyuanVideo-1.5's token order comes in as an argument). ``prompt``: the call takes
    this prompt (and an empty negative one) instead, its text encoders run. ``keywords``: the call's own keywords
    (prompt included) for any pipeline, instead of the family's ``plan_call`` (``tpu_check``)."""
    from ..runtime.registry import family_of

    family = family_of(pipe)
    if keywords is None and (family.plan_call is None or type(pipe).__name__ not in PLANNED_PIPELINES):
        raise ValueError(f"plan supports {', '.join(PLANNED_PIPELINES)} so far, not {type(pipe).__name__}.")
    module = getattr(pipe, family.denoisers[0])
    seen = {}

    def record(*args, **kwargs):
        seen["call"] = (args, kwargs)
        raise _FirstCall

    # the pipeline casts inputs to ``transformer.dtype``: make it report the dtype the placed module will have; and
    # it runs on the CPU (latents, scheduler tables) even when the weights are on ``meta``
    cls, pipe_cls = type(module), type(pipe)
    module.__class__ = type(cls.__name__, (cls,), {"dtype": property(lambda self: dtype)})
    pipe.__class__ = type(pipe_cls.__name__, (pipe_cls,), {"_execution_device": property(lambda self: torch.device("cpu"))})
    if runtime is not None:
        runtime.overrides.set(module, "forward", record)  # where the compiled entry goes (undone with the runtime)
        if family.prepare is not None:
            family.prepare(pipe, runtime)
    else:
        vars(module)["forward"] = record
    bar = dict(getattr(pipe, "_progress_bar_config", {}))
    pipe.set_progress_bar_config(disable=True)
    try:
        with guidance(pipe, size["guidance_scale"]):
            guided = False
            try:
                call = keywords if keywords is not None else _call_keywords(
                    pipe, family.plan_call(pipe, size, text_tokens, dtype), text_tokens, prompt)
                pipe(**call, output_type="latent")
            except _FirstCall:
                guided = _guided(pipe)
    finally:
        if runtime is None:
            del vars(module)["forward"]
        module.__class__, pipe.__class__ = cls, pipe_cls
        pipe._progress_bar_config = bar
    if "call" not in seen:
        raise RuntimeError(f"{type(pipe).__name__} did not call its denoiser")
    return (*seen["call"], guided)


def _call_keywords(pipe, keywords: dict, text_tokens: int | None, prompt: str | None) -> dict:
    """``plan_call``'s keywords, or with ``prompt``: its text embeddings replaced by the prompt (the text
    encoders' inputs padded to ``text_tokens`` where the pipeline takes ``max_sequence_length``)."""
    if prompt is None:
        return keywords
    parameters = inspect.signature(pipe.__call__).parameters
    keywords = {k: v for k, v in keywords.items() if "prompt_embeds" not in k}
    keywords["prompt"] = prompt
    if "negative_prompt" in parameters:
        keywords["negative_prompt"] = ""
    if "max_sequence_length" in parameters and text_tokens:
        keywords["max_sequence_length"] = text_tokens
    return keywords


@contextlib.contextmanager
def guidance(pipe, scale: float):
    """Pipelines with a ``guider`` take the guidance scale there, not as a call argument: set it for a while."""
    guider = getattr(pipe, "guider", None)
    if guider is None or "guidance_scale" in inspect.signature(pipe.__call__).parameters:
        yield
        return
    pipe.guider = guider.new(guidance_scale=scale)
    try:
        yield
    finally:
        pipe.guider = guider


def _guided(pipe) -> bool:
    """Whether the call under way runs a second, unguided denoiser pass per step."""
    guider = getattr(pipe, "guider", None)
    if guider is not None:
        return guider._enabled and guider.num_conditions > 1
    flag = getattr(pipe, "do_classifier_free_guidance", None)  # Wan's property; CogVideoX keeps only the scale
    scale = getattr(pipe, "_guidance_scale", None)  # None: guidance-distilled (Flux, Qwen-Image: true CFG aside)
    return bool(flag) if flag is not None else scale is not None and scale > 1.0


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

    from ..runtime import quantize

    from ..interop.jit import Gathered, LayerOf, expand_stacked

    keep = getattr(module, "_keep_in_fp32_modules", None) or ()
    state = expand_stacked(state)
    for name, _ in module.named_parameters():
        value = state[name].array if isinstance(state[name], (LayerOf, Gathered)) else state[name]
        if isinstance(value, quantize.Quantized) or any(m in name for m in keep):
            continue
        dtype = mappings.j2t_dtype(value.dtype)
        if dtype.is_floating_point:
            return dtype
    return torch.float32


def abstract_weights(module, mesh, rules, dtype, quantize_format=None, stacked: bool = True,
                     fully_sharded: bool = False) -> dict:
    """The denoiser's weights as the runtime would hold them: ShapeDtypeStructs with their shardings; ``stacked``
    (``TPUConfig.scan_blocks``): repeated blocks' weights stacked (``runtime.stacked_weights``), ``fully_sharded``
    over every mesh axis (``TPUConfig.fully_sharded_weights``)."""
    from . import lowering
    from ..interop import sharding
    from ..runtime import quantize, stacked_weights
    from ..interop.backend import jax_dtype

    keep = getattr(module, "_keep_in_fp32_modules", None) or ()
    state = lowering.abstract_state(module, mesh, rules, dtype, keep)
    for name in quantize.targets(module) if quantize_format else ():
        state[name] = quantize.abstract(state[name], quantize_format, jax_dtype(dtype or torch.float32))
    if stacked:
        slots = sharding.plan(module, dict(mesh.shape), rules, dtype, keep)
        state = stacked_weights.abstract(module, slots, state, mesh, fully_sharded)
    return state


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


def denoiser_memory(pipe, size: dict, config, devices, text_tokens: int, vae: bool = False,
                    tile_above: float | None = None, shared: dict | None = None) -> dict:
    """XLA's memory analysis (bytes per device) of one denoiser step as the runtime would compile it, for a video of
    ``size`` (``probe_denoiser_call``); a call with several denoiser programs (``Family.plan_passes``) reports the
    largest, each in ``report["passes"]``. ``vae``: also the VAE decode programs for the latents the call makes
    (``report["vae_decode"]``, None without them); a VAE that can tile is planned tiled too
    (``report["vae_decode_tiled"]``) when its whole-video decode beside the denoiser's arguments exceeds
    ``tile_above`` bytes. ``shared``: a dict kept across calls for the same pipeline, size and devices, in which
    the VAE's analyses (independent of the denoiser's mesh) are computed once."""
    return start_denoiser_memory(pipe, size, config, devices, text_tokens, vae, tile_above, shared)()


def _mesh_shape(config, devices, pipe) -> dict:
    """The mesh ``pipe.to`` builds for ``config`` on ``devices``."""
    from ..interop import backend
    from ..runtime.registry import family_of

    heads = family_of(pipe).num_heads(pipe)
    return (backend.validate_mesh_shape(config.mesh, len(devices), heads) if config.mesh is not None
            else backend.default_mesh_shape(len(devices), heads, pair_batch=True))


@contextlib.contextmanager
def _attached(pipe, config, devices):
    """The runtime ``pipe.to`` would attach for ``config`` on ``devices`` (mesh built, nothing placed), undone after."""
    from ..interop import backend
    from ..runtime.attach import PipelineRuntime
    from ..runtime.registry import family_of

    runtime = PipelineRuntime(pipe, family_of(pipe), config, backend.Target("tpu", devices[0].platform),
                              backend.build_mesh(_mesh_shape(config, devices, pipe), devices), None)
    if tpu_compiler.is_tpu(devices) and not tpu_compiler.is_attached(devices):
        # compiling for a TPU slice without one: no default device (nothing can be placed on a described device;
        # an array committed to one, or to this host, does not mix with the program's sharded values)
        runtime.home_device = None
    try:
        yield runtime
    finally:
        runtime.undo()


def start_denoiser_memory(pipe, size: dict, config, devices, text_tokens: int, vae: bool = False,
                          tile_above: float | None = None, shared: dict | None = None, compiler=None, analyse=None):
    """``denoiser_memory`` in two halves, so candidates overlap: the denoiser's programs are traced and lowered
    here, compiled by ``compiler`` (a ``concurrent.futures`` executor: XLA compiles without the GIL while this thread
    traces the next candidate; None: here and now); the returned function waits for them and gives the report.
    ``analyse(lowered) -> dict``: what is reported of each program (default: its memory analysis; ``cost`` gives
    ``hlo_stats.summary``, which holds the same keys)."""
    from torch.utils import _pytree as pytree

    from ..interop import jit

    analyse = tpu_compiler.remembered(analyse or jit.compiled_memory, devices, config.resolved_cache_dir())
    submit = (lambda lowered: compiler.submit(analyse, lowered)) if compiler is not None else (
        lambda lowered: _compiled_now(lowered, analyse))

    extra, tiling = {}, None
    with _attached(pipe, config, devices) as runtime:
        family, mesh = runtime.family, runtime.mesh
        module = getattr(pipe, family.denoisers[0])
        rules = family.rules(module, dict(mesh.shape))
        state = abstract_weights(module, mesh, rules, config.dtype, config.quantize, config.scan_blocks,
                                 config.fully_sharded_weights)
        entry = runtime.denoiser_entry(module, rules, state=lambda: state)  # before the probe takes its place
        reported = _reported_dtype(module, state)
        args, kwargs, guided = probe_denoiser_call(pipe, size, text_tokens, reported, runtime)
        batch = 2 if runtime.pairing is not None and guided else 1
        args, kwargs = pytree.tree_map(lambda value: _concrete(value, batch), (args, kwargs))
        passes = [kwargs, *(family.plan_passes(kwargs) if family.plan_passes is not None else ())]
        lowered = [jit.lowered_output_shapes(entry.whole, *args, **keywords) for keywords in passes]
        pending = [submit(program) for program, _ in lowered]
        if vae and config.text_encoder == "jax":
            extra["text_encoders"] = text_encoder_memory(pipe, config, runtime, size, text_tokens, reported)
        if vae and family.vae_install is None and family.decode_latents is not None:
            # one video's latents as the loop leaves them (the denoiser's output shape)
            out = pytree.tree_leaves(lowered[0][1])[0]
            latents = torch.zeros(1, *out.shape[1:], dtype=out.dtype)
            key = _vae_key(config, devices, tuple(latents.shape), latents.dtype, size["num_frames"])
            extra["vae_decode"] = _analysed_once(shared, (*key, "whole"),
                                          lambda: _vae_method_started(pipe, config, runtime, latents, size, submit))
            if tile_above is not None and hasattr(pipe.vae, "enable_tiling") and not pipe.vae.use_tiling:
                tiling = (key, latents)  # decided once the step's argument bytes are known
        elif vae:
            latents = kwargs.get("hidden_states", args[0] if args else None)
            # a streaming denoiser (causal Wan) makes one block of latent frames at a time, decoded as it comes
            block = getattr(module.config, "num_frame_per_block", None)
            shape, chunk = (1, *latents.shape[1:]), latents.shape[2] if block else config.vae_decode_chunk
            extra["vae_decode"] = _analysed_once(shared, _vae_key(config, devices, shape, chunk),
                                          lambda: _vae_decode_started(pipe, config, runtime, shape, chunk, submit))
        facts = dict(mesh=dict(mesh.shape), cfg_batch=batch, guided=guided,
                     attention=runtime.attention.implementation)

    def finish() -> dict:
        analyses = [future.result() for future in pending]
        finished = {name: value() if callable(value) else value for name, value in extra.items()}
        report = dict(max(analyses, key=lambda analysis: analysis["peak_bytes"]), passes=analyses, **finished)
        whole, text = report.get("vae_decode"), report.get("text_encoders")
        beside = report["argument_bytes"] + (text["weight_bytes"] if text else 0)  # as plan() adds them
        if tiling is not None and whole and whole["peak_bytes"] + beside > tile_above:
            key, latents = tiling

            def tiled():
                with _attached(pipe, config, devices) as runtime:
                    pipe.vae.enable_tiling()
                    try:
                        return vae_method_memory(pipe, config, runtime, latents, size)
                    finally:
                        pipe.vae.disable_tiling()

            report["vae_decode_tiled"] = _analysed_once(shared, (*key, "tiled"), lambda: functools.cache(tiled))()
        return dict(report, **facts)

    return finish


def vae_decode_memory(pipe, config, runtime, latent_shape: tuple, chunk: int) -> dict | None:
    """XLA's memory analysis (bytes per device) of the Wan VAE's decode programs as the runtime compiles them for
    ``latent_shape`` ``[1, C, frames, H, W]``: the first two latent frames, and the chunk program (``chunk`` latent
    frames) the rest run in (its carried cache from the first). None for a VAE without such programs."""
    return _vae_decode_started(pipe, config, runtime, latent_shape, chunk, _compiled_now)()


def _vae_decode_started(pipe, config, runtime, latent_shape: tuple, chunk: int, submit):
    """``vae_decode_memory`` lowered here, compiled by ``submit``: returns the function that gives the report."""
    from ..interop import jit
    from . import lowering

    vae = getattr(pipe, "vae", None)
    if vae is None or runtime.family.vae_install is None:
        return lambda: None
    state = lowering.abstract_state(vae, runtime.vae_mesh, (), config.vae_weights_dtype)
    runtime.family.vae_install(vae, runtime, lambda: state, runtime._width_input)
    programs = vae._diffusers_tpu_programs
    batch, channels, frames, height, width = latent_shape
    head = torch.zeros(batch, channels, min(frames, 2), height, width)
    first, (_, cache) = jit.lowered_output_shapes(programs["decode_first"], head)
    pending = {"decode_first": submit(first)}
    if frames > 2:
        body = torch.zeros(batch, channels, chunk, height, width)
        pending["decode_chunk"] = submit(jit.lower(programs["decode_chunk"], body, cache))

    def finish() -> dict:
        report = {name: future.result() for name, future in pending.items()}
        return dict(report, peak_bytes=max(analysis["peak_bytes"] for analysis in report.values()))

    return functools.cache(finish)


def _compiled_now(lowered, analyse=None) -> Future:
    """Compile here and now (``plan`` without a background compiler)."""
    from ..interop import jit

    done = Future()
    done.set_result((analyse or jit.compiled_memory)(lowered))
    return done


def vae_method_memory(pipe, config, runtime, latents: torch.Tensor, size: dict) -> dict | None:
    """XLA's memory analysis (bytes per device) of every program the stock decode (``Family.decode_latents``) runs
    through the family's compiled VAE methods (``Family.vae_methods``: HunyuanVideo-1.5's whole-video decoder,
    CogVideoX's frame batches with their carried cache) for the latents the denoiser makes: the stock code runs on
    the host around them, each program answering with zeros of its outputs (``compile.lowered_zero_outputs``);
    ``latents``: one video's, as the denoising loop leaves them."""
    return _vae_method_started(pipe, config, runtime, latents, size, _compiled_now)()


def _vae_method_started(pipe, config, runtime, latents: torch.Tensor, size: dict, submit):
    """``vae_method_memory`` walked here, its programs compiled by ``submit``: returns the function giving it."""
    from . import lowering

    vae, family = pipe.vae, runtime.family
    state = lowering.abstract_state(vae, runtime.vae_mesh, (), config.vae_weights_dtype)
    programs, stand_ins = {}, {}
    for spec in family.vae_methods:
        path, _, method = spec.rpartition(".")
        owner = vae.get_submodule(path) if path else vae
        prefix = f"{path}." if path else ""
        owned = {name[len(prefix):]: value for name, value in state.items() if name.startswith(prefix)}
        compiled = runtime.compiled_vae_method(owner, method, lambda owned=owned: owned)
        stand_ins[(owner, method)] = _zero_answers(compiled, programs, submit)
    with _standing_in(stand_ins), torch.no_grad():
        family.decode_latents(pipe, latents, size["num_frames"])

    def finish() -> dict | None:
        analyses = [future.result() for future, _ in programs.values()]
        return {"programs": analyses, "peak_bytes": max(a["peak_bytes"] for a in analyses)} if analyses else None

    return functools.cache(finish)


@contextlib.contextmanager
def _standing_in(stand_ins: dict):
    """``{(owner, method name): function}`` installed for a while (each compiled from the method it replaces,
    which must not be an earlier stand-in)."""
    previous = {key: vars(key[0]).get(key[1]) for key in stand_ins}
    for (owner, method), function in stand_ins.items():
        setattr(owner, method, function)
    try:
        yield
    finally:
        for (owner, method), function in previous.items():
            if function is None:
                vars(owner).pop(method, None)
            else:
                setattr(owner, method, function)


def _zero_answers(compiled, programs: dict, submit=None):
    """A stand-in for the compiled method ``compiled``: each new program it is called with is lowered, compiled by
    ``submit`` (``programs``: key -> (future analysis, outputs)) and answered with host zeros of its outputs."""
    from torch.utils import _pytree as pytree

    from ..interop import jit

    def record(*args, **kwargs):
        leaves = pytree.tree_leaves((args, kwargs))
        key = (id(compiled), tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in leaves))
        if key not in programs:
            lowered, out = jit.lowered_zero_outputs(compiled, *args, **kwargs)
            programs[key] = ((submit or _compiled_now)(lowered), out)
        return programs[key][1]

    return record


def text_encoder_memory(pipe, config, runtime, size: dict, text_tokens: int, dtype: torch.dtype) -> dict | None:
    """With ``TPUConfig(text_encoder="jax")``: XLA's memory analysis of every text-encoder program a call with a
    prompt runs (weights replicated, as the runtime places them), and their weight bytes per device. None without a
    tokenizer (a folder planned without its text encoders)."""
    from ..interop import jit
    from . import lowering
    from ..runtime import placement
    from ..runtime.attach import component_dtype

    names = placement.text_encoder_names(pipe)
    if not names or getattr(pipe, "tokenizer", None) is None:
        return None
    programs, weights, stand_ins = {}, 0, {}
    for name in names:
        module = getattr(pipe, name)
        keep = getattr(module, "_keep_in_fp32_modules", None) or ()
        state = lowering.abstract_state(module, runtime.mesh, (), component_dtype(
            runtime.family, config, runtime.target, name, None), keep)
        weights += sum(state[n].size * state[n].dtype.itemsize for n, _ in module.named_parameters())  # tied once
        compiled = jit.compiled_method(module, "forward", state=lambda state=state: state, activate=runtime.active)
        stand_ins[(module, "forward")] = _zero_answers(compiled, programs)
    with _standing_in(stand_ins):
        probe_denoiser_call(pipe, size, text_tokens, dtype, prompt=PLAN_PROMPT)
    analyses = [future.result() for future, _ in programs.values()]
    return {"programs": analyses, "peak_bytes": max(a["peak_bytes"] for a in analyses), "weight_bytes": weights}


def weight_bytes(module: torch.nn.Module, dtype: torch.dtype | None) -> int:
    """Bytes of a replicated component's weights (the VAE) in ``dtype`` (None: as built)."""
    return sum(p.numel() * (torch.finfo(dtype).bits // 8 if dtype and p.is_floating_point() else p.element_size())
               for p in module.parameters())


def plan(pipe, size: dict, config, devices, chip: Chip | None, hbm_gib: float | None, text_tokens: int,
         shared: dict | None = None) -> dict:
    """The plan for one configuration (a video of ``size``: ``height``, ``width``, ``num_frames``,
    ``guidance_scale``): memory per device, verdict, FLOPs per step and the floor step time. ``shared``: one dict
    passed to every candidate of a pipeline, size and devices (what does not depend on the mesh is analysed once)."""
    return start_plan(pipe, size, config, devices, chip, hbm_gib, text_tokens, shared)()


def plan_all(pipe, size: dict, configs: list, devices, chip: Chip | None, hbm_gib: float | None, text_tokens: int,
             ahead: int | None = None, vae: bool = True):
    """``plan`` for each configuration in turn, yielding the rows in order, faster: XLA compiles without the GIL,
    so candidates' programs compile in background threads (one per core, at most ``COMPILE_THREADS``) while this
    thread traces the next ones; what does not depend on the mesh (the VAE) is analysed once. ``ahead``: candidates
    started before the first row is awaited (default: one per thread; 1 when the caller may stop at any row);
    ``vae=False``: the denoiser steps only."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    shared, workers = {}, max(1, min(COMPILE_THREADS, len(os.sched_getaffinity(0))))
    ahead = ahead or workers
    with ThreadPoolExecutor(workers, thread_name_prefix="diffusers_tpu-plan-compile") as compiler:
        started = deque()
        for config in configs:
            if len(started) == ahead:
                yield started.popleft()()
            started.append(start_plan(pipe, size, config, devices, chip, hbm_gib, text_tokens, shared, compiler, vae))
        while started:
            yield started.popleft()()


# at most this many candidate programs compile at once: each holds the whole step's HLO (a few GB for 14B models)
COMPILE_THREADS = 2


def start_plan(pipe, size: dict, config, devices, chip: Chip | None, hbm_gib: float | None, text_tokens: int,
               shared: dict | None = None, compiler=None, vae: bool = True):
    """``plan`` in two halves (``start_denoiser_memory``): returns the function that completes the row."""
    from ..runtime.registry import family_of

    hbm = (chip.usable_gib() if chip else hbm_gib)
    started = start_denoiser_memory(pipe, size, config, devices, text_tokens, vae=vae,
                                    tile_above=hbm * GIB if hbm else None, shared=shared, compiler=compiler)
    vae = getattr(pipe, "vae", None)
    vae_weights = weight_bytes(vae, config.vae_weights_dtype) if vae is not None else 0
    family = family_of(pipe)
    flops = (family.forward_flops(pipe, size["height"], size["width"], size["num_frames"], text_tokens)
             if family.forward_flops is not None else None)

    def finish() -> dict:
        try:
            memory = started()
        except Exception as error:  # the TPU compiler refusing the configuration (HBM, VMEM) is its verdict
            reason = tpu_compiler.refusal(error) if tpu_compiler.is_tpu(devices) else None
            if reason is None:
                raise
            return {"memory_per_device": {"mesh": _mesh_shape(config, devices, pipe)},
                    "refused": reason, "fits": False, "steps_fit": False, "hbm_gib": hbm, "vae_tiling": False,
                    "total_bytes_per_device": None, "dtype": str(config.dtype or "as loaded"),
                    "quantize": config.quantize, "fully_sharded_weights": config.fully_sharded_weights,
                    "text_encoder": config.text_encoder}
        memory["vae_weight_bytes"] = vae_weights
        # every weight stays on the devices: the steps run beside the VAE's (and on-device text encoders') weights,
        # the decode beside the denoiser's, the text encoders beside both
        text = memory.get("text_encoders")
        text_weights = text["weight_bytes"] if text else 0
        steps = memory["peak_bytes"] + memory["vae_weight_bytes"] + text_weights
        decode = (memory["argument_bytes"] + memory.get("vae_decode")["peak_bytes"] + text_weights
                  if memory.get("vae_decode") else 0)
        tiled = memory.get("vae_decode_tiled")
        tiling = bool(tiled and hbm and decode > hbm * GIB)  # the whole-video decode does not fit: recommend tiles
        if tiling:
            decode = memory["argument_bytes"] + tiled["peak_bytes"] + text_weights
        encode = text["peak_bytes"] + memory["argument_bytes"] + memory["vae_weight_bytes"] if text else 0
        total = max(steps, decode, encode)
        report = {"memory_per_device": memory, "total_bytes_per_device": total, "hbm_gib": hbm,
                  "vae_tiling": tiling, "steps_bytes_per_device": steps, "decode_bytes_per_device": decode or None,
                  "text_encode_bytes_per_device": encode or None,
                  "fits": total <= hbm * GIB if hbm else None, "steps_fit": steps <= hbm * GIB if hbm else None,
                  "dtype": str(config.dtype or "as loaded"), "quantize": config.quantize,
                  "fully_sharded_weights": config.fully_sharded_weights, "text_encoder": config.text_encoder}
        if flops is not None:
            per_step = flops * (2 if memory["guided"] else 1)
            report["flops_per_step"] = per_step
            if chip:
                report["floor_step_seconds"] = per_step / (chip.peak_tflops * 1e12 * len(devices))
        return report

    return finish


def folder_pipeline(folder: str, dtype: torch.dtype | None):
    """A local pipeline folder with its denoiser on the ``meta`` device (checked against the checkpoint, nothing
    read) and no text encoder: what ``plan`` needs, without the weights in host memory."""
    import json

    import diffusers

    from ..runtime import loading

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
