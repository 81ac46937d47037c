"""Arrays across the processes of a multi-host run (``distributed`` starts it): they cross the host boundary in two
places only, both here. ``place`` builds a global array from each process's own host copy (each process fills only the
shards its devices hold: no weights travel between hosts), ``fetch`` gathers one to every process. Every process must
hold the same host values (same seed, same prompt: the torch CPU generator, the host text encoder and the scheduler
are deterministic); an input computed on the host enters the compiled programs through ``jax.device_put``, which
verifies that across processes (a clear error, not a mixed array). One process: plain ``device_put`` and ``asarray``.
Imports nothing of the package.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils


def is_multi_process() -> bool:
    return jax.process_count() > 1


def is_main_process() -> bool:
    """Process 0: the one that writes files and prints reports."""
    return jax.process_index() == 0


def place(array, sharding) -> jax.Array:
    """A host array (numpy) as a global device array: each process fills only the shards its own devices hold, from
    its own copy (weights: nothing crosses hosts). A JAX array computed on this process (a pipeline input) is placed
    by ``jax.device_put``, which checks that every process holds the same value."""
    if isinstance(array, jax.ShapeDtypeStruct):  # lowering only (``plan``): the placement without the data
        return jax.ShapeDtypeStruct(array.shape, array.dtype, sharding=sharding)
    if sharding.is_fully_addressable:
        return jax.device_put(array, sharding)
    if isinstance(array, jax.Array):
        try:
            return jax.device_put(array, sharding)
        except AssertionError as error:
            raise RuntimeError(
                "The processes disagree on a pipeline input: every process must run the same script with the same "
                "inputs (same prompt, seed and generator; a torch CPU generator seeded alike on every host gives the "
                "same latents)."
            ) from error
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def fetch(array: jax.Array) -> np.ndarray:
    """A (global) device array as a host array on every process."""
    if array.is_fully_addressable:
        return np.asarray(array)
    if array.sharding.is_fully_replicated:  # every process holds it all already
        return np.asarray(array.addressable_data(0))

    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


def smallest_across_processes(value: int | None) -> int | None:
    """The smallest of every process's ``value`` (None if any process has none), the same on all of them: a decision
    taken from it (where text encoders run) then compiles the same programs everywhere. Every process must call it."""
    if not is_multi_process():
        return value

    values = np.asarray(multihost_utils.process_allgather(np.int64(-1 if value is None else value)))
    return None if (values < 0).any() else int(values.min())
