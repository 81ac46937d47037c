"""A decided component's weights as the runtime would hold them on a mesh, without any weights: abstract arrays with
their planned shardings, int8 ones as ``quantize.Quantized``, repeated blocks stacked, host-memory ones marked
(``plan``, ``tpu_check`` and ``cost`` lower programs with them)."""

from __future__ import annotations

import torch
from torchax.ops import mappings

from ..interop.backend import jax_dtype
from ..interop.weights import Gathered, LayerOf, expand_stacked
from ..runtime.weights import host_memory, quantize, stacked_weights
from . import lowering


def reported_dtype(module, state: dict) -> torch.dtype:
    """What ``module.dtype`` (diffusers' ``get_parameter_dtype``) reports once placed: the first floating weight on
    the devices outside ``_keep_in_fp32_modules`` (quantized weights are not floating)."""

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


def abstract_component(component, mesh, config) -> dict:
    """A decided component's weights (``decision.ComponentPlan``) as the runtime holds them on ``mesh``."""
    state = as_held(
        component.module,
        list(component.slots),
        mesh,
        config.quantize if component.role == "denoiser" else None,
        config.scan_blocks and component.role == "denoiser",
        config.fully_sharded_weights,
        component.dtype,
    )
    return host_memory.abstract(state) if config.in_host_memory(component.name) else state


def as_held(module, slots, mesh, quantize_format, stacked, fully_sharded, dtype) -> dict:
    state = lowering.abstract_slots(slots, mesh)
    for name in quantize.targets(module) if quantize_format else ():
        state[name] = quantize.abstract(state[name], quantize_format, jax_dtype(dtype or torch.float32))
    if stacked:
        state = stacked_weights.abstract(module, slots, state, mesh, fully_sharded)
    return state
