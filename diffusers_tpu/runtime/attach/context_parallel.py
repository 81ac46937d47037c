"""``transformer.enable_parallelism(config=ContextParallelConfig(...))`` on a model on JAX: the degrees become the mesh.

A multi-GPU script splits the sequence over ``ulysses_degree × ring_degree`` processes (and, with a
``TensorParallelConfig``, the heads over ``tp_degree``). On JAX one program already runs over a ``(dp, sp, tp)`` mesh
whose ``sp`` axis splits the sequence and ``tp`` the heads: the call moves the pipeline again onto the mesh with
``sp = ulysses_degree × ring_degree`` (``tp = tp_degree`` when given, else the current one, else 1) and ``dp`` the rest
of the devices — the same video, the attention kernel doing what Ulysses and ring attention do on GPUs. Degrees that
cannot fit the devices are refused before anything moves, naming the meshes that would. diffusers' own hooks are
not installed (they need ``torch.distributed``); back on torch the model is as it was before the call.
"""

from __future__ import annotations

import logging

from ...interop import backend

logger = logging.getLogger(__name__)


def install(runtime, module) -> None:
    """``module.enable_parallelism`` while ``module`` is on JAX (undone with the runtime)."""
    if not hasattr(type(module), "enable_parallelism"):
        return

    def enable_parallelism(*, config, cp_plan=None):
        mesh = mesh_for(config, runtime.mesh.size, dict(runtime.mesh.shape), _heads(module))
        kind, tpu_config, dtype = runtime.moved_with
        logger.warning(
            "%s.enable_parallelism(%s) on JAX: the pipeline moves onto the mesh %s (sp splits the sequence as "
            "Ulysses and ring attention do; one program over every device).",
            type(module).__name__,
            type(config).__name__,
            mesh,
        )
        runtime.pipe.to(kind, config=tpu_config.replace(mesh=mesh), **({"dtype": dtype} if dtype is not None else {}))

    runtime.overrides.set(module, "enable_parallelism", enable_parallelism)


def mesh_for(config, devices: int, current: dict, heads: int | None) -> dict:
    """The ``(dp, sp, tp)`` mesh a diffusers ``ParallelConfig`` / ``ContextParallelConfig`` /
    ``TensorParallelConfig`` asks for on ``devices`` devices; ValueError naming the meshes that fit when none does."""
    context = getattr(config, "context_parallel_config", config if hasattr(config, "ulysses_degree") else None)
    tensor = getattr(config, "tensor_parallel_config", config if hasattr(config, "tp_degree") else None)
    ulysses = int(getattr(context, "ulysses_degree", None) or 1)
    ring = int(getattr(context, "ring_degree", None) or 1)
    sp = ulysses * ring if context is not None else current.get("sp", 1)
    tps = [int(tensor.tp_degree)] if tensor is not None else [current.get("tp", 1), 1]
    for tp in tps:
        if devices % (sp * tp) == 0 and (heads is None or heads % tp == 0):
            return {"dp": devices // (sp * tp), "sp": sp, "tp": tp}
    fitting = [
        {"dp": devices // (s * t), "sp": s, "tp": t}
        for s in backend.divisors(devices)
        for t in backend.divisors(devices // s)
        if heads is None or heads % t == 0
    ]
    asked = f"ulysses_degree={ulysses}, ring_degree={ring}" + (f", tp_degree={tps[0]}" if tensor is not None else "")
    split = f"the sequence over {sp}" + (f" and the heads over {tps[0]}" if tensor is not None else "")
    suggestion = fitting[-1] if fitting else {"dp": devices, "sp": 1, "tp": 1}
    raise ValueError(
        f"enable_parallelism({asked}) splits {split} devices; this pipeline runs on {devices} device(s)"
        + (f" and its model has {heads} heads" if heads else "")
        + f", so no (dp, sp, tp) mesh has those degrees. Meshes that fit: {fitting[:6]}; e.g. "
        f"ContextParallelConfig(ulysses_degree={suggestion['sp']}), or TPUConfig(mesh={suggestion}) in pipe.to."
    )


def _heads(module) -> int | None:
    config = getattr(module, "config", None)
    heads = getattr(config, "num_attention_heads", None)
    return int(heads) if isinstance(heads, int) else None
