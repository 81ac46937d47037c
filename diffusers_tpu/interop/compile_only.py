"""Compile without running: inside ``compile_only()`` every compiled method builds its program for the call's
arguments and runs nothing; zeros of the program's outputs stand for them (``warm_up``'s zero-execution walk).

The zeros are host zeros copied to the devices at the outputs' shardings: a transfer, not a program (``jnp.zeros``
would compile one per shape and sharding, programs a real call never builds). ``compile_only(pool)``: programs are
lowered here and built in the pool, concurrently; their zeros take no sharding meanwhile (it is known only once a
program is built), so what runs between programs compiles for other shardings than a real call's (``warm_up``'s
``workers``). Imports nothing of the package but ``processes``.
"""

from __future__ import annotations

import contextlib
import contextvars
from concurrent.futures import Executor

import jax
import numpy as np

from . import processes

_mode = contextvars.ContextVar("diffusers_tpu_compile_only", default=None)  # None: run; True or a pool: build only


@contextlib.contextmanager
def compile_only(pool: Executor | None = None):
    """Inside: compiled methods build their programs and answer zeros (module docstring); ``pool``: built there."""
    token = _mode.set(pool if pool is not None else True)
    try:
        yield
    finally:
        _mode.reset(token)


def compiling_only() -> bool:
    return _mode.get() is not None


def pool() -> Executor | None:
    """The pool programs are built in (``compile_only(pool)``), else None."""
    mode = _mode.get()
    return mode if isinstance(mode, Executor) else None


def zeros_of(out_info, sharded: bool = True) -> list:
    """Zeros of a program's outputs (``out_info``: its ``ShapeDtypeStruct`` tree), at their shardings (``sharded``)
    or uncommitted; made on the host and copied, no program."""
    zeros = []
    for info in jax.tree_util.tree_leaves(out_info):
        host = np.zeros(info.shape, info.dtype)
        sharding = getattr(info, "sharding", None)
        zeros.append(processes.place(host, sharding) if sharded and sharding is not None else jax.device_put(host))
    return zeros
