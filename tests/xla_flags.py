"""XLA:CPU flags that halve the suite's compile time, as the installed jaxlib knows them: XLA aborts the process on a
flag it does not know, and jaxlib drops flags between releases. Read before JAX starts (conftest, the sweep's
subprocesses); standard library only."""

from __future__ import annotations

from importlib import metadata

# (flag, the first jaxlib without it, the first libtpu without it): LLVM's optimisation passes off; XLA:CPU's older
# elemental emitter instead of its MLIR fusion emitters (known to jaxlib 0.10.2 and libtpu 0.0.42.1, gone from jaxlib
# 0.11.2 and 0.12.0.1, where the fusion emitters are the only ones, and from libtpu 0.0.50.1 and 0.0.52, which parses
# XLA_FLAGS too: jax 0.10.2 beside TorchTPU's libtpu); a simulated mesh's collectives waiting up to 10 minutes for
# their device threads
FAST_COMPILE = (
    ("--xla_backend_optimization_level=0", None, None),
    ("--xla_cpu_use_fusion_emitters=false", (0, 11), (0, 0, 50)),
    ("--xla_cpu_collective_call_terminate_timeout_seconds=600", None, None),
)


def _version(name: str, parts: int) -> tuple[int, ...] | None:
    try:
        return tuple(int(part) for part in metadata.version(name).split(".")[:parts])
    except (metadata.PackageNotFoundError, ValueError):
        return None


def fast_compile(limit_to: tuple[str, ...] | None = None) -> list[str]:
    """The ``FAST_COMPILE`` flags this jaxlib and libtpu know (``limit_to``: only those whose name starts so)."""
    jaxlib, libtpu = _version("jaxlib", 2) or (0, 0), _version("libtpu", 3)
    return [
        flag
        for flag, jaxlib_gone, libtpu_gone in FAST_COMPILE
        if (jaxlib_gone is None or jaxlib < jaxlib_gone)
        and (libtpu_gone is None or libtpu is None or libtpu < libtpu_gone)
        and (limit_to is None or flag.startswith(limit_to))
    ]
