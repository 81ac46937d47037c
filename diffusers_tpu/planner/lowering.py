"""Prove a model lowers for TPU without a TPU: ``jax.export`` of the exact program the runtime jits.

Exporting for ``platforms=["tpu"]`` runs the real TPU lowering on any machine, Pallas → Mosaic included, and
rejects ops and block shapes a TPU cannot take. Inputs and weights are abstract (``jax.ShapeDtypeStruct``),
so a real-size architecture built on the ``meta`` device exports in seconds with no weights in memory.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import torch
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from torchax.ops import mappings

from ..interop import backend, sharding
from ..interop.program import TENSOR, Program
from ..interop.torch_private import pytree
from ..runtime.attention import sdpa
from ..runtime.call import postprocess, repeated_blocks


def abstract(shape, dtype, mesh=None, spec=()) -> jax.ShapeDtypeStruct:
    sharding_ = NamedSharding(mesh, P(*spec)) if mesh is not None else None
    return jax.ShapeDtypeStruct(tuple(shape), jnp.dtype(dtype), sharding=sharding_)


def abstract_state(module: torch.nn.Module, mesh, rules=(), dtype: torch.dtype | None = None, keep_fp32=()) -> dict:
    """The module's weights as ShapeDtypeStructs carrying their planned sharding (works on ``meta`` modules)."""
    return abstract_slots(sharding.plan(module, dict(mesh.shape), rules, dtype, keep_fp32), mesh)


def abstract_slots(slots, mesh) -> dict:
    """Planned slots (``sharding.plan``; a ``decision.ComponentPlan``'s) as ShapeDtypeStructs with their shardings
    on ``mesh``: the weights a program takes, without their values."""
    specs = {}
    for slot in slots:  # shared tensors: the first slot carries the spec
        specs.setdefault(id(sharding.tensor_of(slot)), slot.spec or P())
    return {
        slot.qualified: jax.ShapeDtypeStruct(
            tuple(sharding.tensor_of(slot).shape),
            mappings.t2j_dtype(slot.dtype),
            sharding=NamedSharding(mesh, specs[id(sharding.tensor_of(slot))]),
        )
        for slot in slots
    }


def export_method(
    module,
    name: str,
    args=(),
    kwargs=None,
    *,
    mesh,
    rules=(),
    dtype=None,
    attention_impl: str | None = "splash_exp2",
    kv_threshold: int = 10000,
    block_sizes=None,
    platforms=("tpu",),
    matmul_precision: str = "highest",
    scan_blocks: bool = True,
) -> jax.export.Exported:
    """Export ``module.<name>(*args, **kwargs)`` as the runtime compiles it. Tensor arguments are
    ``jax.ShapeDtypeStruct``s (give them a sharding to export a sharded program). ``attention_impl``: the
    denoiser's attention under ``shard_map`` over ``mesh``; None: the safe reference the runtime gives VAEs and
    text encoders. ``matmul_precision``, ``scan_blocks`` (a denoiser's repeated blocks as one loop): as
    ``TPUConfig``."""
    leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs or {})))
    is_array = [isinstance(x, jax.ShapeDtypeStruct) for x in leaves]
    static = tuple(TENSOR if a else x for a, x in zip(is_array, leaves))
    keep = getattr(module, "_keep_in_fp32_modules", None) or ()
    state = abstract_state(module, mesh, rules, dtype, keep)
    method = getattr(module, name)
    scan = repeated_blocks.scanning if scan_blocks and attention_impl is not None else None  # as a denoiser runs
    program = Program(module, method, spec, static, trace_hook=scan)
    settings = sdpa.SAFE
    if attention_impl is not None:
        settings = sdpa.AttentionSettings(mesh, attention_impl, kv_threshold, block_sizes)
    with backend.jax_mode(), sdpa.use(settings), jax.default_matmul_precision(matmul_precision):
        export = jax.export.export(program.jitted, platforms=list(platforms))
        return program.without_hook_if_needed(export, state, [x for a, x in zip(is_array, leaves) if a], [], [])


def export_postprocess(video: jax.ShapeDtypeStruct, platforms=("tpu",)) -> jax.export.Exported:
    """Export the on-device uint8 postprocess of a decoded ``[B, C, F, H, W]`` video."""
    return jax.export.export(jax.jit(lambda v: postprocess.video_uint8(v, True)), platforms=list(platforms))(video)


def uses_pallas_kernel(exported: jax.export.Exported) -> bool:
    """True when the exported module contains a Mosaic (Pallas TPU) kernel."""
    return "tpu_custom_call" in exported.mlir_module()
