"""What the programs around the denoiser need: the VAE decode programs (Wan's chunked ones, or every program a
family's stock decode runs through its compiled VAE methods) and text encoders placed on the devices, each lowered
as the runtime compiles it and analysed by ``plan``'s ``submit`` (a background compile) or here and now."""

from __future__ import annotations

import functools
from concurrent.futures import Future

import torch
from torch.utils import _pytree as pytree

from ..families import wan_vae
from ..interop import jit, patching, program_figures, sharding
from ..runtime import text_encoder_placement
from ..runtime.programs import program_builds
from ..runtime.weights import host_memory
from . import call_probe, lowering


def vae_decode_memory(pipe, config, runtime, latent_shape: tuple, chunk: int) -> dict | None:
    """XLA's memory analysis (bytes per device) of the Wan VAE's decode programs as the runtime compiles them for
    ``latent_shape`` ``[1, C, frames, H, W]``: the first latent frame, and the chunk program (``chunk`` latent
    frames) the rest run in (its carried cache from the first). None for a VAE without such programs."""
    return vae_decode_started(pipe, config, runtime, latent_shape, chunk, vae_submit(compiled_now, config, runtime))()


def vae_decode_started(pipe, config, runtime, latent_shape: tuple, chunk: int, submit):
    """``vae_decode_memory`` lowered here, compiled by ``submit``: returns the function that gives the report."""
    vae = getattr(pipe, "vae", None)
    if vae is None or runtime.family.vae_install is None:
        return lambda: None
    state, submit = held_weights(config, runtime, "vae", submit)
    runtime.family.vae_install(vae, runtime, lambda: state, runtime.place_vae_input)
    programs = vae._diffusers_tpu_programs
    batch, channels, frames, height, width = latent_shape
    head = torch.zeros(batch, channels, min(frames, wan_vae.FIRST_FRAMES), height, width)
    first, (_, cache) = program_figures.lowered_output_shapes(programs["decode_first"], head)
    first.label = "the VAE decode of frame 0"
    pending = {"decode_first": submit(first)}
    if frames > wan_vae.FIRST_FRAMES:
        body = torch.zeros(batch, channels, chunk, height, width)
        rest = program_figures.lower(programs["decode_chunk"], body, cache)
        rest.label = "the VAE decode chunk"
        pending["decode_chunk"] = submit(rest)

    def finish() -> dict:
        report = {name: future.result() for name, future in pending.items()}
        return dict(report, peak_bytes=max(analysis["peak_bytes"] for analysis in report.values()))

    return functools.cache(finish)


def vae_submit(submit, config, runtime):
    """``submit`` for the VAE's programs: each analysed as the runtime builds it (``TPUConfig.vae_compile``); a
    tiered program reports the larger peak of its two builds (either may be the one running)."""

    def submitted(lowered):
        futures = [
            submit(built) for built in program_builds.builds(lowered, config.vae_compile, runtime.target.platform)
        ]
        return futures[0] if len(futures) == 1 else _Larger(futures)

    return submitted


def held_weights(config, runtime, name: str, submit):
    """Component ``name``'s abstract weights as the runtime stores them (in host memory where the config says so),
    and ``submit`` reporting those host-memory bytes apart (``host_arguments_apart``)."""
    component = runtime.decision.component(name)
    state = lowering.abstract_slots(component.slots, runtime.vae_mesh if name == "vae" else runtime.mesh)
    if not config.in_host_memory(name):
        return state, submit
    state = host_memory.abstract(state)
    once = {}  # a tied weight is one argument
    for slot in component.slots:
        once.setdefault(id(sharding.tensor_of(slot)), slot.qualified)
    hosted = host_memory.bytes_per_device({qualified: state[qualified] for qualified in once.values()})
    return state, lambda lowered: _HostApart(submit(lowered), hosted)


def host_arguments_apart(analysis: dict, hosted: int, read_whole: bool = False) -> dict:
    """XLA:CPU counts arguments stored in host memory among the device's (its host and device memory are one); the
    TPU compiler reports them apart (``host_argument_bytes``): the same figures from either. ``read_whole``: the
    program reads them all into device memory as it starts (a VAE's, a text encoder's), which the TPU compiler
    counts among its temporaries and XLA:CPU does not copy; otherwise (the denoiser's, one layer at a time) the
    layer being read in is left out on CPU: an estimate."""
    if not hosted or "host_argument_bytes" in analysis:
        return analysis
    apart = dict(analysis, host_argument_bytes=hosted, argument_bytes=analysis["argument_bytes"] - hosted)
    if read_whole:
        apart["temp_bytes"] = analysis["temp_bytes"] + hosted
    else:
        apart["peak_bytes"] = analysis["peak_bytes"] - hosted
    return apart


class _HostApart:
    def __init__(self, future, hosted: int):
        self.future, self.hosted = future, hosted

    def result(self):
        return host_arguments_apart(self.future.result(), self.hosted, read_whole=True)


