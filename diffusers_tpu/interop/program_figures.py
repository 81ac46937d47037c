"""What a compiled method's program is, without running it: lowered, its outputs as zeros or ``meta`` tensors, and
XLA's memory analysis (the planner's and the warm-up's questions of a ``jit.CompiledFunction``)."""

from __future__ import annotations

import logging

import jax
import torch
from torchax.ops import mappings

from .jit import CompiledFunction
from .program import TENSOR
from .torch_private import pytree

logger = logging.getLogger(__name__)


def lower(compiled: CompiledFunction, *args, **kwargs) -> jax.stages.Lowered:
    """The program ``compiled`` runs for these arguments, lowered in its context, not compiled."""
    return compiled.lowered(args, kwargs)[0]


def lowered_output_shapes(compiled: CompiledFunction, *args, **kwargs) -> tuple[jax.stages.Lowered, object]:
    """The program ``compiled(*args, **kwargs)`` runs, lowered, and what it would return as ``meta`` tensors (shapes
    and dtypes, no data), without running it: ``plan`` lowers the next program with them (a carried cache)."""
    lowered, program = compiled.lowered(args, kwargs)
    return lowered, zeros_of(lowered, program, device="meta")


def zeros_of(lowered, program, device="cpu"):
    zeros = iter(
        [
            torch.zeros(info.shape, dtype=mappings.j2t_dtype(info.dtype), device=device)
            for info in jax.tree_util.tree_leaves(lowered.out_info)
        ]
    )
    out, _ = pytree.tree_unflatten([next(zeros) if s is TENSOR else s for s in program.out_static], program.out_spec)
    return out


def memory_analysis(compiled, *args, **kwargs) -> dict:
    """XLA's memory analysis of the program ``compiled`` (from ``CompiledFunction``) runs for these arguments:
    bytes of arguments, outputs, outputs aliasing donated arguments, temporaries, and the resulting peak
    (arguments + outputs - aliased + temporaries)."""
    return memory_report(lower(compiled, *args, **kwargs).compile())


def compiled_memory(lowered: jax.stages.Lowered) -> dict:
    """``memory_analysis`` of a program lowered already (``lower``): compiling needs no GIL, so a thread can."""
    return memory_report(lowered.compile())


def lowered_zero_outputs(compiled, *args, **kwargs) -> tuple[jax.stages.Lowered, object]:
    """The program ``compiled(*args, **kwargs)`` runs, lowered (``compiled_memory`` analyses it), and what it would
    return with host zeros for every tensor (arguments it edits in place left as they are), with no device
    allocation: ``plan`` walks stock decode code through compiled methods with them."""
    lowered, program = compiled.lowered(args, kwargs)
    return lowered, zeros_of(lowered, program)


def memory_report(executable) -> dict:
    stats = executable.memory_analysis()
    report = {
        "argument_bytes": stats.argument_size_in_bytes,
        "output_bytes": stats.output_size_in_bytes,
        "alias_bytes": stats.alias_size_in_bytes,
        "temp_bytes": stats.temp_size_in_bytes,
    }
    report["peak_bytes"] = (
        report["argument_bytes"] + report["output_bytes"] - report["alias_bytes"] + report["temp_bytes"]
    )
    host = getattr(stats, "host_argument_size_in_bytes", 0)
    if host:  # arguments stored in host memory (``TPUConfig(weights_in_host_memory=...)``): not in the device's peak
        report["host_argument_bytes"] = host
    return report
