"""Every private name of JAX the project uses, behind one door: each entry says why no public API serves and was
checked on jax 0.10.2 and 0.12.0.1 (``CHECKED_ON``); ``tests/interop/test_private_apis.py`` fails when a release
changes one. Nothing here imports JAX at import time (``interop.startup`` reads ``hardware_utils_path`` before JAX
may load).
"""

from __future__ import annotations

import functools
import importlib.util
import os

CHECKED_ON = ("0.10.2", "0.12.0.1")


@functools.cache
def _core():
    from jax._src import core  # noqa: PLC0415 - resolved once: ``trace_state_clean`` runs for every eager op

    return core


def trace_state_clean() -> bool:
    """Whether no JAX trace is in progress (``jax._src.core.trace_state_clean``). Why private: JAX has no public
    question for it; the host-side fast paths (``interop.host_scalars``) must not run inside a trace."""
    return _core().trace_state_clean()


def indivisible_error() -> type[Exception]:
    """The exception JAX raises when an operand's shape does not divide over a mesh axis
    (``jax._src.sharding.IndivisibleError``). Why private: not exported; ``compat.torchax_tensors``'s mixed-mesh retry
    catches exactly it and nothing broader."""
    from jax._src.sharding import IndivisibleError  # noqa: PLC0415

    return IndivisibleError


def distributed_client():
    """The coordination-service client ``jax.distributed.initialize`` connected (``jax._src.distributed.global_state``).
    Why private: JAX exposes no handle to it; the peer watch (``interop.distributed``) keeps heartbeats in its
    key-value store."""
    from jax._src import distributed  # noqa: PLC0415

    return distributed.global_state.client


def cloud_tpu_metadata(key: str) -> tuple[str, int]:
    """A Cloud TPU VM's metadata value and HTTP status (``jax._src.clusters.cloud_tpu_cluster.get_metadata``), as JAX's
    own cluster detection reads it. Why private: the detection is not public; reading it the same way keeps ours
    in step with JAX's."""
    from jax._src.clusters import cloud_tpu_cluster  # noqa: PLC0415

    return cloud_tpu_cluster.get_metadata(key)


def hardware_utils_path() -> str:
    """The file of ``jax._src.hardware_utils`` (standard library only: loaded alone, without importing JAX), or ""."""
    spec = importlib.util.find_spec("jax")
    return os.path.join(os.path.dirname(spec.origin), "_src", "hardware_utils.py") if spec else ""


def tpu_chips() -> int:
    """TPU chips attached to this host, counted by JAX's own ``hardware_utils`` without importing JAX. Why private:
    asking JAX publicly (``jax.devices``) loads libtpu as a backend, which is what ``interop.startup`` decides about."""
    path = hardware_utils_path()
    if not os.path.isfile(path):
        return 0
    spec = importlib.util.spec_from_file_location("_diffusers_tpu_jax_hardware_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.num_available_tpu_chips_and_device_id()[0]


def backends_initialized() -> bool:
    """Whether JAX has started its backends (``jax._src.xla_bridge.backends_are_initialized``). Why private: no public
    question; libtpu reads its flags once, when its backend starts (``planner.tpu_compiler``)."""
    from jax._src import xla_bridge  # noqa: PLC0415

    return xla_bridge.backends_are_initialized()


def lowered_devices(lowered) -> list | None:
    """The devices a ``jax.stages.Lowered`` program runs on, in its mesh's order, from its first sharded input, or None
    when no input is sharded. Why private: ``Lowered`` keeps its input shardings only in its private lowering
    (``_lowering.compile_args["in_shardings"]``, each with ``_device_assignment``); ``Lowered.args_info`` carries
    shapes and donation only. ``runtime.program_store`` needs them before compiling (a stored program loads there)."""
    for sharding in lowered._lowering.compile_args["in_shardings"]:
        assignment = getattr(sharding, "_device_assignment", None)
        if assignment:
            return list(assignment)
    return None


# The name of the garbage-collector callback JAX adds (``jax._src.lib``): a Ctrl-C CPython drops inside it is raised
# again by ``interop.interrupts`` (the name is only checked by the test; nothing calls it).
GC_CALLBACK = "_xla_gc_callback"


# XLA's quick compile: effort level O0, passed by its enum value (9: ``xla::EffortLevel::kO0``; jax 0.12 names it
# ``jax._src.compiler.CompilerEffortLevel.O0``, jax 0.10 has no name for it). Why this spelling: jax 0.10's compiler
# also took ``exec_time_optimization_effort=-1.0``, which builds the same program (identical compiled text on libtpu
# 0.0.42.1), but jax 0.12 refuses that name ("No such compile option"); the enum value is accepted by both.
QUICK_COMPILE = {"optimization_level": 9}
