"""XLA:CPU flags that halve the suite's compile time, as the installed jaxlib knows them: XLA aborts the process on a
flag it does not know, and jaxlib drops flags between releases. Read before JAX starts (conftest, the sweep's
subprocesses); standard library only."""

from __future__ import annotations

from importlib import metadata

# (flag, the first jaxlib without it): LLVM's optimisation passes off; XLA:CPU's older elemental emitter instead of its
# MLIR fusion emitters (known to jaxlib 0.10.2, gone from 0.11.2 and 0.12.0.1, where the fusion emitters are the only
# ones); a simulated mesh's collectives waiting up to 10 minutes for their device threads
FAST_COMPILE = (
    ("--xla_backend_optimization_level=0", None),
    ("--xla_cpu_use_fusion_emitters=false", (0, 11)),
    ("--xla_cpu_collective_call_terminate_timeout_seconds=600", None),
)


def _jaxlib() -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in metadata.version("jaxlib").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return (0, 0)


def fast_compile(limit_to: tuple[str, ...] | None = None) -> list[str]:
    """The ``FAST_COMPILE`` flags this jaxlib knows (``limit_to``: only those whose name starts so)."""
    version = _jaxlib()
    return [
        flag
        for flag, gone in FAST_COMPILE
        if (gone is None or version < gone) and (limit_to is None or flag.startswith(limit_to))
    ]
