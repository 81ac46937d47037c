"""The moves of a pipeline: onto JAX (``attach``), off it (``detach``; ``leave_jax`` for ``pipe.to("cpu")``), a
cast on its devices (``cast``), the runtime a call runs in (``for_call``), and what the last call reported
(``stats``). ``attach`` validates everything (platform, family, mesh, sharding plans) before a single weight moves;
``detach`` restores the plain torch pipeline exactly (``overrides``).
"""

from __future__ import annotations

import logging

import torch

from ...interop import (
    backend,
    compile_accounting,
    sharding,
)
from .. import decision, support
from ..call.call_stats import CallStats
from ..config import TPUConfig
from ..registry import family_of
from . import gpu_script_calls, shared_components
from .pipeline_runtime import PipelineRuntime, attached_pipelines, hold, release, runtime_of

logger = logging.getLogger(__name__)


def attach(pipe, kind: str, config: TPUConfig | None = None, dtype: torch.dtype | None = None):
    """Validate, then place ``pipe`` on JAX. Raises before anything moves when something is wrong."""
    if config is not None and not isinstance(config, TPUConfig):
        raise ValueError(f"config must be a diffusers_tpu.TPUConfig, got {type(config).__name__}.")
    config = config or TPUConfig.from_environment()
    family = family_of(pipe)
    support.check(pipe, family.name)
    target = backend.resolve_target(kind)
    current = runtime_of(pipe)
    if current is not None and current.config == config and current.target == target and dtype is None:
        return pipe
    devices = backend.devices_for(target)
    if current is not None:
        detach(pipe)  # re-placing with another config starts from the torch pipeline
    for owner in shared_components.other_owners(pipe, current):
        shared_components.hand_over(owner, pipe, detach)
    shared_components.forget(pipe)
    # offload hooks, torch.compile wrappers (undone on failure/detach)
    prepared = gpu_script_calls.prepare_components(pipe)
    try:
        decided = decision.decide(pipe, config, target, devices, dtype, family=family)
    except BaseException:
        for step in reversed(prepared):
            step()
        raise
    backend.enable_compile_cache(config.resolved_cache_dir())
    runtime = PipelineRuntime(pipe, decided, dtype)
    for step in prepared:
        runtime.overrides.add_undo(step)
    denoisers = {c.name: c.module for c in decided.components if c.role == "denoiser"}
    gpu_script_calls.check_dtype(runtime, denoisers)
    try:
        with compile_accounting.compile_log() as placing:
            runtime.place(decided.plans)
        runtime.placing_programs = placing.compilations
    except BaseException:
        runtime.undo()
        raise
    hold(pipe, runtime)
    logger.info("%s, attention %s", decided, runtime.attention.implementation)
    return pipe


def unplaced(pipe, decided) -> PipelineRuntime:
    """The runtime ``attach`` would build for ``decided`` (a ``decision.Decision``: its mesh made), nothing placed and
    nothing held: what ``plan`` traces the call's programs with. ``undo()`` when done."""
    return PipelineRuntime(pipe, decided, None)


def detach(pipe) -> None:
    runtime = release(pipe)
    if runtime is not None:
        runtime.undo()


def for_call(pipe) -> PipelineRuntime | None:
    """The runtime a call of ``pipe`` runs in: its own, or, when it handed its components to another pipeline
    (``shared_components``), a new one that takes them back as it was moved."""
    runtime = runtime_of(pipe)
    replaced = runtime.replaced_components() if runtime is not None else []
    if replaced:
        names = ", ".join(f"pipe.{name}" for name in replaced)
        logger.warning("%s replaced since pipe.to(%r): moving the pipeline again.", names, runtime.target.requested)
        kind, config, dtype = runtime.moved_with
        detach(pipe)  # the replaced module's state is restored on it; the new one is placed with the rest
        attach(pipe, kind, config=config, dtype=dtype)
        return runtime_of(pipe)
    how = shared_components.how_moved(pipe) if runtime is None else None
    if how is None:
        held = shared_components.held_elsewhere(pipe) if runtime is None else []
        denoisers = [n for n in held if n == "unet" or n.startswith("transformer")]
        if denoisers:  # built from a moved pipeline's denoiser (diffusers' ``Other(**components)``): it runs there
            owner = shared_components.owner(getattr(pipe, denoisers[0]))
            logger.warning(
                "%s of this %s are on JAX for another pipeline: this one moves there too, as that one was.",
                ", ".join(held),
                type(pipe).__name__,
            )
            kind, config, dtype = owner.moved_with
            attach(pipe, kind, config=config, dtype=dtype)
            return runtime_of(pipe)
        if held:
            raise ValueError(
                f"{', '.join(held)} of this {type(pipe).__name__} are on JAX for another pipeline that shares them, "
                "so plain torch cannot run it: move this pipeline there too (pipe.to('tpu') or pipe.to('jax')), or "
                "move the other one to 'cpu' first."
            )
        return runtime
    kind, config, dtype = how
    attach(pipe, kind, config=config, dtype=dtype)
    return runtime_of(pipe)


def leave_jax(pipe) -> None:
    """``pipe.to("cpu")``: detach it; a pipeline whose components another pipeline holds on JAX cannot take them
    to the host under that one: a clear error first."""
    detach(pipe)
    shared_components.forget(pipe)
    held = shared_components.held_elsewhere(pipe)
    if held:
        raise ValueError(
            f"{', '.join(held)} of this {type(pipe).__name__} are on JAX for another pipeline that shares them; move "
            "that pipeline to 'cpu' first (or call this one, which takes them back on JAX)."
        )


def cast(pipe, dtype: torch.dtype):
    """``pipe.to(dtype)`` while on JAX: cast every component on its devices."""
    runtime = runtime_of(pipe)
    for name, module in pipe.components.items():
        if not isinstance(module, torch.nn.Module):
            continue
        if sharding.is_placed(module):
            sharding.cast(module, dtype)
        else:
            module.to(dtype)
    runtime.user_dtype = dtype
    return pipe


def stats(pipe) -> CallStats:
    """Timings of the last call of a pipeline on JAX."""
    runtime = runtime_of(pipe)
    if runtime is None:
        raise ValueError("This pipeline is not on JAX; move it with pipe.to('tpu') or pipe.to('jax') first.")
    return runtime.last_call


def detach_all() -> None:
    """Every pipeline on JAX back on the host, as ``pipe.to("cpu")`` leaves it (``diffusers_tpu.deactivate``)."""
    for pipe in attached_pipelines():
        detach(pipe)
        shared_components.forget(pipe)