class _Larger:
    def __init__(self, futures: list):
        self.futures = futures

    def result(self):
        reports = [future.result() for future in self.futures]
        return dict(max(reports, key=lambda report: report["peak_bytes"]), tiers=reports)


def compiled_now(lowered, analyse=None) -> Future:
    """Compile here and now (``plan`` without a background compiler)."""
    done = Future()
    done.set_result((analyse or program_figures.compiled_memory)(lowered))
    return done


def vae_method_memory(pipe, config, runtime, latents: torch.Tensor, size: dict) -> dict | None:
    """XLA's memory analysis (bytes per device) of every program the stock decode (``Family.decode_latents``) runs
    through the family's compiled VAE methods (``Family.vae_methods``: HunyuanVideo-1.5's whole-video decoder,
    CogVideoX's frame batches with their carried cache) for the latents the denoiser makes: the stock code runs on
    the host around them, each program answering with zeros of its outputs (``program_figures.lowered_zero_outputs``);
    ``latents``: one video's, as the denoising loop leaves them."""
    return vae_method_started(pipe, config, runtime, latents, size, vae_submit(compiled_now, config, runtime))()


def vae_method_started(pipe, config, runtime, latents: torch.Tensor, size: dict, submit):
    """``vae_method_memory`` walked here, its programs compiled by ``submit``: returns the function giving it."""
    vae, family = pipe.vae, runtime.family
    state, submit = held_weights(config, runtime, "vae", submit)
    programs, stand_ins = {}, {}
    for spec in family.vae_methods:
        path, _, method = spec.rpartition(".")
        owner = vae.get_submodule(path) if path else vae
        prefix = f"{path}." if path else ""
        owned = {name[len(prefix) :]: value for name, value in state.items() if name.startswith(prefix)}
        compiled = runtime.compiled_vae_method(owner, method, lambda owned=owned: owned)
        stand_ins[(owner, method)] = _zero_answers(compiled, programs, submit)
    with patching.temporarily(stand_ins), torch.no_grad():
        family.decode_latents(pipe, latents, size["num_frames"])

    def finish() -> dict | None:
        analyses = [future.result() for future, _ in programs.values()]
        return {"programs": analyses, "peak_bytes": max(a["peak_bytes"] for a in analyses)} if analyses else None

    return functools.cache(finish)


def _zero_answers(compiled, programs: dict, submit=None):
    """A stand-in for the compiled method ``compiled``: each new program it is called with is lowered, compiled by
    ``submit`` (``programs``: key -> (future analysis, outputs)) and answered with host zeros of its outputs."""

    def record(*args, **kwargs):
        leaves = pytree.tree_leaves((args, kwargs))
        key = (id(compiled), tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in leaves))
        if key not in programs:
            lowered, out = program_figures.lowered_zero_outputs(compiled, *args, **kwargs)
            lowered.label = f"{type(compiled.module).__name__}.{compiled.name}"
            programs[key] = ((submit or compiled_now)(lowered), out)
        return programs[key][1]

    return record


def text_encoder_memory(pipe, config, runtime, size: dict, text_tokens: int, dtype: torch.dtype) -> dict | None:
    """With ``TPUConfig(text_encoder="jax")``: XLA's memory analysis of every text-encoder program a call with a
    prompt runs (weights replicated, as the runtime places them), and the bytes per device of those weights stored in
    device memory. None without a tokenizer (a folder planned without its text encoders)."""
    return text_encoder_started(pipe, config, runtime, size, text_tokens, dtype, compiled_now)()


def text_encoder_started(pipe, config, runtime, size: dict, text_tokens: int, dtype: torch.dtype, submit):
    """``text_encoder_memory`` lowered here, compiled by ``submit``: returns the function that gives the report."""
    names = text_encoder_placement.text_encoder_names(pipe)
    if not names or getattr(pipe, "tokenizer", None) is None:
        return lambda: None
    programs, weights, stand_ins = {}, 0, {}
    for name in names:
        module = runtime.decision.component(name).module  # on the devices, as pipe.to places it
        state, submitted = held_weights(config, runtime, name, submit)
        if not config.in_host_memory(name):  # host-memory weights are on the devices only inside their programs
            weights += sum(state[n].size * state[n].dtype.itemsize for n, _ in module.named_parameters())  # tied once
        compiled = jit.compiled_method(
            module, "forward", state=lambda state=state: state, jax_context=runtime.jax_context
        )
        stand_ins[(module, "forward")] = _zero_answers(compiled, programs, submitted)
    with patching.temporarily(stand_ins):
        call_probe.probe_denoiser_call(pipe, size, text_tokens, dtype, prompt=call_probe.PLAN_PROMPT)

    def finish() -> dict:
        analyses = [future.result() for future, _ in programs.values()]
        return {"programs": analyses, "peak_bytes": max(a["peak_bytes"] for a in analyses), "weight_bytes": weights}

    return functools.cache(finish)
